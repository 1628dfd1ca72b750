"""The Keras pieces of amp.py's variants: ours (tf_ext.mixed_precision's LossAwareOptimizer) when
importable, a model built under a Keras dtype policy, TensorFlow's Grappler bf16 rewrite switched
on for one variant (and whether it rewrites anything here), the per-step loss and precision
trace, and the optimizer every variant wraps."""

import numpy as np


def import_ours():
  """(tf_ext.mixed_precision, None) when LossAwareOptimizer is importable, else (None, why)."""
  try:
    import tf_ext.mixed_precision as amp  # pylint: disable=import-outside-toplevel

    for name in ("LossAwareOptimizer", "report"):
      if not hasattr(amp, name):
        raise ImportError(f"tf_ext.mixed_precision has no {name} yet")
    return amp, None
  except Exception as error:  # ImportError, or an op library that fails to load
    return None, f"{type(error).__name__}: {error}"


def short_error(error, limit=300):
  """A one-line description of an exception: its type and the last line of its message (a
  tf.function's "in user code:" traceback ends with the actual error)."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  return f"{type(error).__name__}: {(lines[-1] if lines else '')[:limit]}"


def state_values(amp, opt):
  """The policy's state fields, read in one variable read (cheap enough for every step)."""
  return dict(zip(amp.STATE_FIELDS, amp.policy_of(opt).state.numpy()))


def build_with_policy(tf, policy, build):
  """Builds a model with the Keras global dtype policy `policy` (None: float32) active."""
  tf.keras.mixed_precision.set_global_policy(policy or "float32")
  try:
    return build()
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")


def grappler_rewrites(tf):
  """Whether TensorFlow's auto_mixed_precision_onednn_bfloat16 rewrite changes anything on this
  machine: a float32 MatMul in a tf.function, with the rewrite off and on (on a CPU without bf16
  support TensorFlow 2.15 leaves the graph in float32, and the results are bit-identical)."""
  x = tf.random.stateless_normal([64, 256], seed=[1, 2])
  w = tf.random.stateless_normal([256, 64], seed=[3, 4])

  def product(x, w):
    return tf.matmul(x, w)

  plain = tf.function(product)(x, w).numpy()
  with grappler_bf16(tf, True):
    rewritten = tf.function(product)(x, w).numpy()
  return not np.array_equal(plain, rewritten)


class grappler_bf16:  # noqa: N801 (a context manager, used like a function)
  """`with grappler_bf16(on):` TensorFlow's auto_mixed_precision_onednn_bfloat16 rewrite on (or
  left as it is) for the block's function calls, off again after."""

  def __init__(self, tf, on):
    self.tf, self.on = tf, on

  def __enter__(self):
    if self.on:
      self.tf.config.optimizer.set_experimental_options(
        {"auto_mixed_precision_onednn_bfloat16": True}
      )

  def __exit__(self, *exc_info):
    if self.on:
      self.tf.config.optimizer.set_experimental_options(
        {"auto_mixed_precision_onednn_bfloat16": False}
      )
    return False


def make_last_loss_metric(tf, loss_fn):
  class BatchLoss(tf.keras.metrics.Metric):
    """The loss of the last batch alone (Keras' own loss log is a running mean)."""

    def __init__(self, name="batch_loss"):
      super().__init__(name=name, dtype="float32")
      self.value = self.add_weight(name="value", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
      y_true = tf.reshape(tf.cast(y_true, tf.float32), [-1, 1])
      self.value.assign(tf.cast(loss_fn(y_true, tf.cast(y_pred, tf.float32)), tf.float32))

    def result(self):
      return self.value

    def reset_state(self):
      self.value.assign(0.0)

  return BatchLoss()


def make_trace_callback(tf, amp, opt, tf_loss_scale_opt=None):
  class Trace(tf.keras.callbacks.Callback):
    """Per step: the batch loss; ours: precision (from the half-step count), loss scale;
    Keras' LossScaleOptimizer: its loss scale."""

    def __init__(self):
      super().__init__()
      self.loss, self.half, self.scale = [], [], []
      self._half_steps = 0

    def on_train_batch_end(self, batch, logs=None):
      self.loss.append(float((logs or {}).get("batch_loss", float("nan"))))
      if amp is not None:
        r = state_values(amp, opt)
        half_steps = int(r["half_steps"])
        self.half.append(1 if half_steps > self._half_steps else 0)
        self._half_steps = half_steps
        self.scale.append(float(r["loss_scale"]))
      elif tf_loss_scale_opt is not None:
        self.scale.append(float(tf_loss_scale_opt.loss_scale.numpy()))

  return Trace()


def adam(tf, lr, tables, tf_ext):
  opt = tf.keras.optimizers.Adam(lr)
  return tf_ext.DynamicEmbeddingOptimizer(opt) if tables else opt

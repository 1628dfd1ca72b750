"""LossAwareOptimizer: half precision where it is safe, full precision where it is not, per step.

Wrapping adds a "loss_scale" stage to the optimizer's pipeline (tf_ext/optimizer_pipeline.py), so
it composes in any order with tf_ext.DynamicEmbeddingOptimizer and LightCC's wrappers. Per graph
(a Session's graph, each tf.function trace) the stage adds:
  - TfExtAmpHalfMode(policy says half): the graph rewrite (kernels/mixed_precision/
    half_rewrite_pass.cc) gives the step's compute-heavy ops a half version beside the fp32 one,
    and this op's output picks one per step;
  - TfExtAmpProbe(loss): every TF_EXT_AMP_PROBE_INTERVAL half steps, the loss again in fp32 on the
    same batch;
  - the loss scale (fp16): the loss is multiplied by it before differentiation, the gradients
    divided by it after;
  - the policy's decision (PrecisionPolicy.decide) from the loss, whether the gradients are
    finite and the probe's error: it gates the update (dense variables and table rows) and sets
    the precision and the loss scale of the next step.
"""

import dataclasses
import functools
import logging
import sys
import weakref

import tensorflow as tf

from tf_ext import _ops_loader, optimizer_pipeline, settings
from tf_ext.mixed_precision import xla_policy
from tf_ext.mixed_precision.policy import (
  PolicyConfig,
  PrecisionPolicy,
  config_from_settings,
)
from tf_ext.mixed_precision.policy_state import FALLBACKS

HALF_CHOICES = ("auto", "bfloat16", "float16")
"""The names LossAwareOptimizer's `half` accepts (besides tf.bfloat16 and tf.float16); "auto" is
auto_half_dtype()."""
_TRACKED_NAME = "tf_ext_loss_aware_precision"
STATE_COLLECTION = "tf_ext_amp_policy_states"
"""The TF1 graph collection of the policies' state variables (SummaryHook reads them there)."""
# Where half precision pays: fp16 on these GPUs, bf16 on CPUs with these flags.
_MIN_FAST_FP16_COMPUTE_CAPABILITY = (7, 0)
_FAST_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

_logger = logging.getLogger("tf_ext.mixed_precision")

for _op in ("TfExtAmpHalfMode", "TfExtAmpProbe", "TfExtAmpPolicyStep"):
  tf.no_gradient(_op)


def _cpu_flags():
  try:
    with open("/proc/cpuinfo") as f:
      return {flag for line in f if line.startswith("flags") for flag in line.split(":")[1].split()}
  except OSError:
    return set()


@functools.lru_cache(maxsize=None)
def auto_half_dtype():
  """What half="auto" picks here: tf.float16 on a GPU with fast fp16 (compute capability >= 7.0),
  tf.bfloat16 on a CPU with AVX512_BF16 or AMX, else None (full precision, warned once)."""
  for gpu in tf.config.list_physical_devices("GPU"):
    capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
    if capability and tuple(capability) >= _MIN_FAST_FP16_COMPUTE_CAPABILITY:
      return tf.float16
  if _cpu_flags() & set(_FAST_BF16_CPU_FLAGS):
    return tf.bfloat16
  _logger.warning(
    'tf_ext.mixed_precision: half="auto" found no GPU with fast fp16 and no CPU with '
    "AVX512_BF16 or AMX; training runs in full precision (non-finite steps are still skipped). "
    'Pass half="bfloat16" or half="float16" to use half precision anyway.'
  )
  return None


def _half_dtype(half):
  if isinstance(half, tf.dtypes.DType) and half in (tf.bfloat16, tf.float16):
    return half
  if half not in HALF_CHOICES:
    raise ValueError(f"LossAwareOptimizer: half must be one of {HALF_CHOICES}, got {half!r}")
  return auto_half_dtype() if half == "auto" else tf.as_dtype(half)


def LossAwareOptimizer(optimizer, half="auto", config=None, probe_interval=None):  # noqa: N802
  """Makes `optimizer` train with loss-aware mixed precision; returns the same optimizer.

  Args:
    optimizer: a tf.compat.v1.train or tf.keras optimizer, or one wrapped by
      tf_ext.DynamicEmbeddingOptimizer or LightCC's DistributedOptimizer (any order).
    half: "bfloat16", "float16" (with dynamic loss scaling) or "auto" (fp16 on a GPU with fast
      fp16, bf16 on a CPU with AVX512_BF16 or AMX, else full precision with a warning).
    config: a PolicyConfig (default: the TF_EXT_AMP_* settings).
    probe_interval: half steps between precision probes; 0: none (default:
      TF_EXT_AMP_PROBE_INTERVAL).
  """
  half_dtype = _half_dtype(half)
  if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer) or isinstance(
    optimizer, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer
  ):
    raise TypeError(
      f"LossAwareOptimizer: {type(optimizer).__name__} already does loss scaling; wrap the "
      "optimizer inside it instead"
    )
  policy_name = tf.keras.mixed_precision.global_policy().name
  if policy_name != "float32":
    raise ValueError(
      f"LossAwareOptimizer: the Keras global dtype policy is {policy_name!r}; the model must be "
      "built in float32 (tf.keras.mixed_precision.set_global_policy('float32')): "
      "LossAwareOptimizer makes the half version itself"
    )
  if probe_interval is None:
    probe_interval = settings.get("TF_EXT_AMP_PROBE_INTERVAL")
  if not isinstance(probe_interval, int) or isinstance(probe_interval, bool) or probe_interval < 0:
    raise ValueError(
      f"LossAwareOptimizer: probe_interval must be an int >= 0, got {probe_interval!r}"
    )
  if config is not None and not isinstance(config, PolicyConfig):
    raise TypeError(f"LossAwareOptimizer: config must be a PolicyConfig, got {config!r}")
  stage = LossAwareStage(half_dtype, config, probe_interval)
  try:
    optimizer_pipeline.add_stage(optimizer, stage)
  except TypeError as e:
    raise TypeError(f"LossAwareOptimizer cannot wrap {optimizer!r}: {e}") from None
  return optimizer


def _saved_stage(half, config, probe_interval):
  """Re-creates the stage from a Keras config (a loaded model, Horovod's Keras wrapper)."""
  half_dtype = None if half is None else tf.as_dtype(half)
  return LossAwareStage(half_dtype, config and PolicyConfig(**config), probe_interval)


def LossAwareGradientTape(tape, optimizer):  # noqa: N802
  """Makes `tape`.gradient() scale the loss and unscale the gradients as `optimizer` (made by
  LossAwareOptimizer) needs, and record the loss for the policy; returns the same tape.

  Needed in a GradientTape loop for fp16's loss scaling, the loss-spike detector and the probe;
  bf16 trains without it.
  """
  stage = optimizer_pipeline.find_stage(optimizer, LossAwareStage.kind)
  if not isinstance(stage, LossAwareStage):
    raise TypeError(
      f"LossAwareGradientTape: {optimizer!r} was not made by tf_ext.mixed_precision."
      "LossAwareOptimizer"
    )
  return optimizer_pipeline.add_stage(tape, stage)


def policy_of(optimizer):
  """The PrecisionPolicy of an optimizer made by LossAwareOptimizer (for this graph)."""
  stage = optimizer_pipeline.find_stage(optimizer, LossAwareStage.kind)
  if not isinstance(stage, LossAwareStage):
    raise TypeError(f"{optimizer!r} was not made by tf_ext.mixed_precision.LossAwareOptimizer")
  return stage.policy()


def report(optimizer):
  """The AMP state of an optimizer made by LossAwareOptimizer: half, loss_scale, switches, steps,
  half_fraction, skipped_steps, last_probe_error and last_fallback (why the policy last fell back
  to full precision: a word of tf_ext.mixed_precision.FALLBACKS, "none" if it never did).

  Eagerly: Python values now (bool, float, int; last_fallback a str). In a graph (a tf.function,
  a Session's graph): scalar tensors to run, last_fallback a tf.string.
  """
  tensors = policy_of(optimizer).report()
  fallback_index = tensors["last_fallback"]
  if not tf.executing_eagerly():
    return dict(tensors, last_fallback=tf.gather(tf.constant(FALLBACKS), fallback_index))
  python_types = {"half": bool, "switches": int, "steps": int, "skipped_steps": int}
  values = {
    name: python_types.get(name, float)(value.numpy())
    for name, value in tensors.items()
    if name != "last_fallback"
  }
  return dict(values, last_fallback=FALLBACKS[int(fallback_index.numpy())])


def _horovod_ranks():
  """horovod.tensorflow when the process trains with more than one Horovod (or LightCC) rank."""
  hvd = sys.modules.get("horovod.tensorflow")
  if hvd is None or not hvd.is_initialized() or hvd.size() < 2:
    return None
  return hvd


def _agree_across_ranks(hvd, loss, gradients_finite, probe_error):
  """The policy's inputs averaged over all ranks, so that every rank takes the same decision: the
  mean loss and probe error, and finite only where every rank's gradients are."""
  probe = tf.constant(-1.0) if probe_error is None else tf.cast(probe_error, tf.float32)
  local = tf.stack([tf.cast(loss, tf.float32), tf.cast(gradients_finite, tf.float32), probe])
  mean = hvd.allreduce(local, op=hvd.Average, name="tf_ext_amp_policy_inputs")
  probed = None if probe_error is None else mean[2]
  return mean[0], tf.equal(mean[1], 1.0), probed


class _StepTensors:
  """What the stage adds once per graph, read before the policy's update of the step."""

  def __init__(self, policy, half_dtype, probe_interval):
    ops = _ops_loader.load()
    with tf.name_scope("tf_ext_amp"):
      self.state = tf.identity(policy.state.read_value(), name="state")
      field = functools.partial(PrecisionPolicy.field_of, self.state)
      self.loss_scale = tf.cast(field("loss_scale"), tf.float32)
      in_half = PrecisionPolicy.in_half_of(self.state)
      # Nothing is rewritten eagerly (there is no graph) nor in a function XLA compiles (the
      # rewrite sees no compiled function, and XLA has no kernel for the op): fp32 steps.
      self.compiled = xla_policy.in_xla_context()
      if half_dtype is None or tf.executing_eagerly() or self.compiled:
        self.use_half = tf.constant(False)
      else:
        self.use_half = ops.tf_ext_amp_half_mode(
          in_half,
          half_dtype=half_dtype,
          allow_ops=list(settings.get("TF_EXT_AMP_ALLOW_OPS")),
          infer_ops=list(settings.get("TF_EXT_AMP_INFER_OPS")),
          deny_ops=list(settings.get("TF_EXT_AMP_DENY_OPS")),
          name="half_mode",
        )
      if half_dtype is None or probe_interval == 0 or self.compiled:
        self.do_probe = tf.constant(False)
      else:
        steps = tf.cast(field("steps"), tf.int64)
        self.do_probe = tf.logical_and(
          self.use_half, tf.equal(tf.math.floormod(steps + 1, probe_interval), 0), name="probe"
        )
    self.loss = None
    self.probe_error = None
    self.scaled = False  # the loss was multiplied by loss_scale; its gradients are not yet divided

  def reads(self):
    return [self.state, self.use_half, self.do_probe]


class LossAwareStage(optimizer_pipeline.Stage):
  """The pipeline stage of LossAwareOptimizer (see the module's docstring)."""

  kind = "loss_scale"
  saved = True

  def __init__(self, half_dtype, config, probe_interval):
    self.half_dtype = half_dtype
    self.config = config
    self.probe_interval = probe_interval
    self._policies = weakref.WeakKeyDictionary()  # outer graph (or the eager context) -> policy
    self._eager_policy = None
    self._steps = weakref.WeakKeyDictionary()  # graph -> _StepTensors
    self._eager_step = None  # eagerly: the step in progress
    self.owner = None  # a weak reference to the optimizer that tracks the policies

  def saved_arguments(self):
    return {
      "half": None if self.half_dtype is None else self.half_dtype.name,
      "config": self.config and dataclasses.asdict(self.config),
      "probe_interval": self.probe_interval,
    }

  def added_to(self, target):
    # The policies are tracked by the optimizer that carries the stage (not by a tape).
    if not isinstance(target, tf.GradientTape):
      self.owner = weakref.ref(target)

  @property
  def loss_scaling(self):
    return self.half_dtype == tf.float16

  def policy(self):
    """The policy of the current outer graph (eagerly: the one policy), made at first use and
    tracked by the optimizer, so checkpoints hold it."""
    with tf.init_scope():
      eager = tf.executing_eagerly()
      graph = None if eager else tf.compat.v1.get_default_graph()
      policy = self._eager_policy if eager else self._policies.get(graph)
      if policy is None:
        policy = self._make_policy()
        if eager:
          self._eager_policy = policy
        else:
          self._policies[graph] = policy
          graph.add_to_collection(STATE_COLLECTION, policy.state)
        owner = self.owner() if self.owner is not None else None
        if owner is not None:
          owner._track_trackable(policy, name=_TRACKED_NAME, overwrite=True)
          owner._handle_deferred_dependencies(name=_TRACKED_NAME, trackable=policy)
    return policy

  def _make_policy(self):
    if self.half_dtype is None:
      # Full precision only: the policy never returns to half; it still skips non-finite steps.
      never = 2**52
      config = dataclasses.replace(
        self.config or config_from_settings(),
        return_after_steps=never,
        max_return_after_steps=never,
      )
      return PrecisionPolicy(loss_scaling=False, start_in_half=False, config=config)
    return PrecisionPolicy(loss_scaling=self.loss_scaling, start_in_half=True, config=self.config)

  def _step(self, new=False):
    """This graph's step tensors; eagerly, the step in progress (`new`: a new step begins)."""
    if tf.executing_eagerly():
      if new or self._eager_step is None:
        self._eager_step = self._new_step()
      return self._eager_step
    graph = tf.compat.v1.get_default_graph()
    step = self._steps.get(graph)
    if step is None:
      step = self._steps[graph] = self._new_step()
    return step

  def _new_step(self):
    return _StepTensors(self.policy(), self.half_dtype, self.probe_interval)

  def scale_loss(self, loss):
    step = self._step(new=True)
    step.loss = loss
    if self.half_dtype is not None and self.probe_interval and not step.compiled:
      loss32 = tf.reduce_sum(tf.cast(tf.stop_gradient(loss), tf.float32))
      step.probe_error = _ops_loader.load().tf_ext_amp_probe(
        loss32, loss32, step.do_probe, name="tf_ext_amp/probe_error"
      )
    if not self.loss_scaling:
      return loss
    step.scaled = True
    return loss * tf.cast(step.loss_scale, loss.dtype)

  def transform(self, grads_and_vars):
    step = self._step()
    if not step.scaled:
      return grads_and_vars
    step.scaled = False
    inverse = 1.0 / step.loss_scale

    def unscale(gradient):
      if gradient is None:
        return None
      if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values * tf.cast(inverse, gradient.values.dtype)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
      return gradient * tf.cast(inverse, gradient.dtype)

    return [(unscale(g), v) for g, v in grads_and_vars]

  def should_apply(self, grads_and_vars):
    step = self._step()
    finite = [
      tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
      for g, _ in grads_and_vars
      if g is not None
    ]
    gradients_finite = tf.reduce_all(tf.stack(finite)) if finite else tf.constant(True)
    loss = tf.constant(0.0) if step.loss is None else tf.reduce_sum(step.loss)
    probe_error = step.probe_error
    hvd = _horovod_ranks()
    if hvd is not None:
      loss, gradients_finite, probe_error = _agree_across_ranks(
        hvd, loss, gradients_finite, probe_error
      )
    self._eager_step = None
    with tf.control_dependencies(step.reads()):
      # use_half is the step's data input, so Grappler keeps the rewrite's marker.
      return self.policy().decide(loss, gradients_finite, probe_error, step.use_half)


optimizer_pipeline.register_saved_stage(LossAwareStage.kind, _saved_stage)

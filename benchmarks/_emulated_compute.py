"""The emulated GPU compute of lightcc_scaling.py: a Keras model's layers as units whose forward
and backward take the share of the step their multiply-adds give them, the plan that scales the
step to the emulated link, the device clock the units sleep on, and the training step built of
them. Imported as `_emulated_compute` (the scripts run from this folder)."""

import math
import threading
import time

BATCH = 128  # images per rank and step (the seed's)


# One-V100 step time at batch 128 (see the docstring for where each comes from).
PROFILES = {
  "vgg16": {"builder": "VGG16", "step_s": BATCH / 251, "source": "seed: 251 images/s"},
  "resnet50": {
    "builder": "ResNet50",
    "step_s": BATCH / 360,
    "source": "assumed 360 images/s (fp32, one V100)",
  },
}


FORWARD_SHARE = 1 / 3  # forward : backward = 1 : 2


HOROVOD_FUSION_MB = 128


def fusion_candidates_mb(step_bytes):
  sizes = {round(step_bytes / d / 2**20, 2) for d in (16, 4)} | {HOROVOD_FUSION_MB}
  return sorted(x for x in sizes if 0 < x <= HOROVOD_FUSION_MB)


def _multiply_adds(layer, kernel_shape):
  """Multiply-adds per image of a Conv2D or Dense layer (0 for other layers)."""
  kind = type(layer).__name__
  if kind == "Conv2D":
    _, height, width, _ = layer.output_shape
    return height * width * math.prod(kernel_shape)
  if kind == "Dense":
    return math.prod(kernel_shape)
  return 0


def model_profile(name):
  """The model's units: [{"layer", "macs", "variables": [indices into trainable_variables]}],
  and the variables' shapes (built once, no weights downloaded)."""
  import tensorflow as tf

  model = getattr(tf.keras.applications, PROFILES[name]["builder"])(
    weights=None, include_top=True, input_shape=(224, 224, 3)
  )
  index = {v.ref(): i for i, v in enumerate(model.trainable_variables)}
  units = []
  for layer in model.layers:
    own = [index[v.ref()] for v in layer.trainable_weights]
    if not own:
      continue
    kernel = layer.trainable_weights[0].shape.as_list()
    units.append({"layer": layer.name, "macs": _multiply_adds(layer, kernel), "variables": own})
  shapes = [v.shape.as_list() for v in model.trainable_variables]
  del model
  tf.keras.backend.clear_session()
  return units, shapes


def emulated_plan(name, units, shapes, shrink, rate_bps, seed_link_bps, fusion_rounds=5):
  """The step the ranks run: shrunk shapes, per-unit forward/backward seconds, and the scaling."""
  params = sum(math.prod(s) for s in shapes)
  seed_s = PROFILES[name]["step_s"]
  seed_link_s = 4 * params * 8 / seed_link_bps  # lower bound on 2 nodes: S per direction
  ratio = seed_s / seed_link_s
  small = [[max(1, math.ceil(math.prod(s) / shrink))] if shrink > 1 else list(s) for s in shapes]
  emulated_bytes = 4 * sum(math.prod(s) for s in small)
  step_s = ratio * emulated_bytes * 8 / rate_bps
  total = sum(u["macs"] for u in units)
  plan_units = [
    {
      **u,
      "forward_s": step_s * FORWARD_SHARE * u["macs"] / total,
      "backward_s": step_s * (1 - FORWARD_SHARE) * u["macs"] / total,
    }
    for u in units
  ]
  return {
    "profile": name,
    "params": params,
    "seed_step_s": seed_s,
    "seed_link_s": seed_link_s,
    "seed_link_bps": seed_link_bps,
    "ratio": ratio,
    "shrink": shrink,
    "bytes": emulated_bytes,
    "step_s": step_s,
    "units": plan_units,
    "shapes": small,
    "fusion_mb": fusion_candidates_mb(emulated_bytes),
    "fusion_rounds": fusion_rounds,
  }


class DeviceClock:
  """A stream of sleeps, as a GPU runs kernels back to back; each span is recorded.

  "stream" (the default): the CPU launches a GPU's kernels ahead of the device, so a span starts
  when the previous one ends, and only a step's first span (first_unit's forward) waits for its
  launch. A sleep that wakes late, or a numpy_function that runs late because the ranks share
  2 cores, then delays the gradient it hands on but not the spans planned after it.
  "launch": a span starts when the previous one ends or when launched, whichever is later, so
  the CPU's dispatch delays add up over the step's 2 x units spans.
  """

  def __init__(self, mode="stream", first_unit=0):
    self.free_at = 0.0
    self.spans = []  # (kind, unit, start, end), perf_counter seconds
    self.lock = threading.Lock()
    self.launch_bound = mode == "launch"
    self.first_unit = first_unit

  def run(self, kind, unit, seconds):
    with self.lock:
      start = self.free_at
      if self.launch_bound or (kind == "forward" and unit == self.first_unit):
        start = max(time.perf_counter(), start)
      end = start + seconds
      self.free_at = end
      self.spans.append((kind, unit, start, end))
    delay = end - time.perf_counter()
    if delay > 0:
      time.sleep(delay)


def unit_groups(units):
  """Unit indices in groups that each end with a unit that takes time, the units without time
  (batch norm) joining the next one that takes time (a trailing group may have none): one
  forward and one backward sleep per group. A unit without time hands its gradients on when the
  backward of the next timed unit ends, whether it has its own sleep or shares that one; sharing
  halves ResNet50's numpy_functions (107 backward ones to 54) and their CPU."""
  groups, pending = [], []
  for number, unit in enumerate(units):
    pending.append(number)
    if unit["forward_s"] > 0 or unit["backward_s"] > 0:
      groups.append(pending)
      pending = []
  return groups + [pending] if pending else groups


def build_step(tf, plan, variables, stored, clock, tape_wrapper, marks=None):
  """The training step: forward and backward sleeps per unit group (custom gradients), the tape
  (wrapped by tape_wrapper, e.g. hvd.DistributedGradientTape), the update; returns a function
  of nothing that runs one step. With a marks list, it collects (variable index, time its reduced
  gradient was there): a numpy_function per gradient, which cost ResNet50's ranks half of the
  emulation's CPU (28 of 53 ms a step), so the timed steps run without them."""

  def sleeper(kind, unit, seconds):
    def fn(token, *passed):
      if seconds > 0:
        clock.run(kind, unit, seconds)
      return (token, *passed[1:]) if passed else token

    return fn

  def mark_fn(index):
    def fn(value):
      marks.append((index, time.perf_counter()))
      return value

    return fn

  def group_op(numbers):
    timed = numbers[-1]  # the group's only unit that may take time
    forward_s, backward_s = (plan["units"][timed][k] for k in ("forward_s", "backward_s"))
    owned = [i for n in numbers for i in plan["units"][n]["variables"]]

    # Stateless py_funcs, ordered by data only: automatic control dependencies would chain
    # stateful ones in program order (and so everything stateful created after them, such as
    # collectives), and Grappler drops control edges that leave stateless ops.
    @tf.custom_gradient
    def op(token, *values):
      out = token
      if forward_s > 0:
        out = tf.numpy_function(
          sleeper("forward", timed, forward_s), [token], tf.float32, stateful=False
        )
        out.set_shape([])

      def grad(upstream):
        # After this group's forward (out) and the next group's backward (upstream); the
        # gradients pass through the sleep unchanged (numpy views of the stored tensors: no copy).
        stored_values = [stored[i].read_value() for i in owned]
        got = tf.numpy_function(
          sleeper("backward", timed, backward_s),
          [upstream, out, *stored_values],
          [tf.float32] * (1 + len(stored_values)),
          stateful=False,
        )
        got[0].set_shape([])
        for g, v in zip(got[1:], values):
          g.set_shape(v.shape)
        return list(got)

      return out, grad

    return op, owned

  ops = [group_op(numbers) for numbers in unit_groups(plan["units"])]
  # Variables, not constants: Grappler would fold the sleeps of a constant input away.
  start, seed = tf.Variable(0.0, trainable=False), tf.Variable(1.0, trainable=False)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      token = start.read_value()
      for op, owned in ops:
        token = op(token, *[variables[i].value() for i in owned])
      loss = token * seed.read_value()
    grads = tape_wrapper(tape).gradient(loss, variables)
    seen = []
    for i, (v, g) in enumerate(zip(variables, grads)):
      first = tf.reshape(g, [-1])[:1]
      if marks is not None:
        first = tf.numpy_function(mark_fn(i), [first], tf.float32, stateful=False)
      seen.append(first)
      tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=tf.constant(1e-6), delta=g)
    return tf.concat(seen, 0)

  return step

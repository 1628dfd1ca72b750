#!/usr/bin/env python3
"""LightCC's scaling efficiency on an emulated cluster whose compute sleeps like a GPU.

Needs root (network namespaces, a veth link, tc qdiscs) and `ip` / `tc`: the cluster is
lightcc_cluster.py's (2 netns nodes x RANKS ranks, one tbf-shaped veth between them, ranks
launched as `horovodrun --gloo` launches them).

Emulated compute. Each Keras layer with weights of the profile's model (tf.keras.applications,
weights=None, 224x224 input: VGG16 138,357,544 trainable parameters, ResNet50 25,583,592) is one
unit with a forward and a backward time; units without multiply-adds (batch norm) take no time. The
rule: a unit's share of the step is its multiply-adds per image (Conv2D: out_h * out_w * kh * kw *
c_in * c_out; Dense: c_in * c_out) over the model's; forward takes 1/3 of the step and backward 2/3
(backward computes the gradients of both the input and the weights). Each unit's time is a
`tf.numpy_function` that sleeps (the core is free meanwhile) on a per-process "device clock" that
runs like a GPU stream fed ahead by the CPU (--clock stream, the default): a unit starts when the
previous one ends, so neither a sleep's overshoot nor the CPU's late dispatch of the next unit (4
ranks share 2 cores) adds up over the step; only a step's first unit waits for its launch. --clock
launch starts a unit no earlier than its numpy_function runs (the clock before 2026-11-28), which
charges the compute for the ranks' CPU contention. Each unit's gradients are the unit's stored
gradient (read from a variable: no arithmetic) with a data dependency on that unit's backward sleep,
which depends on the next unit's backward: gradients become ready in backprop order, last layer
first, as on a GPU. A unit without time shares the sleeps of the next unit that takes time (it
follows that unit's backward anyway), and the timed steps record nothing per gradient: one more
step after them, untimed, records when each reduced gradient was there. That keeps the emulation's
own CPU small (ResNet50 in one process without sleeps: 9 ms a step; 53 ms with a numpy_function
per batch norm and per gradient, before 2026-11-28 13:00 UTC). Each step is a real (LightCC or
Horovod) DistributedGradientTape over these gradients, then an in-place SGD update
(ResourceApplyGradientDescent, the only CPU work besides the exchange).

Seed ratio and scaling. One V100 step at batch 128: VGG16 0.51 s (251 images/s, the issue's
seed); ResNet50 0.356 s (360 images/s, an assumption: the order of published fp32 TensorFlow
figures for one V100, not measured here). The seed's cluster has two nodes joined by 25 Gbit/s, on
which the allreduce lower bound per node and direction is S (the gradient bytes): 0.177 s for
VGG16 (S = 553 MB), so compute / link = 2.88; ResNet50 (S = 102.3 MB) 10.9. Two shared CPU
cores cannot move 553 MB per step through Gloo in a fraction of a second, so the benchmark keeps
that ratio on a smaller problem: every gradient is shrunk by --shrink (a tensor of n floats
becomes a 1-D tensor of ceil(n / shrink) floats; --shrink 1 keeps the model's exact shapes), the
link runs at --rate, and the one-device step is set to ratio * (S / shrink) / rate. What this does
not scale: the ranks' own CPU work (in-node exchange over loopback, top-k selection, the update)
that NVLink and the GPU do on the seed, and the 8 GPUs per node (2 or 4 ranks here).
--seed-link sets the seed's link (25gbit); 1gbit asks what the same GPUs would keep on an
ordinary 1 Gbit/s network (VGG16: compute/link 0.115), which the emulated link reproduces at
--rate 100mbit with 10x the bytes' time. --rate uncapped removes the tbf (the veth as fast as the
CPUs move it) and keeps the compute of --scale-rate (1gbit).

Efficiency = (N-rank images/s) / (N x one-rank images/s), the one-rank run being the same
emulated compute and update in one process without Horovod; images/s = 128 * ranks / step time.

Horovod's timeline is off in the timed runs: HOROVOD_TIMELINE=DYNAMIC alone, never started,
slowed a VGG16 step by 11 % here (2D + TOPK at the 1 Gbit/s network's ratio, 0.334 -> 0.372 s,
3 interleaved runs each). Each profile's Horovod and best LightCC configuration run once more
with it on, for one extra step inside hvd.start_timeline after their warm-up: the timeline chart
(second chart: rank 0's forward and backward spans, per gradient the time from ready, its unit's
backward ended, to reduced, handed to the update, and the collectives, aligned on the barrier
before the step) and the table's collective columns come from that step.

Noise. The 4 ranks use most of the 2 cores (about 100 ms of CPU per rank in a 0.25 s ResNet50
step), so a run is slower when the hypervisor lends the machine's CPUs to others (steal time in
/proc/stat; a ResNet50 run with 20 % steal took 0.357 s a step, runs with none 0.25 s). Each run
prints the host's steal share over its timed steps, and a run over --max-steal (5 %) is run again
(--steal-retries, 2; when every try was over, the one with the least steal is kept). It also
prints its CPU time per step and, per step, its TCP retransmits, tail loss probes (an ACK came
late, as when a vCPU waits) and timeouts, and the packets its link's tbf dropped. The verdict of
fusion against its best fixed size gives its standard error over the runs, and says so when the
target lies within two of them.

  make bench-scaling                                     # VGG16 and ResNet50, every config
  make bench-scaling BENCH_ARGS=--quick                  # 2-4 min: VGG16, 3 configs
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --profiles vgg16 --configs horovod,2d+topk
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --ranks-per-node 4 --quick
  # the same V100s on an ordinary 1 Gbit/s network, at a tenth of the time scale
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --seed-link 1gbit --rate 100mbit
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --rate uncapped   # compute as for 1gbit
"""

import argparse
import atexit
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import lightcc_cluster  # noqa: E402

BATCH = 128  # images per rank and step (the seed's)
UNCAPPED = "uncapped"  # --rate: no tbf on the veth (compute scaled to --scale-rate)
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

# Adaptive fusion: candidate bucket sizes S/16, S/4 and Horovod's default fusion threshold, 128 MiB
# (which holds the whole shrunk step: one bucket), probed in --fusion-rounds interleaved rounds
# (LIGHT_FUSION_PROBE_STEPS, default 5 as LightCC's; the first round is not counted; close sizes
# are refined), each in a graph that holds it alone (LIGHT_FUSION_RETRACE=1: behind the switch,
# the dead branches' CPU made the probe favour small buckets); never re-probed within a run.
# Fusion configurations warm up for their longest probe, then for --warmup steps as the others:
# the timed steps run the chosen size, frozen.
FUSION = {"LIGHT_FUSION": "1", "LIGHT_FUSION_REPROBE_STEPS": "0", "LIGHT_FUSION_RETRACE": "1"}
HOROVOD_FUSION_MB = 128


def fusion_candidates_mb(step_bytes):
  sizes = {round(step_bytes / d / 2**20, 2) for d in (16, 4)} | {HOROVOD_FUSION_MB}
  return sorted(x for x in sizes if 0 < x <= HOROVOD_FUSION_MB)


TOPK = {"LIGHT_TOPK_ALLREDUCE": "1", "LIGHT_TOPK_RATIO": "0.01"}
# Without fusion, LightCC exchanges 2D and TOPK gradients in fixed buckets of LIGHT_BUCKET_MB
# (default 25 MiB), divided by the shrink factor like TOPK's threshold; "+onegroup" sets 0: one
# exchange per kind after the whole backward pass (LightCC before issue 39's part 2).
BUCKET_MB = 25
CONFIG_NAMES = [
  "horovod",
  "2d",
  "2d+topk",
  "2d+topk+fp16",
  "fusion",
  "2d+fusion",
  "2d+topk+fusion",
  "2d+topk+fp16+fusion",
  "2d+topk+fusion+switch",
  "2d+onegroup",
  "2d+topk+onegroup",
]
QUICK_CONFIGS = ["horovod", "2d+topk", "2d+topk+fusion"]
# --fixed-sweep runs these fusion configurations again without fusion, once per candidate size
# fixed (LIGHT_BUCKET_MB), named "<config>@<MiB>": the sizes fusion chooses among.
SWEPT_CONFIGS = ["2d+fusion", "2d+topk+fusion"]
LABELS = {
  "horovod": "Horovod",
  "2d": "2D",
  "2d+topk": "2D+TOPK",
  "2d+topk+fp16": "2D+TOPK+fp16",
  "fusion": "fusion",
  "2d+fusion": "2D+fusion",
  "2d+topk+fusion": "2D+TOPK+fusion",
  "2d+topk+fp16+fusion": "2D+TOPK+fp16+fusion",
  "2d+topk+fusion+switch": "2D+TOPK+fusion, switch probe",
  "2d+onegroup": "2D one group",
  "2d+topk+onegroup": "2D+TOPK one group",
}
TARGETS = {"vgg16": 0.85, "resnet50": 0.90}
FUSION_TARGET = 1.1  # adaptive fusion against Horovod, on one profile
FIXED_TARGET = 0.97  # adaptive fusion against its best fixed bucket size, on every profile
REQUIRED_MODULES = lightcc_cluster.REQUIRED_MODULES


def label(name):
  base, _, fixed_mb = name.partition("@")
  return f"{LABELS[base]} {fixed_mb} MiB" if fixed_mb else LABELS[base]


def fixed_sweep(config, plan):
  """The fixed-bucket runs that --fixed-sweep adds for a fusion configuration (none for others)."""
  if config not in SWEPT_CONFIGS:
    return []
  return [f"{config.replace('+fusion', '')}@{mb:g}" for mb in plan["fusion_mb"]]


def run_order(configs, plan, sweep, repeats):
  """(the configurations as the report lists them, the order they run in). With the fixed sweep,
  each swept fusion configuration and its fixed sizes form a group that runs `repeats` times in
  rounds, each round one run of each (fusion, @a, @b, @c, then @a, @b, @c, fusion, ...): a load or
  a link that drifts for a while then weighs on one round's runs alike, and the verdict compares
  them round by round. Each round starts one later in the group, so that no configuration always
  runs first after the previous one's exchange. Other configurations run once, first."""
  groups = [[c, *fixed_sweep(c, plan)] for c in configs if sweep and fixed_sweep(c, plan)]
  grouped = {c for g in groups for c in g}
  listed = list(configs) + [c for g in groups for c in g[1:] if c not in configs]
  once = [c for c in configs if c not in grouped]
  rounds = [g[n % len(g) :] + g[: n % len(g)] for n in range(repeats) for g in groups]
  return listed, once + [c for group_round in rounds for c in group_round]


def pool_repeats(rows):
  """One row from a configuration's repeated runs: its step time is the mean over all their
  steps; the per-run step times and fusion choices are kept beside it. Failed runs are counted
  and left out; the row fails only when every run did."""
  ok = [r for r in rows if "error" not in r]
  if not ok:
    return rows[-1]
  if len(rows) == 1:
    return rows[0]
  steps = sum(r["steps"] for r in ok)
  step_s = sum(r["step_s"] * r["steps"] for r in ok) / steps
  pooled = dict(ok[-1], steps=steps, step_s=step_s)
  pooled["images_per_s"] = ok[0]["images_per_s"] * ok[0]["step_s"] / step_s
  pooled["efficiency"] = ok[0]["efficiency"] * ok[0]["step_s"] / step_s
  pooled["link_bytes_per_step"] = [
    sum(r["link_bytes_per_step"][n] for r in ok) / len(ok)
    for n in range(len(ok[0]["link_bytes_per_step"]))
  ]
  pooled["repeats"] = [
    {key: r[key] for key in ("step_s", "cpu_s_per_rank_step", "steal_share", "fusion")}
    if "error" not in r
    else {"error": r["error"]}
    for r in rows
  ]
  return pooled


def speed_ratio_with_error(runs, reference_runs):
  """The speed of `runs` against `reference_runs`, the per-run step times of two configurations
  that ran in the same rounds (run_order; None for a failed run), over the rounds where both ran:
  mean(reference) / mean(runs), and its standard error from how the rounds' pairs stray from that
  ratio (first order). The shared machine slows whole rounds for minutes, and both of a round's
  runs alike (their CPU time per step rises with their step time): pairing the runs by round takes
  that out of the error, which unpaired runs' spread would count twice. A ratio closer to its
  target than two standard errors says less than its digits."""
  pairs = [(x, y) for x, y in zip(runs, reference_runs) if x is not None and y is not None]
  if not pairs:
    return float("nan"), float("nan")
  mean = statistics.fmean(x for x, _ in pairs)
  ratio = statistics.fmean(y for _, y in pairs) / mean
  if len(pairs) < 2:
    return ratio, float("nan")
  strays = [y - ratio * x for x, y in pairs]
  return ratio, (statistics.variance(strays) / len(pairs)) ** 0.5 / mean


def fusion_warmup(warmup, plan):
  """Warm-up steps of a fusion configuration: its longest probe, then `warmup` steps, as the
  other configurations, of the size it chose."""
  from tf_ext.lightcc.fusion import FusionPolicy

  return FusionPolicy.longest_probe(len(plan["fusion_mb"]), plan["fusion_rounds"]) + warmup


def config_env(name, ranks_per_node, plan):
  """LIGHT_* settings of a configuration name ("2d+topk+fusion" = its parts' settings;
  "2d+topk@2.06" = 2D + TOPK in fixed 2.06 MiB buckets). TOPK's size threshold (1 MiB by default)
  is divided by the plan's shrink factor, so that the same tensors are compressed as in the
  full-size model."""
  env = {}
  name, _, fixed_mb = name.partition("@")
  parts = set(name.split("+"))
  if "2d" in parts:
    env.update(LIGHT_2D_ALLREDUCE="1", LIGHT_INTRA_SIZE=str(ranks_per_node))
  if "topk" in parts:
    env.update(TOPK, LIGHT_TOPK_THRESHOLD=str(max(1, (1 << 20) // plan["shrink"])))
  if "fp16" in parts:
    env["LIGHT_TOPK_FP16"] = "1"
  if "fusion" in parts:
    env.update(FUSION, LIGHT_FUSION_PROBE_STEPS=str(plan["fusion_rounds"]))
    env["LIGHT_FUSION_BUCKETS_MB"] = ",".join(f"{x:g}" for x in plan["fusion_mb"])
    if "switch" in parts:  # probed behind one tf.switch_case, as before LIGHT_FUSION_RETRACE
      env["LIGHT_FUSION_RETRACE"] = "0"
  elif fixed_mb:
    env["LIGHT_BUCKET_MB"] = fixed_mb
  elif parts & {"2d", "topk"}:
    env["LIGHT_BUCKET_MB"] = "0" if "onegroup" in parts else f"{BUCKET_MB / plan['shrink']:g}"
  return env


# ------------------------------------------------------------------------------- the profiles


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


# ----------------------------------------------------------------------------------- rank side


class DeviceClock:
  """A stream of sleeps, as a GPU runs kernels back to back; each span is recorded.

  "stream" (the default): the CPU launches a GPU's kernels ahead of the device, so a span starts
  when the previous one ends, and only a step's first span (first_unit's forward) waits for its
  launch. A sleep that wakes late, or a numpy_function that runs late because the ranks share
  2 cores, then delays the gradient it hands on but not the spans planned after it.
  "launch": a span starts when the previous one ends or when launched, whichever is later, so
  the CPU's dispatch delays add up over the step's 2 x units spans (the clock before 2026-11-28).
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


def horovod_collectives(path, anchor):
  """Horovod's timeline file as [(tensor, activity, start, end)] of its top-level activities (the
  negotiation, then the collective itself), in seconds on the step's clock: the end of the barrier
  allreduce before the step is taken to be at `anchor`."""
  with open(path) as f:
    text = f.read().strip().rstrip(",")
  events = json.loads(text if text.endswith("]") else text + "]")
  names = {
    e["pid"]: e["args"].get("name", "")
    for e in events
    if e.get("ph") == "M" and e.get("name") == "process_name"
  }
  spans, open_ = [], {}
  for e in events:
    pid = e.get("pid")
    if e.get("ph") == "B":
      open_.setdefault(pid, []).append((e.get("name", ""), e["ts"]))
    elif e.get("ph") == "E" and open_.get(pid):
      activity, start = open_[pid].pop()
      if not open_[pid]:
        spans.append((names.get(pid, str(pid)), activity, start / 1e6, e["ts"] / 1e6))
  # The barrier (an eager allreduce: Horovod names it HorovodAllreduce) that ended last before
  # the step's first collective started.
  barrier = [x for x in spans if x[0] == "HorovodAllreduce"]
  work = [x for x in spans if x[0] != "HorovodAllreduce"]
  if not work:
    return []
  first = min(start for _, _, start, _ in work)
  before = [end for _, _, _, end in barrier if end <= first]
  if not before:
    return []
  shift = anchor - max(before)
  return [(tensor, activity, start + shift, end + shift) for tensor, activity, start, end in work]


def _peak_rss():
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  return None


def worker(args):
  import numpy as np
  import tensorflow as tf

  with open(args.spec) as f:
    spec = json.load(f)
  plan = spec["plan"]
  tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op_threads"])
  distributed = spec["world"] > 1
  if distributed:
    import horovod.tensorflow as horovod_hvd

    import tf_ext.lightcc as hvd

    hvd.init()
    rank = hvd.rank()
    wrapper = hvd.DistributedGradientTape
  else:
    rank, wrapper = 0, lambda tape: tape
  rng = np.random.default_rng(1234 + rank)
  shapes = [tuple(s) for s in plan["shapes"]]
  variables = [tf.Variable(tf.zeros(s, tf.float32), name=f"w{i}") for i, s in enumerate(shapes)]
  stored = [
    tf.Variable(rng.standard_normal(s, dtype=np.float32), trainable=False, name=f"g{i}")
    for i, s in enumerate(shapes)
  ]
  first_unit = min(n for n, u in enumerate(plan["units"]) if u["forward_s"] > 0)
  clock, marks = DeviceClock(spec.get("clock", "stream"), first_unit), []

  def make_step():
    return build_step(tf, plan, variables, stored, clock, wrapper)

  def make_marked_step():
    return build_step(tf, plan, variables, stored, clock, wrapper, marks)

  def barrier():
    if distributed:
      horovod_hvd.allreduce(tf.constant(0.0), op=horovod_hvd.Sum, name="scaling_barrier").numpy()

  fusion_on = distributed and hvd.light_config().fusion
  if fusion_on:
    # Each bucket size is probed in a graph that holds it alone (LIGHT_FUSION_RETRACE=1), and the
    # choice is frozen once settled (re-probes are off), as a Keras user's FusionSettledCallback
    # does; the warm-up goes on with the chosen bucketing alone.
    step = hvd.FusionStepFunction(make_step)
    marked_step = hvd.FusionStepFunction(make_marked_step, freeze_when_settled=False)
  else:
    step, marked_step = make_step(), make_marked_step()
  t = time.perf_counter()
  marked_step().numpy()  # traced now, run once more after the timed steps
  for _ in range(spec["fusion_warmup"] if fusion_on else spec["warmup"]):
    step().numpy()
  if fusion_on:
    marked_step().numpy()  # traced again with the frozen choice
  warmup_s = time.perf_counter() - t
  barrier()
  if distributed:
    hvd.reset_traffic()
  before = lightcc_cluster._read_counters()

  def marked_run():
    """Runs the marked step; its begin and end, and its spans and marks from its begin."""
    clock.spans.clear()
    marks.clear()
    begin = time.perf_counter()
    marked_step().numpy()
    return {
      "begin": begin,
      "end": time.perf_counter(),
      "spans": [(k, u, s - begin, e - begin) for k, u, s, e in clock.spans],
      "marks": [(i, m - begin) for i, m in marks],
    }

  t0, cpu0 = time.perf_counter(), time.process_time()
  step_s_each = []
  for _ in range(spec["steps"]):
    begin = time.perf_counter()
    step().numpy()
    step_s_each.append(time.perf_counter() - begin)
  barrier()
  elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
  after = lightcc_cluster._read_counters()
  traffic = hvd.traffic() if distributed else None
  # One more step, untimed, with marks: the timeline (with Horovod's too in a timeline run).
  marked, collectives, timeline_error = None, [], None
  if distributed and os.environ.get("HOROVOD_TIMELINE"):
    path = os.path.join(args.result_dir, f"horovod_timeline{rank}.json")
    try:
      hvd.start_timeline(path)
      barrier()
      anchor = time.perf_counter()  # the barrier's allreduce just ended: aligns the two clocks
      marked = marked_run()
      barrier()
      hvd.stop_timeline()
      collectives = horovod_collectives(path, anchor - marked["begin"])
    except Exception as error:  # the timeline is extra: the figures stand without it
      timeline_error = f"{type(error).__name__}: {error}"
  if marked is None:
    marked = marked_run()
  result = {
    "rank": rank,
    "steps": spec["steps"],
    "elapsed_s": elapsed,
    "warmup_s": warmup_s,
    "counters": {k: after[k] - before[k] for k in after},
    "traffic": traffic,
    "cpu_s": cpu_s,
    "fusion": [
      {
        "chosen": p.current,
        "median_step_s": p.medians,
        "history": p.history,
        "frozen_after_steps": step.frozen_after_steps,
        "step_functions_traced": step.traced,
      }
      for p in hvd.fusion_policies()
    ]
    if distributed
    else [],
    "timeline": dict(marked, collectives=collectives, collectives_error=timeline_error),
    "step_s_each": step_s_each,
    "peak_rss": _peak_rss(),
  }
  with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
  barrier()


# --------------------------------------------------------------------------------- parent side


def worker_argv(spec_path, result_dir):
  """The command line of one rank (or of the one-rank baseline) running this script's worker."""
  argv = [sys.executable, os.path.abspath(__file__), "--worker", "--spec", spec_path]
  return argv + ["--result-dir", result_dir]


def run_undisturbed(cluster, config, spec_path, result_dir, plan, args, single_step, shown):
  """Runs a configuration (lightcc_cluster.run_undisturbed: again while the host's steal was over
  --max-steal). Returns its row, or a failure row, and the disturbed rows it replaced."""

  def run_once():
    got, failure = launch_config(cluster, config, spec_path, result_dir, plan, args)
    return {"name": config, **failure} if failure else summarize(config, got, plan, single_step)

  def show(row, again, seconds):
    if "error" in row:
      print(f"  {shown}: FAILED: {row['error']}\n{row['logs']}", flush=True)
      return
    print(
      f"  {shown}: {row['step_s']:.3f} s/step, efficiency {row['efficiency']:.1%}, link "
      f"{max(row['link_bytes_per_step']) / 1e6:.2f} MB/step, "
      f"TCP per step {row['retransmits_per_step']:.1f} retransmits, "
      f"{row['loss_probes_per_step']:.1f} loss probes, {row['timeouts_per_step']:.1f} timeouts, "
      f"{row['link_drops_per_step']:.1f} drops at the link; steal "
      f"{row['steal_share']:.0%}, CPU/rank {row['cpu_s_per_rank_step'] * 1e3:.0f} ms/step, peak "
      f"RSS/rank {row['peak_rss'] / 2**30:.2f} GiB ({seconds:.0f}s)"
      + (f"; steal over {args.max_steal:.0%}: run again" if again else ""),
      flush=True,
    )

  return lightcc_cluster.run_undisturbed(run_once, args, show)


def launch_config(cluster, config, spec_path, result_dir, plan, args, **env):
  """Runs a configuration's ranks on the cluster: (rank -> result, None) or (None, failure)."""
  env = dict(config_env(config, args.ranks_per_node, plan), **env)
  argv = worker_argv(spec_path, result_dir)
  return lightcc_cluster.launch_ranks(cluster, argv, env, result_dir, args.timeout)


def config_dir(pdir, config):
  """A configuration's result folder ("2d+topk@2.06" -> 2d_topk_at_2.06) in the profile's."""
  return os.path.join(pdir, config.replace("+", "_").replace("@", "_at_"))


def run_single(spec_path, result_dir, timeout):
  """The one-rank baseline: the same step in one process, no Horovod, no namespace."""
  os.makedirs(result_dir, exist_ok=True)
  argv = worker_argv(spec_path, result_dir)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHT_", "HOROVOD_"))}
  env.update(PYTHONPATH=_common.REPO, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
  with open(os.path.join(result_dir, "rank0.log"), "w") as log:
    proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
  path = os.path.join(result_dir, "rank0.json")
  if proc.returncode or not os.path.exists(path):
    with open(os.path.join(result_dir, "rank0.log")) as f:
      return None, {"error": f"exit {proc.returncode}", "logs": f.read()[-3000:]}
  with open(path) as f:
    return {0: json.load(f)}, None


def summarize(name, results, plan, single_step_s):
  world = lightcc_cluster.WORLD
  r0 = results[0]
  step_s = r0["elapsed_s"] / r0["steps"]
  link = [0.0] * lightcc_cluster.NODES
  per_node = ("tcp_retrans_segs", "tcp_loss_probes", "tcp_timeouts", "qdisc_drops")
  node_sums = dict.fromkeys(per_node, 0)  # both nodes' counters added
  for r in results.values():
    node = r["rank"] // lightcc_cluster.RANKS_PER_NODE
    if r["rank"] % lightcc_cluster.RANKS_PER_NODE == 0:  # counters are per namespace
      link[node] = r["counters"][f"{lightcc_cluster.IFACE}_tx_bytes"] / r["steps"]
      for key in per_node:
        node_sums[key] += r["counters"].get(key, 0)
  return {
    "name": name,
    "env": config_env(name, lightcc_cluster.RANKS_PER_NODE, plan),
    "steps": r0["steps"],
    "step_s": step_s,
    "images_per_s": BATCH * world / step_s,
    "efficiency": single_step_s / step_s,
    "link_bytes_per_step": link,
    # TCP segments sent again, both nodes; tail loss probes (an ACK was late) and timeouts; and
    # the packets the tbf dropped (its queue, --latency, overflowed).
    "retransmits_per_step": node_sums["tcp_retrans_segs"] / r0["steps"],
    "loss_probes_per_step": node_sums["tcp_loss_probes"] / r0["steps"],
    "timeouts_per_step": node_sums["tcp_timeouts"] / r0["steps"],
    "link_drops_per_step": node_sums["qdisc_drops"] / r0["steps"],
    "steal_share": lightcc_cluster.steal_share(r0["counters"]),
    "analytic_inter_bytes_all_ranks": sum(r["traffic"]["inter_bytes"] for r in results.values())
    / r0["steps"],
    "fusion": r0["fusion"],
    "timeline": r0["timeline"],
    "overlap": overlap_figures(r0["timeline"], plan),
    "peak_rss": max(r["peak_rss"] or 0 for r in results.values()),
    # The CPU time of a rank's process per timed step (all its threads), mean over ranks.
    "cpu_s_per_rank_step": sum(r["cpu_s"] for r in results.values()) / (len(results) * r0["steps"]),
    "warmup_s": r0["warmup_s"],
  }


def charted(rows):
  """The configurations the timeline shows: Horovod and the most efficient LightCC one."""
  ok = [r for r in rows if "error" not in r]
  light = [r for r in ok if r["name"] != "horovod"]
  return [r for r in ok if r["name"] == "horovod"] + (
    [max(light, key=lambda r: r["efficiency"])] if light else []
  )


def add_timeline(row, cluster, spec_path, pdir, plan, args):
  """Runs row's configuration once more with Horovod's timeline on (its warm-up, one timed step,
  the timeline's step) and adds that step (row["timeline_run"]) and its collective figures to the
  row; a failure is reported and leaves the row's timed figures as they are."""
  config = row["name"]
  result_dir = config_dir(pdir, config) + "_timeline"
  t = time.perf_counter()
  got, failure = launch_config(
    cluster, config, spec_path, result_dir, plan, args, HOROVOD_TIMELINE="DYNAMIC"
  )
  timeline = None if failure else got[0]["timeline"]
  error = failure["error"] if failure else timeline["collectives_error"]
  if error:
    row["timeline_error"] = error
    print(f"  {config} with Horovod's timeline: FAILED: {error}", flush=True)
    return
  row["timeline_run"] = timeline
  figures = overlap_figures(timeline, plan)
  row["overlap"].update({k: figures[k] for k in COLLECTIVE_FIGURES if k in figures})
  print(f"  {config} with Horovod's timeline ({time.perf_counter() - t:.0f}s)", flush=True)


# From Horovod's timeline (overlap_figures): only the charted configurations have them.
COLLECTIVE_FIGURES = ("first_collective", "collective_s_before_backward_end")


def overlap_figures(timeline, plan):
  """When the backward pass ended, and when the first and last reduced gradients were there
  (seconds from the step's start), and how much of the exchange ran while backward did."""
  backward = [(s, e) for k, _, s, e in timeline["spans"] if k == "backward"]
  marks = sorted(t for _, t in timeline["marks"])
  if not backward or not marks:
    return {}
  backward_start = min(s for s, _ in backward)
  backward_end = max(e for _, e in backward)
  return {
    "backward_start": backward_start,
    "backward_end": backward_end,
    "first_reduced": marks[0],
    "last_reduced": marks[-1],
    "reduced_before_backward_end": sum(t < backward_end for t in marks) / len(marks),
    **collective_overlap(timeline.get("collectives") or [], backward_end),
    "step_end": timeline["end"] - timeline["begin"],
  }


def collective_overlap(collectives, backward_end):
  """From Horovod's timeline: when the first collective (not its negotiation) started, and the
  share of the collectives' time that ran before the backward pass ended."""
  work = [(s, e) for _, activity, s, e in collectives if not activity.startswith("NEGOTIATE")]
  if not work:
    return {}
  total = sum(e - s for s, e in work)
  before = sum(max(0.0, min(e, backward_end) - s) for s, e in work)
  return {
    "first_collective": min(s for s, _ in work),
    "collective_s_before_backward_end": before / total if total > 0 else 0.0,
  }


def report(profile_rows, args):
  print(
    f"\n{'profile':<9} {'config':<21} {'step s':>7} {'img/s':>7} {'eff':>6} {'link MB/step':>13} "
    f"{'1st red.':>8} {'bwd end':>8} {'last red.':>9} {'1st coll.':>9} {'coll<bwd':>8} "
    f"{'fusion MiB':>10}"
  )
  for name, (plan, single, rows) in profile_rows.items():
    print(
      f"{name:<9} {'1 rank (no Horovod)':<21} {single:7.3f} {BATCH / single:7.1f} {1:6.0%} "
      f"{'':>13} (planned compute {plan['step_s']:.3f} s)"
    )
    for r in rows:
      if "error" in r:
        print(f"{name:<9} {r['name']:<21} FAILED: {r['error']}")
        continue
      o = r["overlap"]
      chosen = "/".join(
        f"{plan['fusion_mb'][run['fusion'][0]['chosen']]:g}"
        for run in r.get("repeats", [r])
        if run.get("fusion")
      )
      print(
        f"{name:<9} {r['name']:<21} {r['step_s']:7.3f} {r['images_per_s']:7.1f} "
        f"{r['efficiency']:6.1%} {max(r['link_bytes_per_step']) / 1e6:13.2f} "
        f"{o['first_reduced']:8.3f} {o['backward_end']:8.3f} {o['last_reduced']:9.3f} "
        f"{_optional(o.get('first_collective'), '9.3f')} "
        f"{_optional(o.get('collective_s_before_backward_end'), '8.0%')} {chosen:>10}"
      )
  print("  1st red. / last red.: s from the step's start when rank 0 had its first / last reduced")
  print("  gradient; bwd end: when its emulated backward pass ended; 1st coll.: when its first")
  print("  collective started; coll<bwd: the share of the collectives' time before the backward")
  print("  pass ended (both from Horovod's timeline, which slows steps: on one more run of")
  print("  Horovod and of the best LightCC configuration only).")
  for name, (_, _, rows) in profile_rows.items():
    for r in rows:
      if "repeats" in r:
        each = _each_run(r["repeats"], "step_s", ".3f")
        cpu = _each_run(r["repeats"], "cpu_s_per_rank_step", ".0f", scale=1e3)
        steal = _each_run(r["repeats"], "steal_share", ".0%")
        print(
          f"  {name} {r['name']}: {r['steps']} steps in {len(r['repeats'])} runs, s/step {each} "
          f"(CPU/rank {cpu} ms/step; steal {steal})"
        )
  verdicts = []
  for name, (_, _, rows) in profile_rows.items():
    ok = {r["name"]: r for r in rows if "error" not in r}
    if not ok:
      continue
    hvd_eff = f"{ok['horovod']['efficiency']:.1%}" if "horovod" in ok else "not run"
    target = TARGETS[name]
    light = [r for r in ok.values() if r["name"] != "horovod"]
    if light:
      best = max(light, key=lambda r: r["efficiency"])
      verdicts.append(
        f"{_common.verdict(best['efficiency'] >= target)}: {name} LightCC's best configuration "
        f"{best['name']} {best['efficiency']:.1%} (target >= {target:.0%}); Horovod {hvd_eff}"
      )
    fused = [r for r in ok.values() if r["fusion"]]
    if fused and "horovod" in ok:
      x = max(r["images_per_s"] for r in fused) / ok["horovod"]["images_per_s"]
      verdicts.append(
        f"{_common.verdict(x >= FUSION_TARGET)}: {name} best fusion config = {x:.2f}x Horovod "
        f"(target >= {FUSION_TARGET}x)"
      )
    for r in fused:  # against the same configuration in fixed buckets (LIGHT_BUCKET_MB)
      base = r["name"].replace("+fusion", "")
      fixed = [x for n, x in ok.items() if n.partition("@")[0] == base and base != "fusion"]
      if fixed:
        best = max(fixed, key=lambda x: x["images_per_s"])
        x = r["images_per_s"] / best["images_per_s"]
        pooled = ""
        if "repeats" in r and "repeats" in best:
          paired, error = speed_ratio_with_error(
            *([run.get("step_s") for run in row["repeats"]] for row in (r, best))
          )
          x = x if math.isnan(paired) else paired  # no round where both ran: the pooled ratio
          pooled = (
            f", means of {r['steps']} steps in {len(r['repeats'])} interleaved rounds; "
            f"+-{error:.3f} (1 s.e., runs paired by round)"
          )
          if abs(x - FIXED_TARGET) < 2 * error:
            pooled += ": within 2 s.e. of the target, so the runs cannot tell"
        verdicts.append(
          f"{_common.verdict(x >= FIXED_TARGET)}: {name} {r['name']} = {x:.3f}x the best of "
          f"{len(fixed)} fixed bucket sizes, {best['env'].get('LIGHT_BUCKET_MB')} MiB "
          f"({best['name']}; target >= {FIXED_TARGET}x{pooled})"
        )
  print("\n" + "\n".join(verdicts))
  return verdicts


def _each_run(repeats, key, spec, scale=1):
  """One figure of each of a configuration's runs, " / "-joined; "failed" for a failed run."""
  return " / ".join(
    format(run[key] * scale, spec) if "error" not in run else "failed" for run in repeats
  )


def _optional(value, spec):
  """value formatted, or blanks of the same width when it was not measured."""
  width = int(spec.rstrip("f%").partition(".")[0])
  return " " * width if value is None else format(value, spec)


def draw_efficiency(profile_rows, args, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(profile_rows), figsize=(6.5 * len(profile_rows), 4.8))
  axes = [axes] if len(profile_rows) == 1 else list(axes)
  for ax, (name, (plan, _, rows)) in zip(axes, profile_rows.items()):
    ok = [r for r in rows if "error" not in r]
    x = range(len(ok))
    colors = ["tab:gray" if r["name"] == "horovod" else "tab:blue" for r in ok]
    bars = ax.bar(x, [100 * r["efficiency"] for r in ok], color=colors)
    for b, r in zip(bars, ok):
      ax.annotate(
        f"{r['efficiency']:.0%}",
        (b.get_x() + b.get_width() / 2, b.get_height()),
        ha="center",
        va="bottom",
        fontsize=8,
      )
    ax.axhline(100 * TARGETS[name], color="red", ls="--", label=f"target {TARGETS[name]:.0%}")
    ax.set_xticks(list(x), [label(r["name"]) for r in ok], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("scaling efficiency %")
    ax.set_title(
      f"{name}: 1/{plan['shrink']} size, compute {plan['step_s']:.2f} s/step", fontsize=10
    )
    ax.legend(fontsize=8)
  fig.suptitle(
    f"Scaling efficiency, {lightcc_cluster.NODES} nodes x {lightcc_cluster.RANKS_PER_NODE} ranks, "
    f"link {args.rate}, seed link {args.seed_link}, emulated GPU compute",
    fontsize=11,
  )
  _common.save_figure(fig, plt, path, dpi=100)


def draw_timeline(rows, plan, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(len(rows), 1, figsize=(11, 3.2 * len(rows)), squeeze=False)
  unit_of = {v: n for n, u in enumerate(plan["units"]) for v in u["variables"]}
  for ax, r in zip(axes[:, 0], rows):
    tl = r["timeline_run"]
    for kind, _unit, s, e in tl["spans"]:
      y = 1 if kind == "forward" else 0
      ax.barh(
        y,
        e - s,
        left=s,
        height=0.8,
        color="tab:green" if y else "tab:orange",
        edgecolor="k",
        linewidth=0.3,
      )
    ready = {}
    for kind, unit, _, e in tl["spans"]:
      if kind == "backward":
        ready[unit] = e
    marks = sorted(tl["marks"], key=lambda m: -unit_of[m[0]])
    for row, (var, t) in enumerate(marks):
      unit = unit_of[var]
      start = ready.get(unit, min((e for u, e in ready.items() if u > unit), default=0.0))
      y = -1 - row * 4.0 / max(1, len(marks))
      ax.plot([start, t], [y, y], color="tab:blue", lw=0.8)
      ax.plot([t], [y], "|", color="tab:red", ms=3)
    work = [c for c in tl.get("collectives") or [] if not c[1].startswith("NEGOTIATE")]
    for _, _, s, e in work:
      ax.barh(-6, e - s, left=s, height=0.8, color="tab:gray", edgecolor="k", linewidth=0.3)
    ax.set_yticks(
      [1, 0, -3, -6],
      ["forward", "backward", "gradients:\nready→reduced", "collectives\n(Horovod timeline)"],
    )
    ax.set_xlim(0, tl["end"] - tl["begin"])
    ax.set_xlabel("s from the step's start (rank 0)")
    ax.set_title(
      f"{label(r['name'])}: step {tl['end'] - tl['begin']:.3f} s with Horovod's timeline on "
      f"({r['step_s']:.3f} s timed without)",
      fontsize=10,
    )
  fig.suptitle(f"One step of {plan['profile']} (backprop order top to bottom)", fontsize=11)
  _common.save_figure(fig, plt, path, dpi=100)


def parse_args(argv):
  p = _common.argument_parser(__doc__)
  p.add_argument("--profiles", default="vgg16,resnet50", help="comma-separated: vgg16, resnet50")
  p.add_argument("--configs", default=",".join(CONFIG_NAMES), help=f"subset of {CONFIG_NAMES}")
  p.add_argument("--ranks-per-node", type=int, default=2)
  p.add_argument(
    "--rate", default="1gbit", help=f"tc tbf rate of the inter-node link, or {UNCAPPED}"
  )
  p.add_argument(
    "--scale-rate",
    default="1gbit",
    help=f"with --rate {UNCAPPED}: the rate the emulated compute is scaled to",
  )
  p.add_argument(
    "--seed-link",
    default="25gbit",
    help="the seed cluster's inter-node link, which sets the compute/link ratio (25gbit: the "
    "seed's VPC; 1gbit: the same GPUs on an ordinary 1 Gbit/s network)",
  )
  lightcc_cluster.add_steal_options(p)
  p.add_argument("--burst", default="512kb")
  p.add_argument("--latency", default="20ms")
  p.add_argument("--shrink", type=int, default=16, help="gradient sizes divided by this")
  p.add_argument(
    "--warmup",
    type=int,
    default=16,
    help="warm-up steps; fusion configurations first probe their sizes (3 sizes x 5 rounds, "
    "as many again for sizes that end close: 30 steps at most)",
  )
  p.add_argument(
    "--fusion-rounds",
    type=int,
    default=5,
    help="LIGHT_FUSION_PROBE_STEPS of the fusion configurations (LightCC's default, 5)",
  )
  p.add_argument("--steps", type=int, default=12, help="measured steps per run")
  p.add_argument(
    "--repeats",
    type=int,
    default=3,
    help="runs of each swept fusion configuration and of its fixed sizes, interleaved; their "
    "step times pool all their steps (on 2 shared cores one run moved by 1-2%% from the next, "
    "6%% with Horovod's timeline on: as much as the 0.97x target leaves)",
  )
  p.add_argument("--inter-op-threads", type=int, default=4)
  p.add_argument(
    "--clock",
    choices=("stream", "launch"),
    default="stream",
    help="emulated compute: spans back to back as kernels launched ahead on a GPU stream "
    "(stream), or each starting no earlier than the CPU launched it (launch)",
  )
  p.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
  p.add_argument(
    "--fixed-sweep",
    action=argparse.BooleanOptionalAction,
    default=True,
    help=f"also run {', '.join(SWEPT_CONFIGS)} (when selected) in fixed buckets of each fusion "
    "candidate size, for the fusion-against-best-fixed verdict",
  )
  p.add_argument(
    "--quick",
    action="store_true",
    help=f"VGG16 only, shrink 32, configs {','.join(QUICK_CONFIGS)}, 10 warm-up + 3 steps, "
    "fusion probed in 3 rounds, no fixed sweep (2-4 min)",
  )
  p.add_argument("--png", default=_common.chart_path("lightcc_scaling.png"))
  p.add_argument("--timeline-png", help="default: beside --png, named <its name>_timeline.png")
  _common.add_json(p)
  p.add_argument("--workdir", help="rank logs and results (default: a temporary folder)")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--spec", help=argparse.SUPPRESS)
  p.add_argument("--result-dir", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.quick:
    args.profiles, args.shrink, args.warmup, args.steps = "vgg16", 32, 10, 3
    args.fusion_rounds = 3
    args.fixed_sweep, args.repeats = False, 1
    if args.configs == ",".join(CONFIG_NAMES):
      args.configs = ",".join(QUICK_CONFIGS)
  if args.fusion_rounds < 2:
    p.error("--fusion-rounds must be at least 2 (the first round is not counted)")
  _common.require_positive(p, args, ["repeats", "steps"])
  lightcc_cluster.check_steal_options(p, args)
  args.profiles = [x for x in args.profiles.split(",") if x]
  args.configs = [x for x in args.configs.split(",") if x]
  bad = [x for x in args.profiles if x not in PROFILES] + [
    x for x in args.configs if x.partition("@")[0] not in CONFIG_NAMES
  ]
  if bad:
    p.error(f"unknown profile(s)/config(s) {bad}")
  args.timeline_png = args.timeline_png or os.path.splitext(args.png)[0] + "_timeline.png"
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    return worker(args)
  wall = time.perf_counter()
  tf, tf_ext, np, results = lightcc_cluster.start_driver(
    REQUIRED_MODULES, "lightcc_scaling.py", "bench-scaling"
  )
  lightcc_cluster.RANKS_PER_NODE = args.ranks_per_node
  lightcc_cluster.WORLD = lightcc_cluster.NODES * args.ranks_per_node
  uncapped = args.rate == UNCAPPED
  rate_bps = lightcc_cluster.rate_to_bps(args.scale_rate if uncapped else args.rate)
  seed_link_bps = lightcc_cluster.rate_to_bps(args.seed_link)
  workdir = args.workdir or tempfile.mkdtemp(prefix="lcc_scaling_")
  os.makedirs(workdir, exist_ok=True)

  def on_signal(signum, _frame):
    raise SystemExit(f"interrupted by signal {signum}")

  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGHUP, on_signal)
  cluster = lightcc_cluster.Cluster(None if uncapped else args.rate, args.burst, args.latency)
  atexit.register(cluster.close)
  profile_rows, disturbed = {}, []
  try:
    cluster.setup()
    print(f"cluster      :\n{cluster.describe()}", flush=True)
    for name in args.profiles:
      units, shapes = model_profile(name)
      plan = emulated_plan(
        name, units, shapes, args.shrink, rate_bps, seed_link_bps, args.fusion_rounds
      )
      print(
        f"\n{name}: {plan['params']:,} parameters in {len(shapes)} tensors, {len(units)} units; "
        f"seed step {plan['seed_step_s']:.3f} s ({PROFILES[name]['source']}), seed link lower "
        f"bound {plan['seed_link_s']:.3f} s at {args.seed_link} -> compute/link "
        f"{plan['ratio']:.2f}; emulated: "
        f"1/{args.shrink} size, S = {plan['bytes'] / 1e6:.1f} MB, "
        f"{args.scale_rate + ' (link uncapped)' if uncapped else args.rate} -> compute "
        f"{plan['step_s']:.3f} s/step",
        flush=True,
      )
      spec = {
        "plan": plan,
        "warmup": args.warmup,
        "fusion_warmup": fusion_warmup(args.warmup, plan),
        "steps": args.steps,
        "inter_op_threads": args.inter_op_threads,
        "clock": args.clock,
        "world": 1,
      }
      pdir = os.path.join(workdir, name)
      os.makedirs(pdir, exist_ok=True)
      single_spec = os.path.join(pdir, "spec1.json")
      with open(single_spec, "w") as f:
        json.dump(spec, f)
      t = time.perf_counter()
      single, failure = run_single(single_spec, os.path.join(pdir, "single"), args.timeout)
      if failure:
        sys.exit(f"one-rank baseline failed: {failure['error']}\n{failure['logs']}")
      single_step = single[0]["elapsed_s"] / single[0]["steps"]
      single_cpu = single[0]["cpu_s"] / single[0]["steps"]
      single_steal = lightcc_cluster.steal_share(single[0]["counters"])
      print(
        f"  1 rank: {single_step:.3f} s/step, CPU {single_cpu * 1e3:.0f} ms/step, steal "
        f"{single_steal:.0%} ({time.perf_counter() - t:.0f}s)",
        flush=True,
      )
      spec["world"] = lightcc_cluster.WORLD
      spec_path = os.path.join(pdir, "spec.json")
      with open(spec_path, "w") as f:
        json.dump(spec, f)
      listed, order = run_order(args.configs, plan, args.fixed_sweep, args.repeats)
      runs = {config: [] for config in listed}
      for config in order:
        repeat, runs_of = len(runs[config]), order.count(config)
        result_dir = config_dir(pdir, config) + (f"_r{repeat + 1}" if runs_of > 1 else "")
        shown = f"{config} (run {repeat + 1}/{runs_of})" if runs_of > 1 else config
        row, runs_disturbed = run_undisturbed(
          cluster, config, spec_path, result_dir, plan, args, single_step, shown
        )
        runs[config].append(row)
        disturbed.extend(dict(r, profile=name) for r in runs_disturbed)
      rows = [pool_repeats(runs[config]) for config in listed]
      timeline_spec = os.path.join(pdir, "spec_timeline.json")
      with open(timeline_spec, "w") as f:
        json.dump(dict(spec, steps=1), f)
      for row in charted(rows):
        add_timeline(row, cluster, timeline_spec, pdir, plan, args)
      profile_rows[name] = (plan, single_step, rows)
  finally:
    cluster.close()
  if disturbed:
    print(
      f"disturbed     : {len(disturbed)} run(s) ran again, the host's steal over "
      f"--max-steal {args.max_steal:.0%}: "
      + ", ".join(
        f"{r['profile']} {r['name']} {r['step_s']:.3f} s ({r['steal_share']:.0%})"
        for r in disturbed
      )
    )
  results["disturbed_runs"] = disturbed
  results["verdicts"] = report(profile_rows, args)
  results["profiles"] = {
    name: {
      "plan": {k: v for k, v in plan.items() if k not in ("units", "shapes")},
      "single_step_s": single,
      "rows": rows,
    }
    for name, (plan, single, rows) in profile_rows.items()
  }
  results["setup"] = {
    "nodes": lightcc_cluster.NODES,
    "ranks_per_node": args.ranks_per_node,
    "rate": args.rate,
    "scale_rate": args.scale_rate if uncapped else args.rate,
    "seed_link": args.seed_link,
    "warmup": args.warmup,
    "steps": args.steps,
    "repeats": args.repeats,
    "clock": args.clock,
  }
  _common.write_chart(args.png, results, lambda p: draw_efficiency(profile_rows, args, p))
  first = next(iter(profile_rows.items()), None)
  if first:
    name, (plan, _, rows) = first
    shown = [r for r in charted(rows) if "timeline_run" in r]
    if shown:
      _common.write_chart(args.timeline_png, {}, lambda p: draw_timeline(shown, plan, p))
  return _common.finish(results, args.json, wall)


if __name__ == "__main__":
  sys.exit(main())

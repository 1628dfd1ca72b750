"""The rank program of lightcc_scaling.py (`lightcc_scaling.py --worker`): the emulated compute's
step under LightCC's or Horovod's DistributedGradientTape (or alone, the one-rank baseline), timed
between two barriers, then one more step that records when each reduced gradient was there (with
Horovod's timeline in a timeline run); written to the result folder."""

import json
import os
import time

import _horovod_cluster
from _common import peak_rss_bytes
from _emulated_compute import DeviceClock, build_step


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
  before = _horovod_cluster.read_counters()

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
  after = _horovod_cluster.read_counters()
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
    "peak_rss": peak_rss_bytes(),
  }
  with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
  barrier()

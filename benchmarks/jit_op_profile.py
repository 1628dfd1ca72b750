"""Where a training step's time goes, XLA's code against TensorFlow's own kernels, op by op.

For the workloads of benchmarks/jit_cache.py at fixed shapes (no padding, no recompilation: the
most XLA can give), one process times the same step both ways and traces it with TensorFlow's
profiler (XLA_FLAGS=--xla_cpu_enable_xprof_traceme: one event per XLA op), in interleaved rounds,
and splits the op time between the matrix products (TensorFlow's oneDNN MatMul kernels; XLA's dot
ops) and the other ops. It prints each, and the best mix any compilation could make of the two:
TensorFlow's step with each part at the faster of its two times; and it times the mix TensorFlow
can build (jit_scope around every op but the matrix products: XLA clusters between them). Where
the best mix is not 1.3x TensorFlow's kernels, no configuration that compiles with this XLA
reaches jit_cache.py's "1.3x the best TF option" target at that shape, whatever its cache does
(padding and compiling only add to it).
"""

import collections
import functools
import glob
import os
import shutil
import sys
import tempfile
import time

import _common
import _report

FLAG = "--xla_cpu_enable_xprof_traceme=true"
SHAPES = {"A": "512,256,64", "B": "128x200,128x60,128x20"}
PARTS = ("matrix products", "other ops")
TF_MATRIX_PRODUCTS = ("MatMul", "_MklMatMul", "_MklNativeFusedMatMul", "BatchMatMulV2")


def parse_shapes(workload, text):
  shapes = []
  for item in text.split(","):
    parts = item.split("x")
    dims = tuple(int(v) for v in parts if v.isdigit())
    if len(dims) != len(parts) or len(dims) != (1 if workload == "A" else 2) or min(dims) < 1:
      raise ValueError(f"workload {workload}: bad shape {item!r} (A: N, B: NxL)")
    shapes.append(dims)
  return shapes


def op_times(logdir, steps, kind):
  """{"matrix products": us, "other ops": us} per step from the trace in `logdir`: for kind "tf"
  TensorFlow's kernels ("name:Type" events of its executor threads; not ExecutorState::Process,
  which holds a thread's ops), for "xla" XLA's ops (events of its host executor)."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2

  path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
  space = xplane_pb2.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  out = collections.Counter()
  for plane in space.planes:
    names = {k: v.name for k, v in plane.event_metadata.items()}
    for line in plane.lines:
      for event in line.events:
        name = names.get(event.metadata_id, "")
        on_executor = line.name.startswith("tf_Compute") and ":" in name and "::" not in name
        if kind == "tf" and on_executor:
          part = "matrix products" if name.rsplit(":", 1)[1] in TF_MATRIX_PRODUCTS else "other ops"
        elif kind == "xla" and line.name.startswith("host_executor"):
          part = "matrix products" if name.startswith("dot") else "other ops"
        else:
          continue
        out[part] += event.duration_ps / 1e6 / steps
  return out


def profile(workload, shape, steps, rounds, tf, np, jit_cache):
  """{"tf"/"xla"/"mix": {"wall_us": median untraced step, "parts": median op time per part (not
  for the mix)}} over `rounds` rounds of `steps` timed and `steps` traced steps of each."""
  owner, per_example = jit_cache.build(workload, tf)
  data = jit_cache.make_data(workload, shape, np.random.default_rng(0))
  n = shape[0]
  masks = dict(
    row_mask=tf.ones([n], tf.bool), seq_mask=tf.ones([shape[-1]], tf.bool), count=tf.constant(n)
  )
  runs = {}
  for kind in ("tf", "xla", "mix"):
    train_step = jit_cache.make_train_step(owner, per_example, tf)  # an optimizer of its own
    if kind == "mix":  # XLA clusters around everything but the matrix products
      runs[kind] = tf.function(functools.partial(in_jit_scope_without_matmuls, train_step, tf))
    else:
      runs[kind] = tf.function(train_step, jit_compile=kind == "xla")
    for _ in range(5):
      float(runs[kind](*data, **masks))
  walls = {kind: [] for kind in runs}
  traced = {kind: [] for kind in runs}
  for _ in range(rounds):  # interleaved: this machine's speed drifts
    for kind, step in runs.items():
      for _ in range(steps):
        t0 = time.perf_counter()
        float(step(*data, **masks))
        walls[kind].append(time.perf_counter() - t0)
      if kind == "mix":  # timed only: its op time is TensorFlow's and XLA's above
        continue
      logdir = tempfile.mkdtemp(prefix=f"tf_ext_op_profile_{kind}_")
      tf.profiler.experimental.start(logdir)
      for _ in range(steps):
        float(step(*data, **masks))
      tf.profiler.experimental.stop()
      traced[kind].append(op_times(logdir, steps, kind))
      shutil.rmtree(logdir, ignore_errors=True)
  return {
    kind: {
      "wall_us": 1e6 * float(np.median(walls[kind])),
      "parts": {p: float(np.median([t[p] for t in traced[kind]])) for p in PARTS if traced[kind]},
    }
    for kind in runs
  }


def in_jit_scope_without_matmuls(train_step, tf, *args, **kwargs):
  """`train_step` with every op but the matrix products (gradients too) marked for XLA: TensorFlow
  clusters the marked ops between the products, which its oneDNN kernels run."""
  keep_out = {"MatMul", "BatchMatMulV2"}
  scope = tf.xla.experimental.jit_scope(
    compile_ops=lambda node_def: node_def.op not in keep_out, separate_compiled_gradients=False
  )
  with scope:
    return train_step(*args, **kwargs)


def report(workload, shape, results):
  """Prints the table; returns the best mix's speed-up over TensorFlow's kernels: TensorFlow's
  step scaled by the share of its op time left when each part runs at the faster of its two
  times (its ops overlap on the threads, so their time can exceed the step's)."""
  label = "x".join(str(v) for v in shape)
  print(f"\nWorkload {workload}, shape {label}: microseconds per step")
  print(f"  {'':<24}{'TF kernels':>12}{'XLA':>10}{'XLA/TF':>9}")
  kinds = ("tf", "xla")
  rows = [(part, [results[k]["parts"][part] for k in kinds]) for part in PARTS]
  walls = [results[k]["wall_us"] for k in kinds]
  for part, (a, b) in [*rows, ("whole step (untraced)", walls)]:
    ratio = f"{b / a:>8.2f}x" if a > 0 else f"{'':>9}"
    print(f"  {part:<24}{a:>12.0f}{b:>10.0f}{ratio}")
  kept = sum(min(a, b) for _, (a, b) in rows) / max(sum(a for _, (a, _) in rows), 1e-9)
  best = round(1.0 / kept, 2)  # as printed
  verdict = "reaches" if best >= 1.3 else "short of"
  mix = walls[0] / results["mix"]["wall_us"]
  print(f"  speed-up over TF kernels' step: XLA alone {walls[0] / walls[1]:.2f}x; XLA clusters")
  print(f"  between the matrix products (jit_scope) {mix:.2f}x; the best mix {best:.2f}x", end="")
  print(f" ({verdict} 1.3x)")
  return best


def main():
  p = _common.argument_parser(__doc__)
  p.add_argument("--workloads", default="A,B", help="comma-separated, of A and B")
  p.add_argument("--shapes-a", default=SHAPES["A"], help="workload A's batch sizes")
  p.add_argument("--shapes-b", default=SHAPES["B"], help="workload B's batch x sequence length")
  p.add_argument("--steps", type=int, default=20, help="steps timed, then traced, per round")
  p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (medians)")
  args = p.parse_args()
  _common.require_positive(p, args, ["steps", "rounds"])
  workloads = args.workloads.split(",")
  if not workloads or not set(workloads) <= {"A", "B"}:
    p.error("--workloads: a comma-separated list of A and B")
  try:
    shapes = {w: parse_shapes(w, getattr(args, f"shapes_{w.lower()}")) for w in workloads}
  except ValueError as e:
    p.error(str(e))
  if FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()
  _common.use_checkout()
  import jit_cache
  import numpy as np
  import tensorflow as tf

  import tf_ext

  _report.machine_report(tf, tf_ext, np)
  for workload in workloads:
    for shape in shapes[workload]:
      report(workload, shape, profile(workload, shape, args.steps, args.rounds, tf, np, jit_cache))
  return 0


if __name__ == "__main__":
  sys.exit(main())

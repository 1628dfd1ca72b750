"""XLA on inputs whose shapes keep changing: tf_ext.jit.function against TensorFlow's options.

Two training workloads, each a whole run with its compile time included:
  A  an MLP trained on a stream of batches of (at least 50) different sizes;
  B  a DIN-style model: behaviour sequences of length 1-200 pooled by attention over the
     sequence, then an MLP, on batches of varying size (the last partial batch of each pass,
     dynamic batching) and varying sequence length.
Configurations, each in its own process (auto-jit is process-global): plain TF (no XLA),
tf.function(jit_compile=True), auto-jit (tf.config.optimizer.set_jit with
--tf_xla_cpu_global_jit: CPU clusters are only compiled with it), auto-jit with
--tf_xla_async_compilation=true, tf_ext.jit.function ("ours"), and a static-shape XLA run (every
batch padded to the largest shape, one executable). XLA compilations are counted from
TensorFlow's log (TF_CPP_VMODULE=device_compiler=1: one line per compiled executable) and, for
ours, from its own compile log too. Every configuration computes the same masked loss, so they
train the same model.

Targets: ours >= 2.25x jit_compile=True and >= 1.3x the best TF option over the
whole run; ours' steady-state time per sample (the last 40% of the run; for jit_compile=True its
steps that did not compile) within 1.1x of jit_compile=True's; ours faster than static shapes;
<= 8 compilations per workload. `--rounds N` runs every configuration but jit_compile=True N
times, interleaved, and reports each one's median run. `--quick` runs a short stream with few
distinct shapes (and TF_EXT_JIT_MIN_OBSERVATIONS=8): a smoke run of every configuration, not a
measurement.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import types

import _common
import _report

WIDTHS = tuple(
  int(w) for w in os.environ.get("JIT_BENCH_WIDTHS", "128,128,128,64,64,32").split(",")
)
CONFIGS = ["plain", "jit_compile", "autojit", "autojit_async", "ours", "static"]
TF_CONFIGS = ["plain", "jit_compile", "autojit", "autojit_async"]
COMPILE_LINE = re.compile(r"Compilation of XLA executable time")
WORKLOAD_END = "=== tf_ext jit_cache: workload done ===\n"


# ------------------------------------------------------------------------------------------------
# The workloads (run in a worker process).


def stream(workload, steps, quick=False, seed=0):
  """The batches' shapes: [(batch,)] for A, [(batch, max_length)] for B. `quick`: fewer
  distinct shapes (the same ranges), so that jit_compile=True's run stays short."""
  import numpy as np

  rng = np.random.default_rng(seed)
  if workload == "A":
    # Dynamic batching of a request stream: any size from 8 to 512.
    if quick:
      return [(int(n),) for n in rng.choice(np.linspace(8, 512, 4).astype(int), size=steps)]
    # Multiples of 4 (127 sizes): enough to show the cost of a compile per shape without
    # jit_compile=True's run taking an hour.
    return [(int(n),) for n in 4 * rng.integers(2, 129, size=steps)]
  out = []
  for _ in range(steps):
    # Mostly full batches of 128 with the partial batches that dynamic batching and the end of
    # each pass make; sequences grouped by length, the longest of a batch 1-200 (long-tailed).
    batch = 128 if rng.random() < 0.7 else int(rng.integers(1, 129))
    length = int(min(200, max(1, rng.gamma(2.0, 30.0))))
    if quick:
      batch = 128 if batch == 128 else 64
      length = int(rng.choice([20, 200]))
    else:  # partial batches in multiples of 8, lengths of 4 (jit_compile=True's run time)
      batch = min(128, 8 * int(math.ceil(batch / 8)))
      length = min(200, 4 * int(math.ceil(length / 4)))
    out.append((batch, length))
  return out


MAX_SHAPE = {"A": (512,), "B": (128, 200)}


def make_data(workload, shape, rng):
  import numpy as np

  if workload == "A":
    (n,) = shape
    x = rng.normal(size=(n, 64)).astype("float32")
    y = (rng.random(size=(n, 1)) < 0.3).astype("float32")
    return (x, y)
  n, length = shape
  lengths = rng.integers(1, length + 1, size=n).astype("int32")
  lengths[0] = length
  history = rng.integers(1, 20000, size=(n, length)).astype("int32")
  history = np.where(np.arange(length)[None, :] < lengths[:, None], history, 0).astype("int32")
  target = rng.integers(1, 20000, size=(n,)).astype("int32")
  user = rng.normal(size=(n, 16)).astype("float32")
  y = (rng.random(size=(n, 1)) < 0.3).astype("float32")
  return (history, lengths, target, user, y)


def build(workload, tf):
  """(variables owner, loss(inputs..., row_mask, seq_mask) -> per-example losses)."""
  tf.keras.utils.set_random_seed(0)
  layers = tf.keras.layers
  if workload == "A":
    # A ranking tower: six narrow layers with layer normalization (many small ops per step,
    # forward, backward and Adam: what XLA's fusion removes).
    hidden = []
    for width in WIDTHS:
      hidden += [layers.Dense(width, activation="gelu"), layers.LayerNormalization()]
    net = tf.keras.Sequential(hidden + [layers.Dense(1)])
    net.build((None, 64))

    def per_example(x, y, row_mask, seq_mask):
      logits = net(x)
      return tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)

    return net, per_example

  # Item embeddings trained elsewhere (e.g. in tf_ext's dynamic embedding tables, outside
  # XLA): a frozen table here. Training it inside the step would put a 25600-row scatter into
  # each step, which XLA on CPU runs serially (about 10x slower than TensorFlow's kernel).
  embed = layers.Embedding(20000, 32, trainable=False)
  attention = tf.keras.Sequential([layers.Dense(64, activation="sigmoid"), layers.Dense(1)])
  head = tf.keras.Sequential(
    [layers.Dense(128, activation="relu"), layers.Dense(64, activation="relu"), layers.Dense(1)]
  )

  def per_example(history, lengths, target, user, y, row_mask, seq_mask):
    seq = embed(history)  # [B, L, 32]
    item = embed(target)  # [B, 32]
    tiled = tf.broadcast_to(item[:, None, :], tf.shape(seq))
    scores = tf.squeeze(attention(tf.concat([seq, tiled, seq - tiled, seq * tiled], -1)), -1)
    valid = tf.sequence_mask(lengths, tf.shape(history)[1]) & seq_mask[None, :]
    weights = tf.where(valid, tf.nn.sigmoid(scores), 0.0)  # DIN: unnormalized attention
    pooled = tf.reduce_sum(weights[..., None] * seq, 1)
    logits = head(tf.concat([pooled, item, user], -1))
    return tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)

  # Build the layers eagerly (shapes as in a step).
  per_example(
    tf.zeros([1, 1], tf.int32),
    tf.ones([1], tf.int32),
    tf.zeros([1], tf.int32),
    tf.zeros([1, 16]),
    tf.zeros([1, 1]),
    tf.ones([1], tf.bool),
    tf.ones([1], tf.bool),
  )
  owner = types.SimpleNamespace(
    trainable_variables=attention.trainable_weights + head.trainable_weights
  )
  return owner, per_example


def make_train_step(owner, per_example, tf):
  """A training step of `build`'s model with an Adam of its own: the masked mean loss over the
  real rows, then one update; returns the loss."""
  optimizer = tf.keras.optimizers.Adam(1e-3)
  variables = owner.trainable_variables
  optimizer.build(variables)

  def train_step(*inputs, row_mask, seq_mask, count):
    with tf.GradientTape() as tape:
      losses = per_example(*inputs, row_mask, seq_mask)
      loss = tf.reduce_sum(tf.where(row_mask, losses, 0.0)) / tf.cast(count, tf.float32)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return loss

  return train_step


def worker(workload, config, steps, quick):
  import numpy as np
  import tensorflow as tf

  import tf_ext.jit as jit

  if config.startswith("autojit"):
    tf.config.optimizer.set_jit(True)
  owner, per_example = build(workload, tf)
  train_step = make_train_step(owner, per_example, tf)

  if config == "ours" and workload == "A":

    def step_a(x, y):
      ones = tf.ones([1], tf.bool)
      return train_step(x, y, row_mask=jit.mask("batch"), seq_mask=ones, count=jit.size())

    step = jit.function(step_a, paddable={"x": "batch", "y": "batch"}, name="train_A")
  elif config == "ours":

    def step_b(history, lengths, target, user, y):
      row_mask, seq_mask = jit.mask("batch"), jit.mask("seq")
      inputs = (history, lengths, target, user, y)
      return train_step(*inputs, row_mask=row_mask, seq_mask=seq_mask, count=jit.size())

    paddable = {"history": {0: "batch", 1: "seq"}, "lengths": "batch", "target": "batch"}
    paddable.update(user="batch", y="batch")
    step = jit.function(step_b, paddable=paddable, name="train_B")
  elif config == "static":
    compiled = tf.function(train_step, jit_compile=True, reduce_retracing=True)
    top = MAX_SHAPE[workload]

    def step(*inputs):
      n = inputs[0].shape[0]
      padded = []
      for value in inputs:
        pads = [[0, 0] for _ in value.shape]
        pads[0][1] = top[0] - n
        if workload == "B" and value.ndim == 2 and value.dtype == np.int32:
          pads[1][1] = top[1] - value.shape[1]  # the history
        padded.append(np.pad(value, pads))
      row_mask = np.arange(top[0]) < n
      seq_mask = np.arange(top[-1]) < (inputs[0].shape[1] if workload == "B" else 0)
      count = tf.constant(n, tf.int32)
      return compiled(*padded, row_mask=row_mask, seq_mask=seq_mask, count=count)
  else:
    jit_compile = True if config == "jit_compile" else None
    function = tf.function(train_step, jit_compile=jit_compile, reduce_retracing=True)

    def step(*inputs):
      n = inputs[0].shape[0]
      count = tf.constant(n, tf.int32)
      return function(
        *inputs, row_mask=tf.ones([n], tf.bool), seq_mask=tf.ones([1], tf.bool), count=count
      )

  shapes = stream(workload, steps, quick)
  rng = np.random.default_rng(1)
  batches = [make_data(workload, shape, rng) for shape in shapes]
  times, losses = [], []
  start = time.perf_counter()
  for inputs in batches:
    t0 = time.perf_counter()
    losses.append(float(step(*inputs)))
    times.append(time.perf_counter() - t0)
  total = time.perf_counter() - start
  result = {
    "workload": workload,
    "config": config,
    "shapes": shapes,
    "times": times,
    "total_s": total,
    "final_loss": float(np.mean(losses[-20:])),
  }
  if config == "ours":
    step.wait_for_compiles()
    result["ours_compiles"] = step.compiles
    result["ours_events"] = [
      {k: v for k, v in e.items() if k not in ("dims", "boundaries")} for e in step.events
    ]
    result["start_time"] = start + (time.time() - time.perf_counter())
    result["stats"] = dict(step.stats)
    result["plan"] = {",".join(k): [list(b) for b in v] for k, v in step.plan().items()}
    step.close()
  print("RESULT " + json.dumps(result), flush=True)
  sys.stderr.write(WORKLOAD_END)
  sys.stderr.flush()


# ------------------------------------------------------------------------------------------------
# The driver.


def run_config(config, steps, quick):
  """Runs `config` on each workload of `steps` ({workload: steps}) in one fresh process;
  {workload: result}."""
  env = dict(os.environ)
  env["TF_CPP_MIN_LOG_LEVEL"] = "0"
  env["TF_CPP_VMODULE"] = "device_compiler=1"
  flags = env.get("TF_XLA_FLAGS", "")
  if config.startswith("autojit"):
    flags += " --tf_xla_cpu_global_jit"
  if config == "autojit_async":
    flags += " --tf_xla_async_compilation=true"
  env["TF_XLA_FLAGS"] = flags.strip()
  if quick:  # plan after 8 calls, not 32: the quick runs are short
    env.setdefault("TF_EXT_JIT_MIN_OBSERVATIONS", "8")
  plan = ",".join(f"{w}:{n}" for w, n in steps.items())
  command = [sys.executable, os.path.abspath(__file__), "--worker", plan, config]
  command += ["quick"] if quick else []
  _common.log(f"{config}: workloads {plan} (steps)")
  done = subprocess.run(command, env=env, capture_output=True, text=True)
  lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
  logs = done.stderr.split(WORKLOAD_END)
  out = {}
  for index, workload in enumerate(steps):
    if index >= len(lines):
      tail = [x for x in done.stderr.splitlines() if "device_compiler.h" not in x][-3:]
      _common.log(f"  {workload}: FAILED (exit {done.returncode}): " + " | ".join(tail))
      out[workload] = {"workload": workload, "config": config, "failed": done.returncode}
      continue
    result = json.loads(lines[index][len("RESULT ") :])
    result["xla_compiles"] = len(COMPILE_LINE.findall(logs[index]))
    _common.log(
      f"  {workload}: {result['total_s']:.1f} s, {result['xla_compiles']} XLA executables compiled"
    )
    out[workload] = result
  return out


def median_rounds(configs, steps, quick, rounds):
  """{config: {workload: result}}: each configuration's run of median total time over `rounds`
  interleaved rounds (jit_compile=True, ten minutes a run, runs once); the spread is logged."""
  runs = {c: [] for c in configs}
  for round_index in range(rounds):
    if rounds > 1:
      _common.log(f"round {round_index + 1}/{rounds}")
    for config in configs:
      if round_index == 0 or config != "jit_compile":
        runs[config].append(run_config(config, steps, quick))
  chosen = {}
  for config, results in runs.items():
    chosen[config] = {}
    for workload in steps:
      done = [r[workload] for r in results if "failed" not in r[workload]]
      if not done:
        chosen[config][workload] = results[0][workload]
        continue
      done.sort(key=lambda r: r["total_s"])
      chosen[config][workload] = done[(len(done) - 1) // 2]
      if len(done) > 1:
        spread = ", ".join(f"{r['total_s']:.1f}" for r in done)
        _common.log(f"  {config} {workload}: runs of {spread} s; the median one is reported")
  return chosen


def steady_per_sample(result):
  """Seconds per sample over the last 40% of the run; for jit_compile=True (and the other TF
  options) only steps whose shape was seen before (no compilation in them)."""
  shapes, times = result["shapes"], result["times"]
  start = int(len(shapes) * 0.6)
  seen = {tuple(s) for s in shapes[:start]}
  total_t = total_n = 0.0
  for shape, t in zip(shapes[start:], times[start:]):
    shape = tuple(shape)
    if result["config"] in TF_CONFIGS and shape not in seen:
      seen.add(shape)
      continue
    seen.add(shape)
    total_t += t
    total_n += shape[0]
  return total_t / max(total_n, 1.0)


def report(workload, results):
  by = {r["config"]: r for r in results}
  distinct = len({tuple(s) for s in by["ours"]["shapes"]})
  steps = len(by["ours"]["shapes"])
  print(f"\nWorkload {workload}: {steps} steps, {distinct} distinct input shapes")
  print(
    f"  {'config':<14}{'total s':>9}{'steps/s':>9}{'vs jit':>8}{'compiles':>10}"
    f"{'steady us/sample':>18}{'final loss':>12}"
  )
  jit_total = by["jit_compile"]["total_s"]
  for config in CONFIGS:
    r = by[config]
    if "failed" in r:
      print(f"  {config:<14}   crashed (exit {r['failed']}): not counted")
      continue
    compiles = r["xla_compiles"]
    if config == "ours":
      compiles = f"{r['ours_compiles']} ({r['xla_compiles']})"
    print(
      f"  {config:<14}{r['total_s']:>9.2f}{steps / r['total_s']:>9.1f}"
      f"{jit_total / r['total_s']:>7.2f}x{str(compiles):>10}"
      f"{steady_per_sample(r) * 1e6:>18.2f}{r['final_loss']:>12.4f}"
    )
  ours = by["ours"]
  ran = [c for c in TF_CONFIGS if "failed" not in by[c]]
  best_tf = min(ran, key=lambda c: by[c]["total_s"])
  speed_jit = jit_total / ours["total_s"]
  speed_best = by[best_tf]["total_s"] / ours["total_s"]
  steady = steady_per_sample(ours) / steady_per_sample(by["jit_compile"])
  print(f"  ours: plan {ours['plan']}, calls {ours['stats']}")
  checks = [e for e in ours["ours_events"] if e["event"] == "speed check"]
  if checks:  # tf_ext.jit's own verdicts: compiled vs uncompiled, us per element
    verdicts_seen = [
      f"{e['compiled_us_per_element']:.2g}/{e['compiled_us_per_padded_element']:.2g}/"
      f"{e['compiled_us_per_element_unpadded']:.2g}/{e['uncompiled_us_per_element']:.2g} -> "
      f"{'compiled' if e['compiled_faster'] else 'plain'}"
      for e in checks
    ]
    print(
      "  ours' speed checks (us per element: compiled/per padded element/compiled if unpadded/"
      "uncompiled): "
    )
    print("    " + ", ".join(verdicts_seen))
  checks = [
    (f"ours {speed_jit:.2f}x jit_compile=True (target >= 2.25x)", speed_jit >= 2.25),
    (f"ours {speed_best:.2f}x the best TF option, {best_tf} (target >= 1.3x)", speed_best >= 1.3),
    (
      f"ours' steady-state time per sample {steady:.2f}x jit_compile=True's (target <= 1.1x)",
      steady <= 1.1,
    ),
    (
      f"ours {by['static']['total_s'] / ours['total_s']:.2f}x static shapes (target > 1x)",
      ours["total_s"] < by["static"]["total_s"],
    ),
    (
      f"ours compiled {ours['ours_compiles']} executables (target <= 8)",
      ours["ours_compiles"] <= 8,
    ),
  ]
  for text, ok in checks:
    print(f"  [{_report.verdict(ok)}] {text}")
  if speed_best < 1.3:
    print("  (`make bench-jit-profile` shows, op by op, how much faster XLA's code can be here)")
  return checks


def plot(all_results, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(len(all_results), 1, figsize=(11, 4 * len(all_results)))
  if len(all_results) == 1:
    axes = [axes]
  for ax, (workload, results) in zip(axes, all_results.items()):
    by = {r["config"]: r for r in results}
    for config, style in [("jit_compile", "tab:red"), ("plain", "tab:gray"), ("ours", "tab:blue")]:
      if "times" not in by.get(config, {}):  # not run (--configs) or crashed
        continue
      r = by[config]
      ends, t = [], 0.0
      for dt in r["times"]:
        t += dt
        ends.append(t)
      ax.plot(ends, [dt * 1e3 for dt in r["times"]], ".", ms=3, color=style, label=config)
    ours = by.get("ours", {})
    for e in ours.get("ours_events", []):
      if e["event"] == "compile":
        ax.axvline(e["time"] - ours["start_time"], color="tab:blue", alpha=0.3, lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the run (blue lines: ours' compilations ready)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"Workload {workload}: step times over the whole run")
    ax.legend()
  _report.save_figure(fig, plt, path, dpi=90)
  print(f"\nPlot: {path}")


def main():
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    _common.use_checkout()
    for item in sys.argv[2].split(","):
      workload, steps = item.split(":")
      worker(workload, sys.argv[3], int(steps), sys.argv[4:] == ["quick"])
    return 0
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="a short smoke run of every configuration")
  p.add_argument("--workloads", default="A,B", help="comma-separated, of A and B")
  p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
  p.add_argument("--steps-a", type=int, default=None, help="steps of workload A")
  p.add_argument("--steps-b", type=int, default=None, help="steps of workload B")
  p.add_argument("--plot", default=None, help="PNG path (default: build/charts/jit_cache.png)")
  p.add_argument("--json", default=None, help="write all results here")
  p.add_argument(
    "--rounds",
    type=int,
    default=1,
    help="run every configuration but jit_compile=True this many times, interleaved, and keep "
    "each one's median run (this machine's speed drifts between configurations)",
  )
  args = p.parse_args()
  if args.rounds < 1:
    p.error("--rounds must be at least 1")
  steps = {
    "A": args.steps_a or (30 if args.quick else 2000),
    "B": args.steps_b or (24 if args.quick else 300),
  }
  configs = args.configs.split(",")
  wall = time.perf_counter()
  all_results, verdicts = {}, []
  workloads = args.workloads.split(",")
  by_config = median_rounds(configs, {w: steps[w] for w in workloads}, args.quick, args.rounds)
  for workload in workloads:
    results = [by_config[c][workload] for c in configs]
    all_results[workload] = results
    if set(CONFIGS) <= set(configs):
      verdicts += report(workload, results)
  if set(CONFIGS) <= set(configs) and not args.quick or args.plot:
    plot(all_results, args.plot or _report.chart_path("jit_cache.png"))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(all_results, f)
  passed = sum(ok for _, ok in verdicts)
  print(f"\n{passed}/{len(verdicts)} targets met; {time.perf_counter() - wall:.0f} s in all")
  return 0


if __name__ == "__main__":
  sys.exit(main())

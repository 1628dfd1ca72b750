"""XLA in a TF1 Session on a stream of varying batch sizes: tf_ext.jit.Bucketing against
TensorFlow's own options.

The model is a recommendation model trained from a tf.data pipeline in a Session: sparse
fields, one tf_ext table each, plus dense features and a dense tower, Adagrad. Its dense part is
clustered for XLA by tf_ext.graph_optimizations (the same clusters as auto-jit would make around
the tables). The stream has batch sizes from 32 to 1024 in steps of 16 (61 distinct sizes; the
last partial batches and dynamic batching of a serving-to-training stream). Configurations, each
in its own process (TensorFlow's XLA flags are process-wide), each a whole run with its
compilations included:
  plain        no XLA (graph passes fuse the embeddings only);
  xla          the dense part clustered, TensorFlow's default (lazy) compilation: each new batch
               size compiles, the step waiting, when it is seen a second time;
  xla_async    the same with TensorFlow's --tf_xla_async_compilation (a new size compiles in the
               background while its steps run uncompiled; at most 10 in flight);
  ours         tf_ext.jit.Bucketing on the input pipeline, plus the clustering (its async
               compilation and its speed gate on: the clusters run compiled only where the
               timed steps say that is faster).
Compilations are counted by tf_ext's XLA activity listener (tf_ext.jit.compile_log()).
Targets: ours faster over the whole run than xla and xla_async; at most 8 compilations.
`--rounds N` runs every configuration N times in rotating order and reports each one's median run
with the per-round ratios (one round takes about a minute or two on a 2-CPU machine).
Printed as context: the steady-state time per sample against xla's, the rows padding added, and
XLA's own steady-state gain over plain TF on the machine (the cache removes the recompilations,
not the cost of XLA's code). `--quick` is a short smoke run, not a measurement.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import _common
import _report
import _rounds

CONFIGS = ["plain", "xla", "xla_async", "ours"]
WORKER_LIMIT_S = 1200  # one configuration's process
FIELDS = 8
DENSE = 13
TOWER = (256, 128, 64)


def stream(steps, quick, seed=0):
  import numpy as np

  rng = np.random.default_rng(seed)
  sizes = np.arange(32, 1025, 16) if not quick else np.array([40, 96, 200, 256])
  return [int(n) for n in rng.choice(sizes, size=steps)]


def worker(config, steps, quick):
  import numpy as np
  import tensorflow as tf

  import tf_ext
  from tf_ext import graph_optimizations, jit

  tf.compat.v1.disable_eager_execution()  # a TF1 program
  if config == "xla_async":
    jit.set_async_compilation(True)
  sizes = stream(steps, quick)
  rng = np.random.default_rng(1)
  batches = []
  for n in sizes:
    ids = rng.zipf(1.3, (n, FIELDS)) % 100_000
    batches.append((ids, rng.normal(size=(n, DENSE)).astype(np.float32), rng.integers(0, 2, n)))

  def generate():
    yield from batches

  signature = (
    tf.TensorSpec([None, FIELDS], tf.int64),
    tf.TensorSpec([None, DENSE], tf.float32),
    tf.TensorSpec([None], tf.int64),
  )

  def to_features(ids, dense, label):
    features = {f"field_{i}": ids[:, i] for i in range(FIELDS)}
    features["dense"] = dense
    return features, tf.cast(label, tf.float32)

  bucketing = jit.Bucketing(name="bench") if config == "ours" else None
  dataset = tf.data.Dataset.from_generator(generate, output_signature=signature).map(to_features)
  if bucketing is not None:
    dataset = bucketing.pad(dataset)
  features, label = tf.compat.v1.data.make_one_shot_iterator(dataset.prefetch(2)).get_next()
  with bucketing.padded(features) if bucketing is not None else contextlib.nullcontext():
    init = tf.random_normal_initializer(0.0, 0.05)
    embedded = [
      tf_ext.embedding_lookup(
        tf_ext.get_dynamic_embedding_variable(f"field_{i}", 16, initializer=init),
        features[f"field_{i}"],
      )
      for i in range(FIELDS)
    ]
    x = tf.concat(embedded + [features["dense"]], axis=1)
    for index, width in enumerate(TOWER):
      x = tf.keras.layers.Dense(width, "relu", name=f"tower_{index}")(x)
    logit = tf.squeeze(tf.keras.layers.Dense(1, name="logit")(x), axis=1)
    per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit)
    loss = jit.masked_mean(per_example)
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
  train = optimizer.minimize(loss)
  config_proto = graph_optimizations.config_proto(
    fuse_embeddings=True, cluster_dense_for_xla=config != "plain"
  )
  first_compile = jit.compile_count()
  times, losses = [], []
  with tf.compat.v1.Session(config=config_proto) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    start = time.perf_counter()
    for _ in sizes:
      t0 = time.perf_counter()
      losses.append(float(session.run([loss, train])[0]))
      times.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    wall_start = time.time() - (time.perf_counter() - start)
    compiles = jit.compile_log(first_compile)
    result = {
      "config": config,
      "sizes": sizes,
      "times": times,
      "total_s": total,
      "final_loss": float(np.mean(losses[-20:])),
      "compiles": len(compiles),
      "compile_s": sum(e["compile_time_us"] for e in compiles) / 1e6,
      "compile_times": [e["time"] - wall_start for e in compiles],
    }
    if bucketing is not None:
      result["buckets"] = [list(b) for b in bucketing.buckets()]
      result["plan"] = [list(b) for b in bucketing.plan().get(("batch",), [])]
      result["elements"] = bucketing.stats["elements"]
      result["padding"] = bucketing.stats["padding"]
      result["speed_checks"] = jit.speed_verdicts()
    # Before the Session closes: TensorFlow's own asynchronous compilation may crash or hang
    # there (xla_async), and the run has been measured by then.
    print("RESULT " + json.dumps(result), flush=True)


def run_config(config, steps, quick):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  command = [sys.executable, os.path.abspath(__file__), "--worker", config, str(steps)]
  command += ["quick"] if quick else []
  _common.log(f"{config}: {steps} steps")
  limit = WORKER_LIMIT_S if not quick else 300
  try:
    done = subprocess.run(command, env=env, capture_output=True, timeout=limit)
    stdout, stderr, exit_code = done.stdout, done.stderr, done.returncode
  except subprocess.TimeoutExpired as expired:
    stdout, stderr, exit_code = expired.stdout, expired.stderr, f"killed after {limit} s"
  stdout = (stdout or b"").decode("utf-8", "replace")
  stderr = (stderr or b"").decode("utf-8", "replace")
  lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
  if not lines:
    tail = stderr.strip().splitlines()[-5:]
    raise RuntimeError(f"{config} failed (exit {exit_code}): " + " | ".join(tail))
  result = json.loads(lines[-1][len("RESULT ") :])
  if exit_code != 0:  # after its measured run: at Session close or exit
    result["exit"] = str(exit_code)
    _common.log(
      f"  then crashed or hung at Session close (exit {exit_code}): TensorFlow's asynchronous "
      "compilation still running when the Session is freed"
    )
  _common.log(
    f"  {result['total_s']:.1f} s, {result['compiles']} XLA compilations "
    f"({result['compile_s']:.1f} s of compiling)"
  )
  return result


def steady_per_sample(result):
  """Seconds per sample over the last 40% of the run."""
  start = int(len(result["sizes"]) * 0.6)
  return sum(result["times"][start:]) / sum(result["sizes"][start:])


def report(results):
  by = {r["config"]: r for r in results}
  print("\n| config | whole run (s) | samples/s | steady ms per 1k samples | XLA compiles |")
  print("|---|---|---|---|---|")
  for r in results:
    samples = sum(r["sizes"])
    crashed = f" (then exit {r['exit']} at close)" if "exit" in r else ""
    print(
      f"| {r['config']}{crashed} | {r['total_s']:.1f} | {samples / r['total_s']:.0f} | "
      f"{steady_per_sample(r) * 1e6:.2f} | {r['compiles']} |"
    )
  ours = by["ours"]
  verdicts = []
  print()
  for other in ("xla", "xla_async"):
    ratio = by[other]["total_s"] / ours["total_s"]
    verdicts.append(ratio > 1.0)
    print(f"whole run, ours vs {other}: {ratio:.2f}x (target > 1)  {_report.verdict(ratio > 1.0)}")
  print(
    f"steady state per sample, ours / xla: "
    f"{steady_per_sample(ours) / steady_per_sample(by['xla']):.2f}x (context: after its "
    "megamorphic cut-off xla runs new sizes uncompiled); ours padded "
    f"{ours['padding'] / ours['elements']:.0%} more rows than the real ones"
  )
  verdicts.append(ours["compiles"] <= 8)
  print(
    f"ours: {ours['compiles']} XLA compilations (target <= 8)  "
    f"{_report.verdict(ours['compiles'] <= 8)}"
  )
  print(f"ours: buckets {ours.get('buckets')}, plan {ours.get('plan')}")
  for check in ours.get("speed_checks", []):
    way = "compiled" if check["run_compiled"] else "uncompiled"
    print(
      f"ours: speed gate: {check['clusters']} run {way} (steps took "
      f"{check['compiled_ns_per_element']:.3g} ns per input element compiled, "
      f"{check['uncompiled_ns_per_element']:.3g} uncompiled)"
    )
  xla_gain = steady_per_sample(by["plain"]) / steady_per_sample(by["xla"])
  print(
    f"context: XLA's own steady-state gain over no XLA on this machine is {xla_gain:.2f}x, "
    f"so ours vs plain is {by['plain']['total_s'] / ours['total_s']:.2f}x over the whole run"
  )
  return verdicts


def plot(results, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(11, 4.5))
  colors = {"plain": "tab:gray", "xla": "tab:red", "xla_async": "tab:orange", "ours": "tab:blue"}
  for r in results:
    ends, t = [], 0.0
    for dt in r["times"]:
      t += dt
      ends.append(t)
    ax.plot(ends, [dt * 1e3 for dt in r["times"]], ".", ms=3, color=colors[r["config"]])
    ax.plot(
      [], [], "o", color=colors[r["config"]], label=f"{r['config']} ({r['compiles']} compiles)"
    )
    for when in r["compile_times"]:
      ax.axvline(when, color=colors[r["config"]], alpha=0.25, lw=1)
  ax.set_yscale("log")
  ax.set_xlabel("seconds into the run (vertical lines: XLA compilations done)")
  ax.set_ylabel("step time (ms)")
  ax.set_title("TF1 Session, varying batch sizes: step times over the whole run")
  ax.legend()
  _report.save_figure(fig, plt, path, dpi=90)


def main():
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    _common.use_checkout()
    worker(sys.argv[2], int(sys.argv[3]), sys.argv[4:] == ["quick"])
    return 0
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="a short smoke run of every configuration")
  p.add_argument("--steps", type=int, default=None, help="training steps (default 1000)")
  p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
  p.add_argument("--plot", default=None, help="PNG (default: build/charts/jit_cache_session.png)")
  p.add_argument("--json", default=None, help="write all results here")
  p.add_argument(
    "--rounds",
    type=int,
    default=1,
    help="rounds of every configuration, in rotating order; each configuration's median run is "
    "reported (the machine's speed drifts between processes)",
  )
  args = p.parse_args()
  if args.rounds < 1:
    p.error("--rounds must be at least 1")
  _common.use_checkout()
  import numpy as np
  import tensorflow as tf

  import tf_ext

  _report.machine_report(tf, tf_ext, np)
  steps = args.steps or (12 if args.quick else 1000)
  wall = time.perf_counter()
  configs = args.configs.split(",")
  runs = {c: [] for c in configs}
  for round_index in range(args.rounds):
    if args.rounds > 1:
      _common.log(f"round {round_index + 1}/{args.rounds}")
    for config in _rounds.rotated(configs, round_index):
      runs[config].append(run_config(config, steps, args.quick))
  results = [sorted(runs[c], key=lambda r: r["total_s"])[(args.rounds - 1) // 2] for c in configs]
  if args.rounds > 1 and {"ours", "xla", "xla_async"} <= set(configs):
    for other in ("xla", "xla_async"):
      ratios = [b["total_s"] / a["total_s"] for a, b in zip(runs["ours"], runs[other])]
      print(f"per round, ours vs {other}: " + ", ".join(f"{r:.2f}x" for r in ratios))
    print("(the table and verdicts below: each configuration's median run)")
  verdicts = report(results) if set(CONFIGS) <= set(configs) else []
  if not args.quick or args.plot:
    chart = {}
    _report.write_chart(
      args.plot or _report.chart_path("jit_cache_session.png"), chart, lambda p: plot(results, p)
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results if args.rounds == 1 else {"median_runs": results, "rounds": runs}, f)
  print(f"\n{sum(verdicts)}/{len(verdicts)} targets met; {time.perf_counter() - wall:.0f} s in all")
  return 0


if __name__ == "__main__":
  sys.exit(main())

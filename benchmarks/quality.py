#!/usr/bin/env python3
"""Model quality and training speed of a DeepFM-style CTR model on a drifting Criteo-like stream,
with tf_ext's tables against a memory-matched hashed tf.Variable and TFRA 0.7.2.

Data: benchmarks/_criteo_like.py, seeded: 26 Zipf-distributed id fields (3 to 10^7 slots; every
day 30 % of the large fields' slots get new ids and their old ids fade out) and 13 dense
features; labels drawn from a hidden sparse logistic model with FM terms, so each day's
Bayes-optimal AUC (the true probability's AUC) is known.

Training: the same model for each embedding backend, in TF1 graph mode (tf.compat.v1.Session):
26 field embeddings of --dim from one table per backend (every field's ids in one id space),
logit = bias + linear(concat) + FM second order over the 26 embeddings + an MLP over the
embeddings and the dense features, loss summed over the batch; Adagrad
(tf.compat.v1.train.AdagradOptimizer, same learning rate, same initial rows: --initializer,
uniform of standard deviation 0.01 by default, or N(0, 0.01^2)) for all. With --lookup unique
(the default) every backend looks up each distinct id of a batch once and gathers the rows back
(a batch of 2,048 x 26 ids holds about 25 % distinct ones). Day 0 is trained on; each later day
is first evaluated (AUC of the model trained on the days before it),
then trained on, one pass in --batch-size batches.
  1. tf_ext: tf_ext.get_dynamic_embedding_variable with FrequencyAdmission(--min-count, count-min
     sketch of --sketch-mib) and EvictionPolicy(ttl_steps = --ttl-days days of steps),
     table.evict() after each day, optimizer wrapped by tf_ext.DynamicEmbeddingOptimizer;
  2. hashed: a tf.Variable [buckets, dim] indexed by id mod buckets, with buckets chosen so that
     its values and Adagrad slot take the bytes of tf_ext's table at the end of its run
     (memory_bytes(), the admission sketch included), so its ids collide;
  3. tf_ext with its defaults ("defaults", run with TFRA, against which it is compared): no
     admission and no eviction, every id kept, as TFRA keeps them, and the table's default
     initial rows (N(0, 0.001^2), not --initializer's);
  4. TFRA 0.7.2: de.get_variable + de.embedding_lookup_unique (TrainableWrapper path; with
     --lookup plain de.embedding_lookup, whose wrapper updates an id repeated in a batch once, not
     with its summed gradient, which costs it AUC) and de.DynamicEmbeddingOptimizer; skipped with
     a note when TFRA is not importable, or with --no-tfra.
Reported: AUC per evaluated day for each backend and the Bayes-optimal AUC, each tf_ext
backend's difference from TFRA's, table rows per day,
training samples/s (session.run of the training steps only: no data generation, evaluation or
eviction) over each backend's whole run and, for the ratios, in --speed-rounds interleaved
rounds on one more day (new to all backends, so new ids are inserted as in the stream), the
backends side by side so that a shared machine's load drift cancels; the peak RSS each
backend's run added; and a PNG chart (--png) of AUC, tf_ext's AUC lead and table rows over days.
Targets: tf_ext AUC >= hashed + 0.001 on every evaluated day; tf_ext with its defaults AUC >=
TFRA's on every evaluated day; tf_ext training throughput >= 3x TFRA's and >= 0.8x the hashed
table's (interleaved rounds, same run). PASS/MISS lines are
informational: the exit status is 0 whatever the numbers.

The default (7 days x 300,000 samples, dim 8, batch 2048) takes about 2 to 4 minutes on a
2-CPU machine with all three backends (15 at most); --quick (3 days x 40,000 samples) about
20 seconds.

  python benchmarks/quality.py                   # with TFRA when it is importable
  python benchmarks/quality.py --quick --no-tfra
  python benchmarks/quality.py --json /tmp/quality.json --png /tmp/quality.png
"""

import gc
import os
import sys
import time
import warnings

from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  PeakRssAdded,
  add_intra_op_threads,
  add_json,
  argument_parser,
  import_tfra,
  log,
  mib,
  require_positive,
  use_checkout,
)
from _report import (
  chart_path,
  finish,
  machine_report,
  save_figure,
  verdict,
  versions,
  write_chart,
)
from _rounds import median_of_ratios, rotated  # noqa: E402

use_checkout(measures_peak_rss=True)

import _criteo_like  # noqa: E402
import numpy as np  # noqa: E402
from _quality_models import INITIAL_STDDEV, hashed_model, tf_ext_model, tfra_model  # noqa: E402

AUC_MARGIN = 0.001
TFRA_SPEED_TARGET, HASHED_SPEED_TARGET = 3.0, 0.8
BACKENDS = ("tf_ext", "hashed", "tfra", "defaults")
LABELS = {
  "tf_ext": "tf_ext (admission + eviction)",
  "hashed": "hashed tf.Variable (same memory)",
  "tfra": "TFRA 0.7.2 dynamic_embedding",
  "defaults": "tf_ext (its defaults: every id kept)",
}
DEFAULT_PNG = chart_path("quality.png")


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--days", type=int, default=7, help="days trained (all but the first evaluated)")
  p.add_argument("--samples", type=int, default=300_000, help="samples per day")
  p.add_argument("--dim", type=int, default=8, help="embedding width")
  p.add_argument("--batch-size", type=int, default=2048, help="training batch, all backends")
  p.add_argument("--eval-batch-size", type=int, default=32768, help="evaluation batch")
  p.add_argument("--learning-rate", type=float, default=0.05, help="Adagrad, all backends")
  p.add_argument("--hidden", default="64,32", help="MLP layer widths")
  p.add_argument("--min-count", type=int, default=2, help="tf_ext FrequencyAdmission min_count")
  p.add_argument(
    "--sketch-mib", type=int, default=8, help="tf_ext admission count-min sketch size (MiB)"
  )
  p.add_argument(
    "--ttl-days", type=float, default=0.5, help="tf_ext eviction: ttl_steps as days of steps"
  )
  p.add_argument(
    "--hashed-buckets",
    type=int,
    default=0,
    help="the hashed table's buckets; 0: as many as tf_ext's memory at the end pays for",
  )
  p.add_argument(
    "--lookup",
    choices=("unique", "plain"),
    default="unique",
    help="unique: every backend looks up each distinct id of a batch once, then gathers (TFRA: "
    "its de.embedding_lookup_unique); plain: one lookup per id occurrence (TFRA: "
    "de.embedding_lookup, whose TrainableWrapper then updates a repeated id once per batch, "
    "not with its summed gradient)",
  )
  p.add_argument(
    "--initializer",
    choices=("normal", "truncated_normal", "uniform"),
    default="uniform",
    help="initial rows of every backend: uniform with standard deviation 0.01 (the kind of "
    "tf_ext's default initializer), N(0, 0.01^2) or that normal truncated at two standard "
    "deviations, for which tf_ext computes each missing id's row from the id where the others "
    "draw random numbers",
  )
  p.add_argument(
    "--initializer-version",
    type=int,
    choices=(1, 2),
    default=1,
    help="tf_ext's generator of normal rows: 1 (the default; about 190 ns per row of 8) or 2 "
    "(float math; about 23 ns); the other backends draw as before",
  )
  p.add_argument("--seed", type=int, default=0, help="data and model seed")
  p.add_argument("--no-tfra", action="store_true", help="skip the TFRA backend")
  p.add_argument("--quick", action="store_true", help="3 days x 40,000 samples, for a smoke run")
  p.add_argument("--png", default=DEFAULT_PNG, help="the chart's path ('' for none)")
  p.add_argument("--speed-rounds", type=int, default=7, help="interleaved speed rounds")
  p.add_argument("--speed-steps", type=int, default=20, help="training steps per speed round")
  add_intra_op_threads(p)
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.days, args.samples, args.speed_rounds, args.speed_steps = 3, 40_000, 3, 5
  require_positive(
    p,
    args,
    [
      "days",
      "samples",
      "dim",
      "batch_size",
      "eval_batch_size",
      "min_count",
      "sketch_mib",
      "speed_rounds",
      "speed_steps",
    ],
  )
  if args.days < 2:
    p.error("--days must be >= 2 (day 0 is only trained on)")
  if not args.ttl_days > 0:
    p.error("--ttl-days must be > 0")
  args.hidden_units = [int(x) for x in args.hidden.split(",") if x.strip()]
  return args


# ---- running a backend ------------------------------------------------------------------------


def run_backend(name, build, days, args):
  """Builds the backend's model, streams the days through it; returns its results."""
  log(f"[{name}] building the model")
  with PeakRssAdded() as peak:
    model = build()
    result = {
      "backend": name,
      "label": LABELS[name],
      "policy": model.policy,
      "auc": [],
      "rows": [],
      "train_seconds": 0.0,
    }
    trained = 0
    for d, day in enumerate(days):
      if d > 0:
        t = time.perf_counter()
        result["auc"].append(_criteo_like.auc(model.predict(day), day.label))
        log(f"[{name}] day {d}: AUC {result['auc'][-1]:.4f} ({time.perf_counter() - t:.1f}s)")
      seconds = model.train_day(day)
      result["train_seconds"] += seconds
      trained += len(day)
      evicted = int(model.sess.run(model.after_day)) if model.after_day is not None else None
      result["rows"].append(int(model.sess.run(model.size)))
      more = f", evicted {evicted:,}" if evicted is not None else ""
      log(
        f"[{name}] day {d}: trained {len(day):,} samples in {seconds:.1f}s "
        f"({len(day) / seconds:,.0f}/s), rows {result['rows'][-1]:,}{more}"
      )
    if model.memory is not None:
      result["memory_bytes"] = int(model.sess.run(model.memory))
    gc.collect()
  result["samples"] = trained
  result["samples_per_s"] = trained / result["train_seconds"]
  result["peak_rss_added_bytes"] = peak.bytes
  return result, model


def speed_rounds(models, day, args):
  """Training speed in interleaved rounds on `day`, a day none of them has seen: round r trains
  every backend (in a rotating order) on the same next --speed-steps batches of it, new ids
  included; returns {backend: [samples/s per round]}. Rounds side by side keep a shared machine's
  load drift out of the ratios."""
  b, names = args.batch_size, list(models)
  steps = max(1, min(args.speed_steps, len(day) // (b * args.speed_rounds)))
  rates = {name: [] for name in names}
  for r in range(args.speed_rounds):
    first = r * steps * b
    for name in rotated(names, r):
      seconds = models[name].train_steps(day, first, steps)
      rates[name].append(steps * b / seconds)
    log(
      f"[speed] round {r + 1}/{args.speed_rounds}: "
      + ", ".join(f"{n} {rates[n][-1]:,.0f}/s" for n in names)
    )
  return rates, steps


def chart(path, results, bayes, days):
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.8), dpi=72)
  evaluated = list(range(1, days))
  styles = {"tf_ext": "o-", "hashed": "s--", "tfra": "^:", "defaults": "d-."}
  by = {r["backend"]: r for r in results}
  for r in results:
    ax1.plot(evaluated, r["auc"], styles[r["backend"]], label=r["label"])
    ax3.plot(range(days), r["rows"], styles[r["backend"]], label=r["label"])
    if r["backend"] != "tf_ext":
      gap = [a - b for a, b in zip(by["tf_ext"]["auc"], r["auc"])]
      ax2.plot(evaluated, gap, styles[r["backend"]], label=f"tf_ext - {r['backend']}")
  ax1.plot(evaluated, bayes, "k-", lw=1, label="Bayes-optimal")
  ax1.set(xlabel="day evaluated (trained on the days before)", ylabel="AUC", title="AUC per day")
  ax2.axhline(AUC_MARGIN, color="grey", ls="--", lw=1, label=f"target vs hashed: {AUC_MARGIN}")
  ax2.axhline(0.0, color="black", lw=0.5)
  ax2.set(xlabel="day evaluated", ylabel="AUC difference", title="tf_ext's AUC lead")
  ax3.set(xlabel="day trained", ylabel="rows", title="table rows after each day")
  for ax in (ax1, ax2, ax3):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  save_figure(fig, plt, path)


# ---- main -----------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()
  warnings.filterwarnings("ignore", message=r".*tf\.layers\.dense. is deprecated")

  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  tf.compat.v1.disable_eager_execution()
  import tf_ext  # pylint: disable=import-outside-toplevel

  de, tfra_version, tfra_status = import_tfra(args.no_tfra, "its backend is skipped")

  print("== tf_ext quality benchmark: DeepFM on a drifting Criteo-like stream ==")
  machine = machine_report(tf, tf_ext, np)
  print(f"TFRA         : {tfra_status}")
  print(
    f"threads      : intra_op_parallelism_threads={args.intra_op_threads} (0: one per CPU); "
    f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')} (for the peak RSS figures)"
  )
  print(
    f"workload     : {args.days} days x {args.samples:,} samples (26 id fields, 13 dense), "
    f"seed {args.seed}; day 0 trained, days 1..{args.days - 1} evaluated then trained"
  )
  print(
    f"model        : DeepFM, dim {args.dim}, MLP {args.hidden_units}, Adagrad "
    f"lr {args.learning_rate}, batch {args.batch_size}, TF1 graph mode (Session), "
    f"{args.lookup} lookups, {args.initializer} initial rows (std {INITIAL_STDDEV}, tf_ext "
    f"initializer version {args.initializer_version})"
  )
  results = {
    "config": {
      k: getattr(args, k)
      for k in (
        "days",
        "samples",
        "dim",
        "batch_size",
        "learning_rate",
        "hidden_units",
        "min_count",
        "sketch_mib",
        "ttl_days",
        "lookup",
        "initializer",
        "initializer_version",
        "speed_rounds",
        "speed_steps",
        "seed",
        "intra_op_threads",
        "quick",
      )
    },
    "versions": versions(tf, tf_ext, np, tfra=tfra_version),
    "machine": machine,
  }

  # -- data ---------------------------------------------------------------------------------
  gen = _criteo_like.CriteoLike(args.seed)
  days = []
  for d in range(args.days):
    t = time.perf_counter()
    days.append(gen.day(d, args.samples))
    log(f"[data] day {d}: {args.samples:,} samples in {time.perf_counter() - t:.1f}s")
  bayes = [day.bayes_auc() for day in days[1:]]
  args.click_rate = float(days[0].label.mean())
  ctr = float(np.mean([day.label.mean() for day in days]))
  steps_per_day = -(-args.samples // args.batch_size)

  # -- backends -----------------------------------------------------------------------------
  models = {}
  tf_ext_run, models["tf_ext"] = run_backend(
    "tf_ext", lambda: tf_ext_model(tf, tf_ext, args, steps_per_day), days, args
  )
  runs = [tf_ext_run]
  row_bytes = 2 * args.dim * 4  # values + Adagrad's accumulator, float32
  buckets = args.hashed_buckets or max(1, tf_ext_run["memory_bytes"] // row_bytes)
  hashed, models["hashed"] = run_backend(
    "hashed", lambda: hashed_model(tf, args, buckets), days, args
  )
  hashed["memory_bytes"] = buckets * row_bytes
  runs.append(hashed)
  if de is not None:
    try:
      tfra_run, models["tfra"] = run_backend("tfra", lambda: tfra_model(tf, de, args), days, args)
      runs.append(tfra_run)
    except Exception as error:  # pylint: disable=broad-except
      print(f"TFRA: failed ({type(error).__name__}: {error}); skipping its backend")
      tfra_status = f"failed: {type(error).__name__}: {error}"
  if "tfra" in models:
    defaults_run, models["defaults"] = run_backend(
      "defaults", lambda: tf_ext_model(tf, tf_ext, args, steps_per_day, policies=False), days, args
    )
    runs.append(defaults_run)
  t = time.perf_counter()
  speed_day = gen.day(args.days, args.samples)
  log(f"[data] day {args.days} (speed rounds): {time.perf_counter() - t:.1f}s")
  rates, args.speed_steps = speed_rounds(models, speed_day, args)
  del speed_day
  for r in runs:
    r["interleaved_samples_per_s"] = rates[r["backend"]]
  for model in models.values():
    model.close()
  models.clear()
  gc.collect()
  results["runs"] = runs
  results["bayes_auc"] = bayes
  results["ctr"] = ctr
  by = {r["backend"]: r for r in runs}

  # -- report -------------------------------------------------------------------------------
  print()
  for r in runs:
    print(f"{r['backend']:<7}: {r['label']}: {r['policy']}")
  print(f"click rate   : {ctr:.3f}")
  print()
  print("AUC on each day, before training on it (the model trained on the days before):")
  names = [r["backend"] for r in runs]
  versus_tfra = [n for n in ("tf_ext", "defaults") if n in by and "tfra" in by]
  print(
    f"  {'day':>3}  {'Bayes':>7}  "
    + "  ".join(f"{n:>8}" for n in names)
    + "  tf_ext-hashed"
    + "".join(f"  {n + '-tfra':>13}" for n in versus_tfra)
  )
  for i, b in enumerate(bayes):
    cols = "  ".join(f"{r['auc'][i]:8.4f}" for r in runs)
    gap = by["tf_ext"]["auc"][i] - by["hashed"]["auc"][i]
    tfra_gaps = "".join(f"  {by[n]['auc'][i] - by['tfra']['auc'][i]:+13.4f}" for n in versus_tfra)
    print(f"  {i + 1:>3}  {b:7.4f}  {cols}  {gap:+13.4f}{tfra_gaps}")
  print()
  print("table rows after each day's training (tf_ext: after evict()):")
  print(f"  {'day':>3}  " + "  ".join(f"{n:>11}" for n in names))
  for d in range(args.days):
    print(f"  {d:>3}  " + "  ".join(f"{r['rows'][d]:>11,}" for r in runs))
  print()
  print("training (session.run of the training steps only) and memory:")
  print(
    f"  {'backend':<34} {'samples/s':>11} {'interleaved':>11} {'train s':>8} "
    f"{'peak RSS added':>15} {'table bytes':>13}"
  )
  for r in runs:
    r["interleaved_median"] = float(np.median(r["interleaved_samples_per_s"]))
    table = mib(r.get("memory_bytes")) if "memory_bytes" in r else "n/a"
    print(
      f"  {r['label']:<34} {r['samples_per_s']:>11,.0f} {r['interleaved_median']:>11,.0f} "
      f"{r['train_seconds']:>8.1f} {mib(r['peak_rss_added_bytes']):>15} {table:>13}"
    )
  print(
    f"  (samples/s: over all {args.days} days of its own run; interleaved: median of "
    f"{args.speed_rounds} rounds of {args.speed_steps} steps on day {args.days}'s batches "
    "(new to all), the backends side by side;"
  )
  print(
    f"   hashed: {buckets:,} buckets x (dim {args.dim} + Adagrad slot) x 4 B, sized to "
    f"tf_ext's memory_bytes() at the end: {tf_ext_run['memory_bytes']:,} B; peak RSS added: "
    "each backend's run, the earlier backends still alive)"
  )
  speed = tf_ext_run["samples_per_s"]
  ratios, whole = {}, {}
  for r in runs[1:]:
    k = r["backend"]
    ratios[k] = median_of_ratios(
      tf_ext_run["interleaved_samples_per_s"], r["interleaved_samples_per_s"]
    )
    whole[k] = speed / r["samples_per_s"]
  print()
  print(
    "ratios (tf_ext training samples/s / the other's, same run; interleaved: median of the "
    "rounds' ratios):"
  )
  for k, v in ratios.items():
    print(f"  tf_ext / {k:<7}: {v:6.2f}x interleaved, {whole[k]:6.2f}x over the whole runs")
  results["speed_ratios"] = ratios
  results["speed_ratios_whole_runs"] = whole

  gaps = [a - h for a, h in zip(tf_ext_run["auc"], hashed["auc"])]
  targets = {}
  print()
  print("targets (informational; the exit status is 0 regardless):")
  ok = all(g >= AUC_MARGIN for g in gaps)
  targets["auc_vs_hashed"] = {"min_gap": min(gaps), "gaps": gaps, "pass": ok}
  print(
    f"  {verdict(ok)}  tf_ext AUC >= hashed + {AUC_MARGIN} on every evaluated day: smallest gap "
    f"{min(gaps):+.4f} (day {gaps.index(min(gaps)) + 1})"
  )
  if "defaults" in by:
    tfra_gaps = [a - t for a, t in zip(by["defaults"]["auc"], by["tfra"]["auc"])]
    ok = min(tfra_gaps) >= 0
    targets["defaults_auc_vs_tfra"] = {"min_gap": min(tfra_gaps), "gaps": tfra_gaps, "pass": ok}
    print(
      f"  {verdict(ok)}  tf_ext with its defaults AUC >= TFRA's on every evaluated day: smallest "
      f"gap {min(tfra_gaps):+.4f} (day {tfra_gaps.index(min(tfra_gaps)) + 1})"
    )
  if "tfra" in ratios:
    ok = ratios["tfra"] >= TFRA_SPEED_TARGET
    targets["speed_vs_tfra"] = {"ratio": ratios["tfra"], "pass": ok}
    print(
      f"  {verdict(ok)}  tf_ext training throughput >= {TFRA_SPEED_TARGET:g}x TFRA's: "
      f"{ratios['tfra']:.2f}x (interleaved; {whole['tfra']:.2f}x over the whole runs)"
    )
  else:
    targets["speed_vs_tfra"] = {"ratio": None, "pass": None}
    print(f"  n/a   tf_ext training throughput >= {TFRA_SPEED_TARGET:g}x TFRA's: {tfra_status}")
  ok = ratios["hashed"] >= HASHED_SPEED_TARGET
  targets["speed_vs_hashed"] = {"ratio": ratios["hashed"], "pass": ok}
  print(
    f"  {verdict(ok)}  tf_ext training throughput >= {HASHED_SPEED_TARGET:g}x the hashed "
    f"table's: {ratios['hashed']:.2f}x (interleaved; {whole['hashed']:.2f}x over the whole runs)"
  )
  results["targets"] = targets
  results["tfra_status"] = tfra_status

  if args.png:
    write_chart(args.png, results, lambda path: chart(path, runs, bayes, args.days))
  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

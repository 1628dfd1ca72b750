#!/usr/bin/env python3
"""Lookup throughput and memory of a tf_ext dynamic embedding table, against baselines.

In one run:
  1. builds a table of --keys distinct int64 ids (random 63-bit) with --dim float32 columns, the
     same rows as a dense tf.Variable [keys, dim], and (if installed) the same rows in a
     TensorFlow Recommenders-Addons 0.7.2 `dynamic_embedding` variable;
  2. pre-generates --num-batches batches of --batch Zipf(--zipf) ids over the vocabulary (ranks
     mapped to random rows, so hot ids are scattered through memory as in real tables);
  3. times, inside tf.function and interleaved round by round so machine noise hits all of
     them alike: tf_ext `table.lookup`, `tf.gather` on the dense variable, and two TFRA
     lookups: the raw `de.Variable.lookup` (one CuckooHashTableFind, not what a model calls) and
     the training-path `embedding_lookup` a TFRA model calls in TF2 (see TFRA_EMBEDDING_API);
  4. prints keys/s and the ratios tf_ext / dense gather (target >= 0.6), tf_ext / TFRA
     embedding_lookup (target >= 10, judged on the training path) and tf_ext / TFRA raw lookup
     (printed for context);
  5. measures memory per entry against the raw payload: `table.memory_bytes()` /
     (N * (8 + 4*dim)) for a lookup-only table (target <= 1.25) and, after one Adam step over
     every key (two slots per row), / (N * (8 + 3*4*dim)).

The PASS/MISS lines are informational: the exit status is 0 whatever the numbers (it is a
benchmark, not a test). Only ratios measured in the same run are meaningful on a shared or
noisy machine; absolute times are context.

  python benchmarks/lookup.py                 # 1M keys, dim 64, batches of 65536, Zipf 1.2
  python benchmarks/lookup.py --no-tfra --json /tmp/lookup.json
  python benchmarks/lookup.py --dedup --zipf 1.1 --no-tfra   # the find kernel's dedup
  make bench                                  # installs requirements-bench.txt (TFRA) first

TFRA is optional: `pip install -r requirements-bench.txt` (or `pip install .[bench]`).
"""

import gc
import os
import statistics
import sys
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_intra_op_threads,
  add_json,
  argument_parser,
  import_tfra,
  int_list,
  log,
  mib,
  require_positive,
  rss_bytes,
  use_checkout,
)
from _lookup_tables import (  # noqa: E402
  MEMORY_TARGET,
  TFRA_EMBEDDING_API,
  Progress,
  build_tfra,
  make_keys,
  make_zipf_batches,
  memory_per_entry,
)
from _report import (
  cpus_available,
  finish,
  machine_report,
  verdict,
  versions,
)
from _rounds import median_of_ratios, ratio_of_medians, timed_rounds

use_checkout()

LOOKUP_VS_GATHER_TARGET = 0.6  # tf_ext lookup keys/s / dense tf.gather keys/s, at least
LOOKUP_VS_TFRA_TARGET = 10.0  # tf_ext lookup keys/s / TFRA embedding_lookup (training path) keys/s


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--keys", type=int, default=1_000_000, help="distinct ids in the table")
  p.add_argument("--dim", type=int, default=64, help="embedding width (float32)")
  p.add_argument("--batch", type=int, default=65_536, help="ids per lookup")
  p.add_argument(
    "--zipf",
    type=float,
    default=1.2,
    help="Zipf exponent s of the id distribution, P(rank k) ~ 1/k^s over the vocabulary",
  )
  p.add_argument(
    "--repeats",
    type=int,
    default=7,
    help="timed rounds; each round runs every method over all batches; medians reported",
  )
  p.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones")
  p.add_argument("--num-batches", type=int, default=20, help="distinct pre-generated batches")
  p.add_argument(
    "--insert-batch", type=int, default=65_536, help="keys per insert/upsert/Adam step"
  )
  add_intra_op_threads(p)
  p.add_argument(
    "--inter-op-threads",
    type=int,
    default=0,
    help="tf.config inter-op threads; 0 keeps TensorFlow's default",
  )
  p.add_argument("--seed", type=int, default=0, help="numpy seed for keys, rows and ids")
  p.add_argument("--no-tfra", action="store_true", help="skip the TFRA baselines")
  p.add_argument(
    "--dedup",
    action="store_true",
    help="instead: the unfused lookup with the find kernel's dedup off, auto and always, forward "
    "and training step, on Zipf and uniform ids, against the fused lookup "
    "(benchmarks/_lookup_dedup.py)",
  )
  p.add_argument(
    "--dedup-dims", type=int_list, default=[8, 64], help="--dedup: the dims, comma-separated"
  )
  p.add_argument(
    "--no-adam", action="store_true", help="skip the memory measurement with Adam slots"
  )
  add_json(p)
  args = p.parse_args(argv)
  require_positive(p, args, ("keys", "dim", "batch", "repeats", "num_batches", "insert_batch"))
  if args.zipf <= 0:
    p.error("--zipf must be > 0")
  if args.warmup < 0:
    p.error("--warmup must be >= 0")
  return args


# ---- small helpers --------------------------------------------------------------------------


def fmt_rate(keys_per_s):
  return "n/a" if keys_per_s is None else f"{keys_per_s / 1e6:8.2f} M keys/s"


# ---- main -----------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()

  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  if args.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
  import tf_ext  # pylint: disable=import-outside-toplevel

  de, tfra_version, tfra_status = import_tfra(
    args.no_tfra,
    "skipping the TFRA column. Install it with `pip install -r requirements-bench.txt` or "
    "`pip install .[bench]`",
  )
  tfra_short = "skipped (--no-tfra)" if args.no_tfra or de is not None else "TFRA not installed"

  n, dim, bsz = args.keys, args.dim, args.batch
  rng = np.random.default_rng(args.seed)
  results = {
    "config": {
      k: getattr(args, k)
      for k in (
        "keys",
        "dim",
        "batch",
        "zipf",
        "repeats",
        "warmup",
        "num_batches",
        "insert_batch",
        "seed",
      )
    },
    "versions": versions(tf, tf_ext, np, tfra=tfra_version),
  }

  # -- threads ------------------------------------------------------------------------------
  cpus = cpus_available()
  intra_cfg = tf.config.threading.get_intra_op_parallelism_threads()
  inter_cfg = tf.config.threading.get_inter_op_parallelism_threads()
  threads = {
    "cpus_available": cpus,
    "intra_op_parallelism_threads": intra_cfg,
    "inter_op_parallelism_threads": inter_cfg,
    "intra_op_effective": intra_cfg or cpus,
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
  }
  results["threads"] = threads

  print("== tf_ext lookup benchmark ==")
  machine_report(tf, tf_ext, np, cpu_features=args.dedup)
  print(f"TFRA         : {tfra_status}")
  intra_default = "" if intra_cfg else f" (TensorFlow default: one per available CPU -> {cpus})"
  print(
    f"threads      : intra_op_parallelism_threads={intra_cfg}"
    f"{intra_default}, "
    f"inter_op_parallelism_threads={inter_cfg}{' (default)' if not inter_cfg else ''}, "
    f"OMP_NUM_THREADS={threads['omp_num_threads'] or 'unset'}"
  )
  print(
    f"workload     : {n:,} keys x dim {dim} float32; {args.num_batches} batches of {bsz:,} "
    f"Zipf({args.zipf:g}) ids; {args.warmup} warm-up + {args.repeats} timed rounds, interleaved"
  )

  # -- data ---------------------------------------------------------------------------------
  t0 = time.perf_counter()
  keys = make_keys(n, rng)
  rows = rng.standard_normal((n, dim), dtype=np.float32)
  row_batches = make_zipf_batches(n, bsz, args.num_batches, args.zipf, rng)
  key_batches = keys[row_batches]
  uniques = [np.unique(b).size for b in row_batches[:5]]
  counts = np.bincount(row_batches[0], minlength=n)
  top = np.sort(counts)[::-1]
  hot_share = top[: max(1, n // 1000)].sum() / bsz
  log(f"[data] generated keys, rows and batches in {time.perf_counter() - t0:.1f}s")
  print(
    f"id stats     : ~{statistics.mean(uniques):,.0f} distinct ids per batch "
    f"({statistics.mean(uniques) / bsz:.1%}); "
    f"the hottest 0.1% of rows get {hot_share:.1%} of lookups"
  )
  results["id_stats"] = {
    "distinct_per_batch": statistics.mean(uniques),
    "top_0.1pct_share": float(hot_share),
  }

  if args.dedup:
    import _lookup_dedup  # pylint: disable=import-outside-toplevel

    _lookup_dedup.run(args, tf, tf_ext, key_batches, keys, rng, results)
    return finish(results, args.json, wall_start)

  tf_row_batches = [tf.constant(b) for b in row_batches]
  tf_key_batches = [tf.constant(b) for b in key_batches]

  # -- tf_ext table -------------------------------------------------------------------------
  rss0 = rss_bytes()
  table = tf_ext.DynamicEmbeddingVariable(
    "bench_lookup", dim, key_dtype=tf.int64, initializer="zeros"
  )
  progress = Progress("tf_ext insert", n)
  t0 = time.perf_counter()
  for start in range(0, n, args.insert_batch):
    stop = min(n, start + args.insert_batch)
    table.insert(keys[start:stop], rows[start:stop])
    progress.update(stop)
  build_s = time.perf_counter() - t0
  gc.collect()
  rss1 = rss_bytes()
  size = int(table.size())
  table_bytes = int(table.memory_bytes())
  print(
    f"tf_ext table : size {size:,}, built in {build_s:.2f}s "
    f"({n / build_s / 1e6:.2f} M keys/s insert), "
    f"memory_bytes {mib(table_bytes)}, "
    f"RSS growth {mib(None if rss0 is None else rss1 - rss0)} (context)"
  )
  if size != n:
    print(f"WARNING: tf_ext table size {size} != {n} inserted distinct keys")

  # -- dense variable -----------------------------------------------------------------------
  dense = tf.Variable(rows, name="bench_dense")
  print(
    f"dense        : tf.Variable {list(dense.shape)} float32, {mib(dense.shape.num_elements() * 4)}"
  )

  # -- TFRA ---------------------------------------------------------------------------------
  tfra_var = tfra_shadow = None
  if de is not None:
    tfra_var, tfra_shadow, failed = build_tfra(tf, de, args, keys, rows)
    if failed:
      tfra_status, tfra_short = failed
  del rows
  gc.collect()

  # -- the lookups, as tf.functions ---------------------------------------------------------
  spec_ids = tf.TensorSpec([bsz], tf.int64)

  @tf.function(input_signature=[spec_ids], jit_compile=False)
  def tf_ext_lookup(ids):
    return table.lookup(ids)  # noqa: F821 (deleted after the timings, below)

  @tf.function(input_signature=[spec_ids], jit_compile=False)
  def dense_gather(rows_idx):
    return tf.gather(dense, rows_idx)  # noqa: F821 (likewise)

  methods = {
    "tf_ext": (tf_ext_lookup, tf_key_batches),
    "dense_gather": (dense_gather, tf_row_batches),
  }
  if tfra_var is not None:

    @tf.function(input_signature=[spec_ids], jit_compile=False)
    def tfra_lookup(ids):
      return tfra_var.lookup(ids)

    methods["tfra"] = (tfra_lookup, tf_key_batches)

    @tf.function(input_signature=[spec_ids], jit_compile=False)
    def tfra_embedding_lookup(ids):
      return de.shadow_ops.embedding_lookup(tfra_shadow, ids, name="bench_tfra_embedding_lookup")

    methods["tfra_embedding_lookup"] = (tfra_embedding_lookup, tf_key_batches)

  # Correctness first: every method must return the same rows.
  reference = dense_gather(tf_row_batches[0]).numpy()
  correct = {}
  for name, (fn, batches) in methods.items():
    got = fn(batches[0]).numpy()
    correct[name] = bool(got.shape == reference.shape and np.array_equal(got, reference))
    if not correct[name]:
      print(f"WARNING: {name} returned different rows from the dense gather for batch 0")
  print("same rows    : " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in correct.items()))
  del reference, got
  results["outputs_match_dense"] = correct

  log(f"[time] {args.warmup} warm-up + {args.repeats} timed rounds over {len(methods)} methods ...")
  times, cpu_times = timed_rounds(methods, args.warmup, args.repeats)
  keys_per_round = args.num_batches * bsz
  throughput = {}
  print()
  print(
    f"lookup throughput ({args.num_batches} x {bsz:,} ids per round; "
    f"median of {args.repeats} rounds; "
    f"CPU-ns/key = process CPU time, all threads; min..max M keys/s in brackets):"
  )
  labels = {
    "tf_ext": "tf_ext table.lookup",
    "dense_gather": "dense tf.gather",
    "tfra": "TFRA Variable.lookup (raw hashtable find)",
    "tfra_embedding_lookup": "TFRA embedding_lookup (training path, shadow_ops.ShadowVariable)",
  }
  width = max(len(v) for v in labels.values()) + 2
  for name, ts in times.items():
    med = statistics.median(ts)
    cpu_ns = statistics.median(cpu_times[name]) / keys_per_round * 1e9
    throughput[name] = {
      "keys_per_s": keys_per_round / med,
      "median_round_s": med,
      "round_s": ts,
      "median_batch_ms": med / args.num_batches * 1e3,
      "cpu_ns_per_key": cpu_ns,
      "round_cpu_s": cpu_times[name],
    }
    print(
      f"  {labels[name]:<{width}}{fmt_rate(keys_per_round / med)}   "
      f"{med / args.num_batches * 1e3:7.2f} ms/batch  {cpu_ns:6.1f} CPU-ns/key  "
      f"[{keys_per_round / max(ts) / 1e6:.2f}..{keys_per_round / min(ts) / 1e6:.2f}]"
    )
  for name in ("tfra", "tfra_embedding_lookup"):
    if name not in times:
      print(f"  {labels[name]:<{width}}     n/a         ({tfra_short})")
  if "tfra_embedding_lookup" in times:
    print(
      f"  training path = {TFRA_EMBEDDING_API}\n"
      "    (the TF2 route: ShadowVariable created once, eagerly, before tracing; "
      "in the tf.function each\n"
      "    call assigns the ids, runs CuckooHashTableFind, "
      "assigns the rows to the ShadowVariable and\n"
      "    reads them back; forward only, no GradientTape)"
    )
  results["throughput"] = throughput
  results["tfra_embedding_api"] = (
    None if "tfra_embedding_lookup" not in times else TFRA_EMBEDDING_API
  )

  def ratio(a, b):
    """Median ratio of keys/s a/b, and the per-round median (robust to drifting noise)."""
    if a not in times or b not in times:
      return None, None
    return ratio_of_medians(times[b], times[a]), median_of_ratios(times[b], times[a])

  r_gather, r_gather_rounds = ratio("tf_ext", "dense_gather")
  r_tfra, r_tfra_rounds = ratio("tf_ext", "tfra")
  r_emb, r_emb_rounds = ratio("tf_ext", "tfra_embedding_lookup")

  def cpu_ratio(a, b):
    if a not in cpu_times or b not in cpu_times:
      return None
    return ratio_of_medians(cpu_times[b], cpu_times[a])

  c_gather, c_tfra = cpu_ratio("tf_ext", "dense_gather"), cpu_ratio("tf_ext", "tfra")
  c_emb = cpu_ratio("tf_ext", "tfra_embedding_lookup")
  print()
  print(
    "ratios (wall keys/s of tf_ext over the baseline; "
    "[per-round median], (CPU-time ratio, context)):"
  )

  def ratio_line(label, value, rounds, cpu, note):
    if value is None:
      print(f"  {label:<38}:    n/a   {note} ({tfra_short})")
    else:
      print(f"  {label:<38}: {value:6.2f}x  [{rounds:.2f}x]  ({cpu:.2f}x CPU)   {note}")

  ratio_line(
    "tf_ext / dense gather",
    r_gather,
    r_gather_rounds,
    c_gather,
    f"target >= {LOOKUP_VS_GATHER_TARGET}",
  )
  ratio_line(
    "tf_ext / TFRA embedding_lookup (train)",
    r_emb,
    r_emb_rounds,
    c_emb,
    f"target >= {LOOKUP_VS_TFRA_TARGET:g} (the TFRA target is judged on this training-path ratio)",
  )
  ratio_line(
    "tf_ext / TFRA Variable.lookup (raw)",
    r_tfra,
    r_tfra_rounds,
    c_tfra,
    "context only (raw hashtable find, not what a TFRA model calls)",
  )
  results["ratios"] = {
    "tf_ext_over_dense_gather": r_gather,
    "tf_ext_over_dense_gather_per_round_median": r_gather_rounds,
    "tf_ext_over_tfra_embedding_lookup": r_emb,
    "tf_ext_over_tfra_embedding_lookup_per_round_median": r_emb_rounds,
    "tf_ext_over_tfra": r_tfra,
    "tf_ext_over_tfra_per_round_median": r_tfra_rounds,
    "cpu_time_tf_ext_over_dense_gather": c_gather,
    "cpu_time_tf_ext_over_tfra_embedding_lookup": c_emb,
    "cpu_time_tf_ext_over_tfra": c_tfra,
  }

  # Free the lookup structures before the Adam table.
  del methods, tf_ext_lookup, dense_gather, dense, table
  if tfra_var is not None:
    del tfra_lookup, tfra_embedding_lookup
    tfra_var = tfra_shadow = None
  tf_key_batches = tf_row_batches = None
  gc.collect()

  mem_ratio = memory_per_entry(tf, tf_ext, args, keys, table_bytes, results)

  # -- summary ------------------------------------------------------------------------------
  targets = {
    "tf_ext/dense_gather >= 0.6": (r_gather, r_gather >= LOOKUP_VS_GATHER_TARGET),
    "tf_ext/TFRA embedding_lookup >= 10": (
      r_emb,
      None if r_emb is None else r_emb >= LOOKUP_VS_TFRA_TARGET,
    ),
    "memory lookup table <= 1.25": (mem_ratio, mem_ratio <= MEMORY_TARGET),
  }
  print()
  print("targets (informational; the exit status is 0 regardless):")
  for name, (value, ok) in targets.items():
    shown = "n/a" if value is None else f"{value:.3f}"
    print(
      f"  {'SKIP' if ok is None else verdict(ok)}  {name:<34} measured {shown}"
      f"{'  (' + tfra_short + ')' if ok is None else ''}"
    )
  print(
    f"  INFO  {'tf_ext/TFRA Variable.lookup (raw)':<34} measured "
    f"{'n/a' if r_tfra is None else f'{r_tfra:.3f}'}  "
    f"(not the target: >= {LOOKUP_VS_TFRA_TARGET:g} is judged "
    f"on the training-path embedding_lookup ratio above)"
  )
  results["targets"] = {name: {"value": v, "pass": ok} for name, (v, ok) in targets.items()}

  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

#!/usr/bin/env python3
"""Frequency admission on a Zipf stream: memory saved, and the sketch's false admissions.

In one run:
  1. generates a stream of --updates ids, Zipf(--zipf) ranks (numpy's unbounded
     `Generator.zipf`: most ids are rare, as in ads and search logs) mixed by a 64-bit hash
     into random-looking int64 ids, in chunks of --chunk updates; chunk c is training step c;
  2. drives the stream through real tables, one at a time, with the table's training op (a
     zero-gradient SGD update, `tf_ext_table_apply_gradient`, the op the optimizers call):
     without admission, with exact counting (`FrequencyAdmission(k, exact=True)`) and with the
     count-min sketch (`FrequencyAdmission(k, sketch_bytes=...)`) for each k of --min-counts and
     each size of --sketch-mib;
  3. reports each table's rows and `memory_bytes()` (its sketch or exact counters included),
     the memory saved against the table without admission, and the sketch's false admissions:
     ids it gave a row that exact counting would not have (true count < k; found as the table's
     rows less those of the ids with >= k updates, which are looked up and counted by the
     table's `lookup_hits` statistic), as a fraction of the ids exact counting rejects and of
     those it admits; also the training updates the sketch let through that exact counting
     drops (the `rejected` statistics' difference: an id admitted early has more of them).

The table counts one update per id per training call (the optimizer sums an id's duplicates in a
batch first). So that every occurrence in the stream counts as one update, as if each came in its
own batch, the ids of a chunk are fed in rounds: round j updates the ids occurring more than j
times in the chunk, for j < max(--min-counts). Updates beyond the largest k per chunk are left
out: an id's admission depends only on its first k updates, and an admitted id no longer touches
the counters (a row found is updated, not counted), so every table sees exactly the admissions
of the full stream. The exact truth (each id's update count) is also computed with numpy and
checked against the exact tables.

The issue sets no target here, so there are no PASS/MISS lines; the exit status is 0. The
memory of the table without admission grows with the distinct ids (about 23 M for 100 M
updates: 2.2 GB at dim 16), and a run of 100 M updates takes about 10 minutes on 2 cores.

  python benchmarks/admission.py           # 100 M updates; k = 2, 5, 10; 1, 8, 64, 256 MiB
  python benchmarks/admission.py --quick   # 10 M updates
  python benchmarks/admission.py --min-counts 2 --sketch-mib 8 --json /tmp/admission.json
"""

import gc
import sys
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_json,
  argument_parser,
  int_list,
  log,
  mib,
  require_positive,
  use_checkout,
)
from _report import (
  finish,
  machine_report,
  versions,
)

use_checkout()


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--updates", type=int, default=100_000_000, help="ids in the stream")
  p.add_argument("--chunk", type=int, default=1_000_000, help="updates per training step")
  p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent (> 1, numpy's zipf)")
  p.add_argument("--dim", type=int, default=16, help="embedding width (float32)")
  p.add_argument("--min-counts", type=int_list, default=[2, 5, 10], help="values of min_count")
  p.add_argument(
    "--sketch-mib", type=int_list, default=[1, 8, 64, 256], help="sketch sizes (sketch_bytes), MiB"
  )
  p.add_argument("--sketch-depth", type=int, default=4, help="sketch rows")
  p.add_argument("--seed", type=int, default=0, help="numpy seed of the stream")
  p.add_argument("--quick", action="store_true", help="10 M updates, to develop")
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.updates = min(args.updates, 10_000_000)
  require_positive(p, args, ("updates", "chunk", "dim", "sketch_depth"))
  if args.zipf <= 1:
    p.error("--zipf must be > 1 (numpy's Zipf distribution)")
  if not args.min_counts or min(args.min_counts) < 2:
    p.error("--min-counts must be a list of integers >= 2")
  if not args.sketch_mib or min(args.sketch_mib) < 1:
    p.error("--sketch-mib must be a list of integers >= 1")
  return args


# ---- small helpers --------------------------------------------------------------------------


# ---- the stream -----------------------------------------------------------------------------


def hash_ids(ranks):
  """Zipf ranks -> distinct-looking non-negative int64 ids (splitmix64's finalizer: a bijection
  on 64 bits, then the top bit dropped)."""
  x = ranks.astype(np.uint64)
  x = x * np.uint64(0x9E3779B97F4A7C15)
  x ^= x >> np.uint64(30)
  x *= np.uint64(0xBF58476D1CE4E5B9)
  x ^= x >> np.uint64(27)
  x *= np.uint64(0x94D049BB133111EB)
  x ^= x >> np.uint64(31)
  return (x >> np.uint64(1)).astype(np.int64)


def make_stream(args, rounds):
  """Per chunk, the ids of each round (round j: the ids occurring more than j times), and the
  exact truth: every distinct id with its update count capped at `rounds`."""
  rng = np.random.default_rng(args.seed)
  chunks, all_ids, all_counts = [], [], []
  done = 0
  while done < args.updates:
    size = min(args.chunk, args.updates - done)
    ids, counts = np.unique(hash_ids(rng.zipf(args.zipf, size)), return_counts=True)
    counts = np.minimum(counts, rounds).astype(np.uint8)
    chunks.append([ids[counts > j] for j in range(rounds)])
    all_ids.append(ids)
    all_counts.append(counts)
    done += size
  ids = np.concatenate(all_ids)
  counts = np.concatenate(all_counts).astype(np.int64)
  del all_ids, all_counts
  order = np.argsort(ids, kind="stable")
  ids, counts = ids[order], counts[order]
  starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
  return chunks, ids[starts], np.add.reduceat(counts, starts)


# ---- main -----------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()

  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel
  from tf_ext import _ops_loader  # pylint: disable=import-outside-toplevel

  ops = _ops_loader.load()
  rounds = max(args.min_counts)
  print("== tf_ext admission benchmark ==")
  machine = machine_report(tf, tf_ext, np)
  print(
    f"workload     : {args.updates:,} updates of Zipf({args.zipf:g}) ids, dim {args.dim}, "
    f"steps of {args.chunk:,} updates (fed in up to {rounds} rounds per step, one occurrence "
    f"per id per round); min_count {args.min_counts}; sketches {args.sketch_mib} MiB x depth "
    f"{args.sketch_depth}"
  )
  results = {
    "config": {
      k: getattr(args, k)
      for k in (
        "updates",
        "chunk",
        "zipf",
        "dim",
        "min_counts",
        "sketch_mib",
        "sketch_depth",
        "seed",
        "quick",
      )
    },
    "versions": versions(tf, tf_ext, np),
    "machine": machine,
  }

  # -- the stream and the truth -------------------------------------------------------------
  t0 = time.perf_counter()
  chunks, truth_ids, truth_counts = make_stream(args, rounds)
  fed = sum(ids.size for chunk in chunks for ids in chunk)
  distinct = truth_ids.size
  should_admit = {k: int((truth_counts >= k).sum()) for k in args.min_counts}
  stream_s = time.perf_counter() - t0
  print(
    f"stream       : {distinct:,} distinct ids ({distinct / args.updates:.1%} of updates; "
    f"{int((truth_counts == 1).sum()) / distinct:.1%} seen once); "
    + ", ".join(f"{should_admit[k]:,} with >= {k} updates" for k in args.min_counts)
    + f"; {fed:,} updates fed per table; generated in {stream_s:.1f}s"
  )
  results["stream"] = {
    "distinct_ids": distinct,
    "seen_once": int((truth_counts == 1).sum()),
    "ids_with_at_least": should_admit,
    "updates_fed_per_table": fed,
    "generate_s": stream_s,
  }

  # The same chunks as tensors, made once; the truth stays as numpy arrays.
  chunk_tensors = [[tf.constant(ids) for ids in chunk if ids.size] for chunk in chunks]
  del chunks
  gc.collect()

  def run_table(label, admission, min_count=None):
    """Feeds the stream to a new table; returns its row of the report. With min_count: also
    how many of the ids with at least min_count updates have a row (looked up, counted by the
    table's lookup_hits), so that the rows of the others are the false admissions."""
    table = tf_ext.get_dynamic_embedding_variable(
      f"bench_admission_{len(tables)}", args.dim, initializer="zeros", admission=admission
    )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)])
    def update(ids, step):
      ops.tf_ext_table_apply_gradient(
        table=table.resource_handle,
        keys=ids,
        gradients=tf.zeros([tf.size(ids), args.dim]),
        learning_rate=0.0,
        beta1=0.0,
        beta2=0.0,
        epsilon=0.0,
        global_step=step,
        hyperparameters=[],
        dim=args.dim,
        optimizer="sgd",
      )

    t0 = time.perf_counter()
    for step, chunk in enumerate(chunk_tensors):
      step_tensor = tf.constant(step + 1, tf.int64)
      for ids in chunk:
        update(ids, step_tensor)
    seconds = time.perf_counter() - t0
    stats = {k: int(v) for k, v in table.statistics().items() if k != "lookup_hit_rate"}
    row = {"label": label, "seconds": seconds, "stats": stats}
    if min_count is not None:
      deserving = truth_ids[truth_counts >= min_count]
      for start in range(0, deserving.size, 1 << 20):
        table.lookup(deserving[start : start + (1 << 20)])
      present = int(table.statistics()["lookup_hits"]) - stats["lookup_hits"]
      row.update(
        min_count=min_count,
        false_admissions=stats["size"] - present,
        missed_admissions=deserving.size - present,
      )
    log(f"[table] {label}: {stats['size']:,} rows, {mib(stats['bytes'])}, fed in {seconds:.1f}s")
    return row

  tables = results["tables"] = []

  def add_table(label, admission, min_count=None, **facts):
    row = run_table(label, admission, min_count)
    gc.collect()  # the table and its tf.function, before the next table
    row.update(facts)
    tables.append(row)
    return row

  row = add_table("no admission", None)
  none_bytes, none_rows = row["stats"]["bytes"], row["stats"]["size"]
  if none_rows != distinct:
    print(f"WARNING: the table without admission has {none_rows:,} rows, not {distinct:,}")
  exact_rejected = {}
  for k in args.min_counts:
    row = add_table(
      f"exact, min_count={k}", tf_ext.FrequencyAdmission(min_count=k, exact=True), k, kind="exact"
    )
    if row["false_admissions"] or row["missed_admissions"]:
      print(
        f"WARNING: exact counting admitted {row['stats']['size']:,} ids "
        f"({row['false_admissions']:,} with fewer than {k} updates); the stream has "
        f"{should_admit[k]:,} with >= {k}"
      )
    exact_rejected[k] = row["stats"]["rejected"]
    for size_mib in args.sketch_mib:
      add_table(
        f"sketch {size_mib} MiB, min_count={k}",
        tf_ext.FrequencyAdmission(
          min_count=k, sketch_bytes=size_mib << 20, sketch_depth=args.sketch_depth
        ),
        k,
        kind="sketch",
        sketch_mib=size_mib,
      )

  # -- report -------------------------------------------------------------------------------
  print()
  print(
    f"{'table':<26} {'rows':>12} {'memory_bytes':>14} {'saved':>7}   "
    f"{'false adm.':>11} {'/ rejected':>10} {'/ admitted':>10}   {'early updates':>13}"
  )
  for row in tables:
    s = row["stats"]
    saved = 1 - s["bytes"] / none_bytes
    row["memory_saved"] = saved
    line = f"{row['label']:<26} {s['size']:>12,} {mib(s['bytes']):>14} {saved:>7.1%}   "
    if "min_count" in row:
      k = row["min_count"]
      rejected_by_exact = distinct - should_admit[k]
      row["false_admission_rate_of_rejected"] = row["false_admissions"] / max(1, rejected_by_exact)
      row["false_admission_rate_of_admitted"] = row["false_admissions"] / max(1, should_admit[k])
      # Updates exact counting drops and this table applied: ids admitted early get more.
      row["early_updates"] = exact_rejected[k] - s["rejected"]
      line += (
        f"{row['false_admissions']:>11,} {row['false_admission_rate_of_rejected']:>10.2%} "
        f"{row['false_admission_rate_of_admitted']:>10.1%}   "
        f"{row['early_updates'] / max(1, exact_rejected[k]):>12.1%}"
      )
      if row.get("missed_admissions"):
        line += f"  WARNING: {row['missed_admissions']:,} ids with >= {k} updates have no row"
    print(line)
  print(
    "  saved: 1 - memory_bytes / memory_bytes without admission (sketch or exact counters "
    "included);\n"
    "  false adm.: ids given a row with fewer than min_count updates, / the ids exact counting "
    "rejected\n"
    "  and / the ids it admitted; early updates: updates applied that exact counting drops, / "
    "those it drops"
  )

  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

#!/usr/bin/env python3
"""Memory of small dynamic embedding tables, and the lookup speed of a large one.

In one run:
  1. creates --tables tables, each filled with --ids random int64 ids at --dim (`insert`), and
     reports a table's `memory_bytes()` per id and against the raw payload
     ids x (8 + 4 x dim) bytes (target <= 2x), and the process's RSS growth per table (the
     tables' entries as the allocator sees them) for the empty tables, the filled ones, and
     after one Adam step over every id of every table (two slots per row), against the payload
     with slots ids x (8 + 3 x 4 x dim);
  2. sweeps table sizes (--sweep) for memory_bytes per id against the payload, lookup-only;
  3. checks that a large table keeps its lookup speed: runs benchmarks/lookup.py --no-tfra (its
     defaults: 1 M ids, dim 64, 20 batches of 65,536 Zipf(1.2) ids) in a subprocess and reports
     its tf_ext / dense tf.gather ratio (lookup.py's target: >= 0.6). Two builds of the library
     cannot load in one process, so an earlier build is compared only when given: --previous DIR
     (a directory whose tf_ext/ holds it, e.g. a built checkout of the previous release) runs
     lookup.py alternately against each, --lookup-runs times. Without it, the previous core's
     figure is docs/benchmarks.md's: 0.71x and 0.72x in two runs on this machine (0.67x, 0.66x,
     0.65x in three earlier `make bench` runs). Compare ratios, not absolute speeds, on a shared
     machine.

The PASS/MISS lines are informational: the exit status is 0 whatever the numbers.

  python benchmarks/small_tables.py                     # 300 tables of 1,000 ids, dim 16
  python benchmarks/small_tables.py --quick             # and a reduced lookup.py run
  python benchmarks/small_tables.py --no-lookup --json /tmp/small_tables.json
  python benchmarks/small_tables.py --previous ../main --lookup-runs 3   # A/B against a build
"""

import gc
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  REPO,
  add_json,
  argument_parser,
  int_list,
  log,
  require_positive,
  rss_bytes,
  use_checkout,
)
from _report import (
  finish,
  machine_report,
  verdict,
  versions,
)

use_checkout()
_HERE = os.path.dirname(os.path.abspath(__file__))

SMALL_TABLE_TARGET = 2.0  # memory_bytes / raw payload of a 1,000-id dim-16 table, at most
LOOKUP_VS_GATHER_TARGET = 0.6  # lookup.py's target, tf_ext lookup / dense tf.gather
PREVIOUS_LOOKUP_VS_GATHER = (0.71, 0.72)  # docs/benchmarks.md: lookup.py on the previous core
QUICK_LOOKUP_ARGS = "--keys 200000 --num-batches 5 --repeats 3 --no-adam"


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--ids", type=int, default=1000, help="ids per small table")
  p.add_argument("--dim", type=int, default=16, help="embedding width (float32)")
  p.add_argument("--tables", type=int, default=300, help="small tables, for the RSS figures")
  p.add_argument(
    "--sweep",
    type=int_list,
    default=[1, 10, 100, 1000, 3000, 10_000, 30_000, 100_000, 1_000_000],
    help="table sizes (ids) for the memory sweep",
  )
  p.add_argument(
    "--lookup-args",
    default="",
    help="extra arguments of benchmarks/lookup.py (always run with --no-tfra)",
  )
  p.add_argument("--no-lookup", action="store_true", help="skip the large-table lookup run")
  p.add_argument("--lookup-runs", type=int, default=1, help="runs of lookup.py (per library)")
  p.add_argument(
    "--previous",
    metavar="DIR",
    help="a directory whose tf_ext/ holds an earlier build (e.g. a checkout of the previous "
    "release, built): lookup.py then runs alternately against it and this checkout",
  )
  p.add_argument("--seed", type=int, default=0, help="numpy seed for ids")
  p.add_argument(
    "--quick", action="store_true", help=f"lookup.py with {QUICK_LOOKUP_ARGS}, sweep to 100k"
  )
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.lookup_args = f"{QUICK_LOOKUP_ARGS} {args.lookup_args}".strip()
    args.sweep = [n for n in args.sweep if n <= 100_000]
  if args.previous and not os.path.isfile(os.path.join(args.previous, "tf_ext", "__init__.py")):
    p.error(f"--previous {args.previous}: no tf_ext/__init__.py there")
  require_positive(p, args, ("ids", "dim", "tables", "lookup_runs"))
  if any(n < 1 for n in args.sweep):
    p.error("--sweep sizes must be >= 1")
  return args


# ---- small helpers --------------------------------------------------------------------------


# ---- main -----------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()

  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  ids, dim = args.ids, args.dim
  raw = ids * (8 + 4 * dim)
  raw_adam = ids * (8 + 3 * 4 * dim)
  print("== tf_ext small tables benchmark ==")
  machine = machine_report(tf, tf_ext, np)
  print(
    f"workload     : {args.tables} tables of {ids:,} int64 ids x dim {dim} float32; raw payload "
    f"{raw:,} B per table (8 + 4 x {dim} per id), {raw_adam:,} B with Adam's two slots"
  )
  results = {
    "config": {
      k: getattr(args, k) for k in ("ids", "dim", "tables", "sweep", "lookup_args", "seed")
    },
    "versions": versions(tf, tf_ext, np),
    "machine": machine,
  }
  rng = np.random.default_rng(args.seed)

  def new_table(name):
    return tf_ext.get_dynamic_embedding_variable(name, dim, initializer="zeros")

  def fill(table, n):
    keys = rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)
    table.insert(keys, np.ones((n, dim), np.float32))
    return keys

  adam = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(learning_rate=1e-3))

  def adam_step(table, keys):
    """One Adam step over every id, as a model trains (the table gains Adam's two slots)."""
    n = len(keys)
    gradient = tf.IndexedSlices(tf.ones([n, dim]), tf.constant(keys), tf.constant([n, dim]))
    adam.apply_gradients([(gradient, table.gradient_anchor)])

  # Warm up (op library, kernels, eager caches) so that RSS growth is the tables'.
  warm = new_table("bench_small_warmup")
  adam_step(warm, fill(warm, ids))
  del warm
  gc.collect()

  # -- many small tables: memory_bytes and RSS ------------------------------------------------
  # RSS growth per table, from before the tables: created empty, filled, after Adam (cumulative).
  stages = {}
  rss0 = rss_bytes()
  tables = [new_table(f"bench_small_{i}") for i in range(args.tables)]
  gc.collect()
  stages["created, empty"] = rss_bytes() - rss0
  empty_bytes = int(tables[0].memory_bytes())
  keys = [fill(t, ids) for t in tables]
  gc.collect()
  stages["filled"] = rss_bytes() - rss0
  sizes = {int(t.size()) for t in tables}
  table_bytes = [int(t.memory_bytes()) for t in tables]
  for t, k in zip(tables, keys):
    adam_step(t, k)
  gc.collect()
  stages["after one Adam step"] = rss_bytes() - rss0
  adam_bytes = [int(t.memory_bytes()) for t in tables]
  slots_shape = list(tables[0].export_with_slots()[2].shape)
  if sizes != {ids}:
    print(f"WARNING: table sizes {sorted(sizes)} != {ids}")
  del tables, keys
  gc.collect()

  lookup_bytes = float(np.mean(table_bytes))
  with_adam = float(np.mean(adam_bytes))
  ratio = lookup_bytes / raw
  adam_ratio = with_adam / raw_adam
  print()
  print(f"one table of {ids:,} ids (memory_bytes, mean of {args.tables}):")
  print(f"  empty                : {empty_bytes:>10,} B")
  print(
    f"  lookup-only          : {lookup_bytes:>10,.0f} B = {lookup_bytes / ids:7.1f} B/id vs raw "
    f"{8 + 4 * dim} B -> {ratio:.3f}x   target <= {SMALL_TABLE_TARGET:g}x"
  )
  print(
    f"  after one Adam step  : {with_adam:>10,.0f} B = {with_adam / ids:7.1f} B/id vs raw "
    f"{8 + 12 * dim} B -> {adam_ratio:.3f}x   (slots {slots_shape})"
  )
  print(
    f"RSS growth per table, {args.tables} tables (context: it also holds each table's Python and "
    "TF objects,\n  and the entries' old layout, freed to malloc when Adam adds the slots):"
  )
  empty_rss = stages["created, empty"]
  for stage, grown in stages.items():
    payload = {"filled": raw, "after one Adam step": raw_adam}.get(stage)
    vs = (
      f"  ({(grown - empty_rss) / args.tables / payload:.2f}x the payload, over the empty tables)"
      if payload
      else ""
    )
    print(f"  {stage:<20} : {grown / args.tables:>10,.0f} B{vs}")
  results["small_table"] = {
    "empty_bytes": empty_bytes,
    "lookup_bytes": lookup_bytes,
    "lookup_bytes_per_id": lookup_bytes / ids,
    "lookup_ratio": ratio,
    "adam_bytes": with_adam,
    "adam_bytes_per_id": with_adam / ids,
    "adam_ratio": adam_ratio,
    "rss_growth_per_table": {k: v / args.tables for k, v in stages.items()},
  }

  # -- sweep ----------------------------------------------------------------------------------
  print()
  print(f"memory_bytes per id by table size (lookup-only, dim {dim}, raw {8 + 4 * dim} B/id):")
  sweep = []
  for n in args.sweep:
    table = new_table(f"bench_small_sweep_{n}")
    fill(table, n)
    got = int(table.memory_bytes())
    sweep.append({"ids": n, "bytes": got, "ratio": got / (n * (8 + 4 * dim))})
    print(f"  {n:>9,} ids: {got:>12,} B  {got / n:9.1f} B/id  {sweep[-1]['ratio']:7.3f}x raw")
    del table
    gc.collect()
  results["sweep"] = sweep

  # -- a large table's lookup speed -------------------------------------------------------------
  gather_ratio = None
  if not args.no_lookup:
    libraries = {"this checkout": os.path.join(REPO, "tf_ext")}
    if args.previous:
      libraries["previous"] = os.path.join(os.path.abspath(args.previous), "tf_ext")
    runs = {name: [] for name in libraries}
    with tempfile.TemporaryDirectory() as tmp:
      # lookup.py imports the tf_ext next to its own folder: a copy of it beside a link to
      # each library's package.
      scripts = {}
      for i, (name, package) in enumerate(libraries.items()):
        os.makedirs(os.path.join(tmp, str(i), "benchmarks"))
        os.symlink(package, os.path.join(tmp, str(i), "tf_ext"))
        scripts[name] = os.path.join(tmp, str(i), "benchmarks", "lookup.py")
        for module in ("lookup.py", "_common.py"):
          shutil.copy(os.path.join(_HERE, module), os.path.dirname(scripts[name]))
      for run in range(args.lookup_runs):
        for name in libraries:  # alternating, so that machine noise hits both alike
          out = os.path.join(tmp, f"lookup_{run}.json")
          command = [sys.executable, scripts[name], "--no-tfra", "--json", out]
          command += shlex.split(args.lookup_args)
          log(f"[lookup] {name}, run {run + 1}: lookup.py --no-tfra {args.lookup_args}")
          proc = subprocess.run(command, capture_output=True, text=True, check=False)
          if proc.returncode != 0 or not os.path.exists(out):
            print(f"lookup.py failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
            print(proc.stderr[-2000:])
            continue
          with open(out) as f:
            lookup = json.load(f)
          runs[name].append(
            {
              "ratio": lookup["ratios"]["tf_ext_over_dense_gather"],
              "per_round": lookup["ratios"]["tf_ext_over_dense_gather_per_round_median"],
              "cpu_ratio": lookup["ratios"]["cpu_time_tf_ext_over_dense_gather"],
              "tf_ext_cpu_ns_per_key": lookup["throughput"]["tf_ext"]["cpu_ns_per_key"],
              "tf_ext_keys_per_s": lookup["throughput"]["tf_ext"]["keys_per_s"],
              "gather_keys_per_s": lookup["throughput"]["dense_gather"]["keys_per_s"],
              "memory_ratio": lookup["memory"]["lookup_ratio"],
              "config": lookup["config"],
            }
          )
    if runs["this checkout"]:
      cfg = runs["this checkout"][0]["config"]
      print()
      print(
        f"large table lookups (benchmarks/lookup.py --no-tfra {args.lookup_args}".rstrip()
        + f"): {cfg['keys']:,} ids x dim {cfg['dim']}, {cfg['num_batches']} batches of "
        f"{cfg['batch']:,}; tf_ext / dense tf.gather, wall [per-round median] (CPU time):"
      )
      for name, found in runs.items():
        for run in found:
          print(
            f"  {name:<14}: {run['ratio']:.2f}x [{run['per_round']:.2f}x] "
            f"({run['cpu_ratio']:.2f}x CPU)  tf_ext {run['tf_ext_keys_per_s'] / 1e6:6.2f} M "
            f"keys/s ({run['tf_ext_cpu_ns_per_key']:.0f} CPU-ns/key), gather "
            f"{run['gather_keys_per_s'] / 1e6:6.2f} M keys/s, memory {run['memory_ratio']:.3f}x raw"
          )
      gather_ratio = statistics.median(r["ratio"] for r in runs["this checkout"])
      if runs.get("previous"):
        previous = statistics.median(r["ratio"] for r in runs["previous"])
        print(
          f"  median: this checkout {gather_ratio:.2f}x, previous {previous:.2f}x -> "
          f"{gather_ratio / previous:.2f} of the previous library's ratio"
        )
      else:
        print(
          "  previous core (docs/benchmarks.md, same script and machine, not this run): "
          + " and ".join(f"{r:.2f}x" for r in PREVIOUS_LOOKUP_VS_GATHER)
          + "; --previous DIR runs an earlier build alternately"
        )
      results["large_table_lookup"] = {
        "runs": runs,
        "median_ratio": gather_ratio,
        "previous_core_readme": list(PREVIOUS_LOOKUP_VS_GATHER),
      }

  # -- summary ----------------------------------------------------------------------------------
  print()
  print("targets (informational; the exit status is 0 regardless):")
  print(
    f"  {verdict(ratio <= SMALL_TABLE_TARGET)}  {ids:,}-id dim-{dim} table <= "
    f"{SMALL_TABLE_TARGET:g}x raw payload       measured {ratio:.3f}x "
    f"({lookup_bytes / ids:.1f} B/id)"
  )
  if gather_ratio is not None:
    print(
      f"  {verdict(gather_ratio >= LOOKUP_VS_GATHER_TARGET)}  large table: tf_ext / dense gather "
      f">= {LOOKUP_VS_GATHER_TARGET:g}      measured {gather_ratio:.2f}x (lookup.py's target; "
      "the previous core measured "
      + "/".join(f"{r:.2f}x" for r in PREVIOUS_LOOKUP_VS_GATHER)
      + " in docs/benchmarks.md)"
    )
  results["targets"] = {
    "small_table_ratio": {"value": ratio, "pass": ratio <= SMALL_TABLE_TARGET},
    "large_table_lookup_vs_gather": {
      "value": gather_ratio,
      "pass": None if gather_ratio is None else gather_ratio >= LOOKUP_VS_GATHER_TARGET,
    },
  }

  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

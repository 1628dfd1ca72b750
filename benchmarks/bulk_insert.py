#!/usr/bin/env python3
"""Lookup stalls during bulk writes into a live multi-million-row table, and their throughput.

With a lookup loop running in another Python thread all along (batches of --lookup-batch random
ids of the table, each lookup timed, as benchmarks/eviction.py does), --repeats times per path:
a quiet window (no other work), the path, and a control window as long as the path in which one
core is kept busy by numpy (no table work). Paths, on a table of --keys random int64 ids at --dim:
  insert 400K / insert 1M   table.insert() of that many new ids (removed again between repeats);
  import                    import_with_slots() of the table's own export (every row);
  restore                   a full snapshot file restored into the live table
                            (TfExtTableRestoreSnapshots, what DeltaCheckpointManager runs).
It reports each path's time and keys/s, and the longest lookup per window (its stall).

Target: no lookup stall over 10 ms during any bulk insert, import or restore.
The control and quiet windows show the machine's own stalls. The PASS/MISS lines are
informational: the exit status is 0 whatever the numbers.

  python benchmarks/bulk_insert.py               # 4 M ids, dim 16, 5 repeats
  python benchmarks/bulk_insert.py --quick       # 2 M ids, 2 repeats, for development
"""

import gc
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_intra_op_threads,
  add_json,
  argument_parser,
  log,
  require_positive,
  use_checkout,
)
from _lookup_stalls import (
  LookupLoop,
  busy_one_core,
  summarize_windows,
)
from _report import (
  finish,
  machine_report,
  verdict,
  versions,
)

use_checkout()

STALL_TARGET_MS = 10.0  # the longest lookup during a bulk write, at most


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--keys", type=int, default=4_000_000, help="distinct ids in the table")
  p.add_argument("--dim", type=int, default=16, help="embedding width (float32)")
  p.add_argument("--lookup-batch", type=int, default=4096, help="ids per concurrent lookup")
  p.add_argument("--repeats", type=int, default=5, help="runs per path (each with its windows)")
  add_intra_op_threads(p)
  p.add_argument("--seed", type=int, default=0, help="numpy seed for ids")
  p.add_argument("--quick", action="store_true", help="2 M ids and 2 repeats, to develop")
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.keys = min(args.keys, 2_000_000)
    args.repeats = min(args.repeats, 2)
  require_positive(p, args, ("keys", "dim", "lookup_batch", "repeats"))
  return args


def measure_path(name, rows, lookup, batches, repeats, path, undo):
  """`repeats` times: a quiet window, `path()`, a control window as long, then `undo()`."""
  lookup(batches[0])  # traced and warm
  windows = {"writing": [], "control": [], "quiet": []}
  seconds = []
  gc.collect()
  gc.disable()
  try:
    with LookupLoop(lookup, batches) as loop:
      for _ in range(repeats):
        with loop.window() as quiet:
          time.sleep(max(seconds[-1] if seconds else 0.5, 0.5))
        with loop.window() as during:
          path()
        seconds.append(during.end - during.begin)
        with loop.window() as control:
          busy_one_core(max(seconds[-1], 0.5))
        for kind, window in (("writing", during), ("quiet", quiet), ("control", control)):
          windows[kind].append(window.latencies())
        undo()
  finally:
    gc.enable()
  result = {
    "path": name,
    "rows": rows,
    "seconds": statistics.median(seconds),
    "seconds_each": seconds,
    "keys_per_s": rows / statistics.median(seconds),
    **{kind: summarize_windows(w, STALL_TARGET_MS) for kind, w in windows.items()},
  }
  log(
    f"[bulk] {name}: {rows:,} rows in {result['seconds']:.3f}s ({result['keys_per_s'] / 1e6:.2f} "
    f"M keys/s); longest lookup {result['writing']['longest_ms']:.2f} ms, control "
    f"{result['control']['longest_ms']:.2f} ms, quiet {result['quiet']['longest_ms']:.2f} ms"
  )
  return result


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  import tf_ext  # pylint: disable=import-outside-toplevel
  from tf_ext import _ops_loader  # pylint: disable=import-outside-toplevel

  ops = _ops_loader.load()
  print("== tf_ext bulk insert / import / restore benchmark ==")
  machine = machine_report(tf, tf_ext, np)
  print(
    f"threads      : intra_op_parallelism_threads="
    f"{tf.config.threading.get_intra_op_parallelism_threads()} (0: one per CPU)"
  )
  n, dim = args.keys, args.dim
  sizes = [s for s in (400_000, 1_000_000) if s <= n]
  rng = np.random.default_rng(args.seed)
  ids = np.unique(rng.integers(0, 2**63 - 1, size=n + sum(sizes) + n // 16, dtype=np.int64))
  rng.shuffle(ids)
  keys, fresh = ids[:n], ids[n : n + sum(sizes)]
  batches = [tf.constant(rng.choice(keys, args.lookup_batch, replace=False)) for _ in range(16)]
  print(f"workload     : {n:,} ids x dim {dim}; {args.repeats} repeats per path")

  table = tf_ext.get_dynamic_embedding_variable("bench_bulk_insert", dim, initializer="zeros")
  t0 = time.perf_counter()
  for start in range(0, n, 1 << 20):
    chunk = keys[start : start + (1 << 20)]
    table.insert(chunk, tf.ones([len(chunk), dim]))
  print(f"table        : {int(table.size()):,} rows, built in {time.perf_counter() - t0:.1f}s")

  @tf.function(input_signature=[tf.TensorSpec([args.lookup_batch], tf.int64)])
  def lookup(batch):
    return table.lookup(batch)

  paths = []
  offset = 0
  for size in sizes:
    new_ids = tf.constant(fresh[offset : offset + size])
    offset += size
    new_rows = tf.fill([size, dim], 2.0)
    paths.append(
      measure_path(
        f"insert {size:,} new ids",
        size,
        lookup,
        batches,
        args.repeats,
        lambda new_ids=new_ids, new_rows=new_rows: table.insert(new_ids, new_rows),
        lambda new_ids=new_ids: table.remove(new_ids),
      )
    )
  exported = table.export_with_slots()
  paths.append(
    measure_path(
      "import (the table's own export)",
      n,
      lookup,
      batches,
      args.repeats,
      lambda: table.import_with_slots(*exported),
      lambda: None,
    )
  )
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "full.snapshot")
    ops.tf_ext_table_save_snapshot(
      table.resource_handle, path, since_version=-1, chain_id=1, sequence=0, step=0, track=False
    )
    paths.append(
      measure_path(
        "restore (a full snapshot file)",
        n,
        lookup,
        batches,
        args.repeats,
        lambda: ops.tf_ext_table_restore_snapshots(
          table.resource_handle, [path], track=True, verify_only=False
        ),
        lambda: None,
      )
    )
  if int(table.size()) != n:
    print(f"WARNING: table size {int(table.size()):,} != {n:,} at the end")

  print()
  print(
    f"lookups of {args.lookup_batch:,} ids in another thread, longest per window (ms, median / "
    "max over the repeats); throughput: median time"
  )
  print(f"  {'path':<34} {'keys/s':>10} {'writing':>17} {'control':>17} {'quiet':>17}")
  for r in paths:
    cells = [
      f"{r[k]['median_longest_ms']:7.2f} / {r[k]['longest_ms']:7.2f}"
      for k in ("writing", "control", "quiet")
    ]
    print(f"  {r['path']:<34} {r['keys_per_s'] / 1e6:8.2f} M {cells[0]} {cells[1]} {cells[2]}")
  print()
  print("targets (informational; the exit status is 0 regardless):")
  for r in paths:
    longest = r["writing"]["longest_ms"]
    print(
      f"  {verdict(longest <= STALL_TARGET_MS)}  stall, {r['path']} <= {STALL_TARGET_MS:g} ms: "
      f"{longest:.2f} ms (control {r['control']['longest_ms']:.2f} ms)"
    )
  results = {
    "config": {k: getattr(args, k) for k in ("keys", "dim", "lookup_batch", "repeats", "quick")},
    "versions": versions(tf, tf_ext, np),
    "machine": machine,
    "paths": paths,
  }
  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

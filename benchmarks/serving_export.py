#!/usr/bin/env python3
"""Memory and time of the serving export of a 10 M-row dynamic embedding table (dim 16).

tf_ext.saved_model.export_for_serving writes a SavedModel of core TensorFlow ops only, each
table a core MutableHashTable restored from the SavedModel's variables. In one run, each
measurement in a fresh worker process (so that one path's memory does not hide another's peak),
both on the same table (--keys random int64 ids, --dim floats, rows only):
  1. streamed: the export as it is, which streams each table's rows into the variables in
     slices of TF_EXT_SERVING_EXPORT_CHUNK_BYTES (TfExtTableWriteServingBundle).
  2. whole (the anchor): the export before streaming, which exported the table into tensors,
     filled a core table with them and saved that: the same code with streaming turned off.
Each reports the export's time, the variables' bytes and the peak RSS the export added (the
process's high-water mark, reset through /proc/self/clear_refs before the export, after
malloc_trim). Target: extra RSS of the streamed export <= 256 MiB, as for checkpoints. The
PASS/MISS line is informational: the exit status is 0 whatever the numbers.

  python benchmarks/serving_export.py           # 10 M ids, dim 16
  python benchmarks/serving_export.py --quick   # 1 M ids, for development
"""

import argparse
import json
import os
import sys
import time

from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  PeakRssAdded,
  add_json,
  argument_parser,
  log,
  mib,
  require_positive,
  run_workers,
  use_checkout,
)
from _report import (
  finish,
  machine_report,
  verdict,
  versions,
)

use_checkout(measures_peak_rss=True)

RSS_TARGET = 256 << 20
PATHS = {"streamed": "streamed (tf_ext)", "whole": "whole tensors (before)"}


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--keys", type=int, default=10_000_000, help="distinct ids in the table")
  p.add_argument("--dim", type=int, default=16, help="embedding width (float32)")
  p.add_argument("--quick", action="store_true", help="1 M ids instead of --keys")
  p.add_argument("--dir", help="where exports go (default: a temporary folder, removed)")
  p.add_argument("--worker", choices=tuple(PATHS), help=argparse.SUPPRESS)
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.keys = 1_000_000
  require_positive(p, args, ["keys", "dim"])
  return args


def _build_model(tf, tf_ext, np, keys, dim):
  """A tf.Module serving the rows of a table of `keys` random ids."""
  table = tf_ext.DynamicEmbeddingVariable("bench_table", dim, initializer="zeros")
  rng = np.random.default_rng(0)
  ids = np.unique(rng.integers(0, 2**62, int(keys * 1.01)))[:keys]
  rng.shuffle(ids)
  batch = 1_000_000
  for start in range(0, len(ids), batch):
    chunk = ids[start : start + batch]
    table.insert(chunk, rng.normal(size=(len(chunk), dim)).astype(np.float32))
    log(f"  built {min(start + batch, len(ids)):,} of {len(ids):,} rows")

  class Rows(tf.Module):
    def __init__(self):
      super().__init__()
      self.table = table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def rows(self, ids):
      return {"rows": self.table.lookup(ids)}

  return Rows(), table


def _folder_bytes(folder):
  return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def run_worker(args):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel
  from tf_ext.dynamic_embedding.saved_model import serving  # pylint: disable=import-outside-toplevel

  if args.worker == "whole":
    serving._streams = lambda table: False  # pylint: disable=protected-access
  model, table = _build_model(tf, tf_ext, np, args.keys, args.dim)
  export = os.path.join(args.dir, args.worker)
  with PeakRssAdded() as peak:
    start = time.perf_counter()
    exported = tf_ext.saved_model.export_for_serving(model, export)
    seconds = time.perf_counter() - start
  log(f"  {args.worker}: {seconds:.2f}s, extra RSS {mib(peak.bytes)}")
  result = {
    "seconds": seconds,
    "extra_rss": peak.bytes,
    "rows": exported[table.name],
    "table_bytes": int(table.memory_bytes()),
    "variables_bytes": _folder_bytes(os.path.join(export, "variables")),
  }
  print(json.dumps(result))
  return 0


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    return run_worker(args)
  wall_start = time.perf_counter()
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  machine = machine_report(tf, tf_ext, np)
  measured = run_workers(__file__, args, PATHS, [], "tf_ext_serving_bench_")

  table_bytes = measured["streamed"]["table_bytes"]
  print(f"\ntable: {args.keys:,} rows, dim {args.dim}: {mib(table_bytes)} in memory")
  print(f"{'export':<26}{'rows':>12}{'time':>9}{'extra RSS':>16}{'variables bytes':>18}")
  for worker, label in PATHS.items():
    row = measured[worker]
    print(
      f"{label:<26}{row['rows']:>12,}{row['seconds']:>8.2f}s{mib(row['extra_rss']):>16}"
      f"{row['variables_bytes']:>18,}"
    )
  streamed, whole = measured["streamed"], measured["whole"]
  extra = streamed["extra_rss"]
  print(
    f"streamed export: extra RSS {mib(extra)} (target <= 256 MiB): "
    f"{verdict(extra is not None and extra <= RSS_TARGET)}; the whole-tensor export added "
    f"{mib(whole['extra_rss'])}; time ratio to it {streamed['seconds'] / whole['seconds']:.2f}"
  )
  results = {
    "machine": machine,
    "versions": versions(tf, tf_ext, np),
    "keys": args.keys,
    "dim": args.dim,
    **measured,
  }
  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

"""The cost of initial rows through the ops: a lookup of ids no table holds, by initializer.

Each missing id's row is computed from the id and the seed (kernels/dynamic_embedding/core/
initializers.h), so a lookup of N missing ids costs N initial rows plus the probes. The
initializers are timed in interleaved rounds, best of --rounds (the machine may be shared).

  python benchmarks/initial_rows.py [--ids 65536] [--dim 8] [--rounds 40]

benchmarks/initial_rows_bench.cc times FillInitialRow alone, in C++.
"""

import time

from _common import argument_parser, use_checkout  # noqa: E402
from _report import machine_report  # noqa: E402

use_checkout()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext  # noqa: E402


def main():
  p = argument_parser(__doc__)
  p.add_argument("--ids", type=int, default=65536, help="missing ids per lookup")
  p.add_argument("--dim", type=int, default=8, help="row width")
  p.add_argument("--rounds", type=int, default=40, help="interleaved rounds (the best is kept)")
  args = p.parse_args()
  machine_report(tf, tf_ext, np)
  cases = {"uniform": tf_ext.InitializerSpec("uniform", -0.05, 0.05, 0)}
  for kind in ("normal", "truncated_normal"):
    for version in (1, 2):
      cases[f"{kind} v{version}"] = tf_ext.InitializerSpec(kind, 0.0, 0.01, 0, version=version)
  lookups = {}
  for name, spec in cases.items():
    table = tf_ext.DynamicEmbeddingVariable(name.replace(" ", "_"), args.dim, initializer=spec)
    lookups[name] = table.lookup  # eager: one op per call, next to milliseconds of rows
  warm = tf.constant(np.arange(args.ids, dtype=np.int64))
  for lookup in lookups.values():
    lookup(warm)
  best = dict.fromkeys(cases, float("inf"))
  for r in range(args.rounds):
    ids = tf.constant(np.arange(args.ids, dtype=np.int64) * 7919 + (r + 1) * 10**12)
    for name, lookup in lookups.items():
      start = time.perf_counter()
      lookup(ids).numpy()
      best[name] = min(best[name], time.perf_counter() - start)
  print(f"lookup of {args.ids:,} missing ids, dim {args.dim}, best of {args.rounds} rounds:")
  for name, seconds in best.items():
    print(f"  {name:<20} {seconds * 1e3:7.2f} ms  {seconds / args.ids * 1e9:6.1f} ns per row")


if __name__ == "__main__":
  main()

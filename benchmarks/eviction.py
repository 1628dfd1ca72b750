#!/usr/bin/env python3
"""Eviction of 10 % of a 10 M-entry dynamic embedding table: time, lookup stalls and peak memory.

In one run:
  1. builds a tf_ext table of --keys random int64 ids at --dim (inserted in big batches), then
     gives the rows --groups distinct last-update steps: group g (an equal share of the ids,
     scattered over every shard) gets one zero-gradient SGD update at step g + 1, through
     tf_ext.DynamicEmbeddingOptimizer, so the oldest group (1/--groups, 10 % by default) is what
     a policy condemns;
  2. for each eviction path, with a lookup loop running in another Python thread all along
     (batches of --lookup-batch random ids of the table, each lookup timed with
     time.perf_counter; TF ops release the GIL), --repeats times: a quiet window (no other
     work), the path removing the oldest group, and a control window of the same length in
     which one core is kept busy by numpy (no table work); the removed group is put back
     between repeats. It reports the path's time, the lookups' latencies in each kind of window
     (the longest lookup of a window is its stall) and the peak RSS the path added (the
     process's high-water mark, reset through /proc/self/clear_refs before the path, after
     malloc_trim gave free heap memory back, and with TF_ENABLE_ONEDNN_OPTS=0, whose allocator
     gives large tensors back: so that memory an earlier path freed does not hide a peak);
  3. paths: tf_ext `table.evict()` with EvictionPolicy(ttl_steps) and with
     EvictionPolicy(max_size) (LRU), inside the table, shard by shard; TFRA's own way, when
     tensorflow-recommenders-addons is installed: a `de.Variable` with
     `restrict_policy=de.TimestampRestrictPolicy` (a second table of int32 timestamps) and
     `var.restrict(num_reserved)`, which exports the timestamp table, runs `top_k` over the
     negated timestamps and removes the victims; and that same export + `top_k` + remove run
     on the tf_ext table (`export_with_slots`, which also exports the rows: tf_ext has no
     export of keys and steps alone).

Target: no lookup stall over 10 ms while tf_ext evicts: the longest lookup of every eviction
window. On a shared or virtual machine a lookup can also wait for a core (this 2-vCPU VM stalls
tens of ms now and then with nothing else running): the quiet and control windows show those
stalls, and when the control stalls as long as the eviction, the excess is not the table's.
Python's garbage collector is paused while the loop runs so that its pauses do not count.
The PASS/MISS lines are informational: the exit status is 0 whatever the numbers.

  python benchmarks/eviction.py                  # 10 M ids, dim 16, evict 10 %, 5 repeats
  python benchmarks/eviction.py --quick          # 1 M ids, 3 repeats, for development
  python benchmarks/eviction.py --no-tfra --json /tmp/eviction.json

TFRA is optional: `pip install -r requirements-bench.txt`.
"""

import gc
import os
import statistics
import sys
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  PeakRssAdded,
  add_intra_op_threads,
  add_json,
  argument_parser,
  import_tfra,
  log,
  mib,
  require_positive,
  rss_bytes,
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

use_checkout(measures_peak_rss=True)

STALL_TARGET_MS = 10.0  # the longest lookup while tf_ext evicts, at most


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--keys", type=int, default=10_000_000, help="distinct ids in the table")
  p.add_argument("--dim", type=int, default=16, help="embedding width (float32)")
  p.add_argument(
    "--groups",
    type=int,
    default=10,
    help="rows get this many distinct last steps, in equal groups; the oldest group is evicted",
  )
  p.add_argument("--lookup-batch", type=int, default=4096, help="ids per concurrent lookup")
  p.add_argument(
    "--repeats", type=int, default=5, help="evictions per path (each with its windows)"
  )
  p.add_argument("--insert-batch", type=int, default=1 << 20, help="ids per insert/update call")
  add_intra_op_threads(p)
  p.add_argument("--seed", type=int, default=0, help="numpy seed for ids")
  p.add_argument("--no-tfra", action="store_true", help="skip TFRA's own restrict path")
  p.add_argument("--quick", action="store_true", help="1 M ids and 3 repeats, to develop")
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.keys = min(args.keys, 1_000_000)
    args.repeats = min(args.repeats, 3)
  require_positive(p, args, ("keys", "dim", "lookup_batch", "insert_batch", "repeats"))
  if args.groups < 2:
    p.error("--groups must be >= 2")
  if args.keys < args.groups:
    p.error("--keys must be >= --groups")
  return args


def measure_path(key, name, lookup, workload, path, restore):
  """`repeats` times: a quiet window, `path()` (returning the rows it removed), a control
  window as long as the path, then `restore()`; `lookup` loops in another thread all along."""
  lookup(workload.batches[0])  # traced and warm
  windows = {"quiet": [], "evicting": [], "control": []}
  seconds, removed = [], []
  peak_added = None
  gc.collect()
  gc.disable()
  try:
    with LookupLoop(lookup, workload.batches) as loop:
      for repeat in range(workload.args.repeats):
        expected = seconds[-1] if seconds else 0.5
        with loop.window() as quiet:
          time.sleep(max(expected, 0.5))
        with PeakRssAdded() as peak, loop.window() as during:
          removed.append(int(path()))
        seconds.append(during.end - during.begin)
        if peak.bytes is not None:
          peak_added = max(peak_added or 0, peak.bytes)
        with loop.window() as control:
          busy_one_core(max(seconds[-1], 0.5))
        for kind, window in (("quiet", quiet), ("evicting", during), ("control", control)):
          windows[kind].append(window.latencies())
        if repeat + 1 < workload.args.repeats:
          restore()
  finally:
    gc.enable()
  result = {
    "key": key,
    "path": name,
    "seconds": statistics.median(seconds),
    "seconds_each": seconds,
    "removed": removed,
    "peak_rss_added_bytes": peak_added,
    **{kind: summarize_windows(w, STALL_TARGET_MS) for kind, w in windows.items()},
  }
  log(
    f"[evict] {name}: {removed[0]:,} rows in {result['seconds']:.3f}s (median of "
    f"{len(seconds)}); longest lookup {result['evicting']['longest_ms']:.2f} ms, "
    f"control {result['control']['longest_ms']:.2f} ms, "
    f"quiet {result['quiet']['longest_ms']:.2f} ms"
  )
  return result


# ---- the paths ------------------------------------------------------------------------------


class Workload:
  """The ids, their last-step groups and the lookup batches every path shares."""

  def __init__(self, args, keys, bounds, batches):
    self.args, self.keys, self.bounds, self.batches = args, keys, bounds, batches
    self.n, self.dim, self.groups = len(keys), args.dim, args.groups
    self.victims = bounds[1]  # group 0
    self.spans = [(bounds[g], bounds[g + 1]) for g in range(args.groups)]

  def chunks(self, lo, hi):
    for start in range(lo, hi, self.args.insert_batch):
      yield start, min(hi, start + self.args.insert_batch)


def tf_ext_paths(tf, tf_ext, ops, w):
  """The tf_ext table, its two evictions, and TFRA's way run on it."""
  zeros = tf.zeros([min(w.args.insert_batch, w.n), w.dim])

  # Training updates as a model makes them: a zero-gradient SGD step through the wrapped
  # optimizer, which records its step counter (set here) as each row's last update step.
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(learning_rate=0.0))

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([], tf.int64)])
  def train_step(ids, step):
    optimizer.iterations.assign(step)
    n = tf.size(ids, out_type=tf.int64)
    shape = tf.stack([n, tf.constant(w.dim, tf.int64)])
    gradient = tf.IndexedSlices(tf.zeros([n, w.dim]), ids, shape)
    optimizer.apply_gradients([(gradient, table.gradient_anchor)])

  def train(lo, hi, step):
    """Trains keys[lo:hi] at `step`: sets their last step, and creates the missing rows."""
    for start, stop in w.chunks(lo, hi):
      train_step(tf.constant(w.keys[start:stop]), tf.constant(step, tf.int64))

  ttl_policy = tf_ext.EvictionPolicy(ttl_steps=w.groups - 1)  # idle >= groups - 1: group 0
  lru_policy = tf_ext.EvictionPolicy(max_size=w.n - w.victims)
  rss0 = rss_bytes()
  t0 = time.perf_counter()
  table = tf_ext.get_dynamic_embedding_variable(
    "bench_eviction", w.dim, initializer="zeros", eviction=ttl_policy
  )
  for start, stop in w.chunks(0, w.n):
    table.insert(w.keys[start:stop], zeros[: stop - start])
  insert_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for g, (lo, hi) in enumerate(w.spans):
    train(lo, hi, g + 1)
  steps_s = time.perf_counter() - t0
  gc.collect()
  table_bytes = int(table.memory_bytes())
  print(
    f"tf_ext table : size {int(table.size()):,}, memory_bytes {mib(table_bytes)}, RSS growth "
    f"{mib(None if rss0 is None else rss_bytes() - rss0)}; insert {insert_s:.1f}s, "
    f"last steps set in {steps_s:.1f}s"
  )

  @tf.function(input_signature=[tf.TensorSpec([w.args.lookup_batch], tf.int64)])
  def lookup(ids):
    return table.lookup(ids)

  def restore_group():
    train(*w.spans[0], 1)
    if int(table.size()) != w.n:
      print(f"WARNING: tf_ext table size {int(table.size())} != {w.n} after restoring group 0")

  def evict_lru():
    return ops.tf_ext_table_evict(
      table.resource_handle, tf.constant(-1, tf.int64), **lru_policy.op_attrs()
    )

  def tfra_way():
    exported_keys, _, _, _, last_steps, _ = table.export_with_slots()
    _, picked = tf.math.top_k(-last_steps, w.victims, sorted=False)
    table.remove(tf.gather(exported_keys, picked))
    return w.n - int(table.size())

  paths = [
    measure_path(
      "ttl",
      f"tf_ext evict, EvictionPolicy(ttl_steps={w.groups - 1})",
      lookup,
      w,
      table.evict,
      restore_group,
    )
  ]
  restore_group()
  paths.append(
    measure_path(
      "max_size",
      f"tf_ext evict, EvictionPolicy(max_size={w.n - w.victims:,}) (LRU)",
      lookup,
      w,
      evict_lru,
      restore_group,
    )
  )
  restore_group()
  paths.append(
    measure_path(
      "tfra_way_on_tf_ext",
      "TFRA's way on the tf_ext table: export_with_slots + top_k + remove",
      lookup,
      w,
      tfra_way,
      restore_group,
    )
  )
  return paths, {"bytes": table_bytes, "insert_s": insert_s, "steps_s": steps_s}


def tfra_path(tf, de, w):
  """TFRA's own eviction: a TimestampRestrictPolicy and `restrict`."""
  zeros = tf.zeros([min(w.args.insert_batch, w.n), w.dim])
  rss0 = rss_bytes()
  t0 = time.perf_counter()
  var = de.get_variable(
    "bench_eviction_tfra",
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    dim=w.dim,
    initializer=tf.keras.initializers.Zeros(),
    restrict_policy=de.TimestampRestrictPolicy,
  )
  status = var.restrict_policy.status  # id -> int32 timestamp, what restrict ranks
  for g, (lo, hi) in enumerate(w.spans):
    for start, stop in w.chunks(lo, hi):
      ids = tf.constant(w.keys[start:stop])
      var.upsert(ids, zeros[: stop - start])
      status.upsert(ids, tf.fill([stop - start, 1], tf.constant(g + 1, tf.int32)))
  gc.collect()
  print(
    f"TFRA table   : size {int(var.size()):,} (+ timestamp table {int(status.size()):,}), "
    f"RSS growth {mib(None if rss0 is None else rss_bytes() - rss0)}; "
    f"built in {time.perf_counter() - t0:.1f}s"
  )

  @tf.function(input_signature=[tf.TensorSpec([w.args.lookup_batch], tf.int64)])
  def lookup(ids):
    return var.lookup(ids)

  def restrict():
    var.restrict(w.n - w.victims, trigger=w.n - w.victims)
    return w.n - int(var.size())

  def restore_group():
    for start, stop in w.chunks(*w.spans[0]):
      ids = tf.constant(w.keys[start:stop])
      var.upsert(ids, zeros[: stop - start])
      status.upsert(ids, tf.fill([stop - start, 1], tf.constant(1, tf.int32)))

  return measure_path(
    "tfra",
    "TFRA restrict, TimestampRestrictPolicy (export + top_k + remove)",
    lookup,
    w,
    restrict,
    restore_group,
  )


# ---- main -----------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()

  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  import tf_ext  # pylint: disable=import-outside-toplevel
  from tf_ext import _ops_loader  # pylint: disable=import-outside-toplevel

  de, tfra_version, tfra_status = import_tfra(
    args.no_tfra,
    "its own restrict path is skipped, its export + top_k + remove path still runs on the "
    "tf_ext table",
  )

  n, dim, groups = args.keys, args.dim, args.groups
  ops = _ops_loader.load()
  print("== tf_ext eviction benchmark ==")
  machine = machine_report(tf, tf_ext, np)
  print(f"TFRA         : {tfra_status}")
  print(
    f"threads      : intra_op_parallelism_threads="
    f"{tf.config.threading.get_intra_op_parallelism_threads()} (0: one per CPU); "
    f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')} (for the peak RSS figures)"
  )
  print(
    f"workload     : {n:,} ids x dim {dim} float32 in {groups} groups of last steps 1..{groups}; "
    f"evict the oldest group ({n // groups:,} rows, {1 / groups:.0%}); concurrent lookups of "
    f"{args.lookup_batch:,} random ids; {args.repeats} repeats per path"
  )
  results = {
    "config": {
      k: getattr(args, k)
      for k in (
        "keys",
        "dim",
        "groups",
        "lookup_batch",
        "repeats",
        "insert_batch",
        "intra_op_threads",
        "seed",
        "quick",
      )
    },
    "versions": versions(tf, tf_ext, np, tfra=tfra_version),
    "machine": machine,
  }

  # -- data ---------------------------------------------------------------------------------
  rng = np.random.default_rng(args.seed)
  keys = np.unique(rng.integers(0, 2**63 - 1, size=n + n // 64 + 16, dtype=np.int64))[:n]
  rng.shuffle(keys)
  # Group g = keys[bounds[g]:bounds[g + 1]], last step g + 1; group 0 (the oldest) is evicted.
  bounds = [g * (n // groups) for g in range(groups)] + [n]
  batches = [tf.constant(rng.choice(keys, args.lookup_batch, replace=False)) for _ in range(16)]
  workload = Workload(args, keys, bounds, batches)

  paths, results["tf_ext_table"] = tf_ext_paths(tf, tf_ext, ops, workload)
  gc.collect()
  if de is not None:
    try:
      paths.append(tfra_path(tf, de, workload))
    except Exception as error:  # pylint: disable=broad-except
      print(f"TFRA: failed ({type(error).__name__}: {error}); skipping its path")
      tfra_status = f"failed: {type(error).__name__}: {error}"
    gc.collect()
  victims = workload.victims
  results["paths"] = paths

  # -- report -------------------------------------------------------------------------------
  results["paths"] = paths
  by_key = {r["key"]: r for r in paths}
  repeats = args.repeats
  print()
  print(f"eviction of {victims:,} of {n:,} rows (time: median of {repeats} repeats):")
  for r in paths:
    each = ", ".join(f"{t:.3f}" for t in r["seconds_each"])
    print(
      f"  {r['path']:<66} {r['seconds']:7.3f} s  peak RSS added "
      f"{mib(r['peak_rss_added_bytes']):>11}   ({each})"
    )
    if any(removed != victims for removed in r["removed"]):
      print(f"      WARNING: removed {r['removed']}, expected {victims:,} each time")
  print()
  print(
    f"lookups of {args.lookup_batch:,} ids looping in another thread, by window (ms; "
    "longest: the longest lookup of each window, median of the windows / all of them):"
  )
  print(
    f"  {'':<10} {'lookups':>8} {'median':>8} {'p99':>8}   {'longest (med / max)':>21}  "
    f"{'> ' + format(STALL_TARGET_MS, 'g') + ' ms':>8}"
  )
  for r in paths:
    print(f"  {r['path']}")
    for kind, label in (
      ("evicting", "evicting"),
      ("control", "control"),
      ("quiet", "quiet"),
    ):
      w = r[kind]
      print(
        f"  {label:>10} {w['lookups']:>8,} {w['median_ms']:>8.2f} {w['p99_ms']:>8.2f}   "
        f"{w['median_longest_ms']:>10.2f} / {w['longest_ms']:>8.2f}  {w['over_target']:>8}"
      )
  print(
    "  (evicting: while the path runs; control: as long, one core busy with numpy, no table "
    "work;\n   quiet: nothing else running)"
  )
  ttl = by_key["ttl"]
  print()
  print("ratios (time of the path / tf_ext evict with ttl_steps, same run):")
  for r in paths[1:]:
    print(f"  {r['path']:<66}: {r['seconds'] / ttl['seconds']:6.2f}x")
  results["time_ratios_vs_tf_ext_ttl"] = {r["key"]: r["seconds"] / ttl["seconds"] for r in paths}

  targets = {
    f"stall, tf_ext evict (ttl_steps) <= {STALL_TARGET_MS:g} ms": by_key["ttl"],
    f"stall, tf_ext evict (max_size) <= {STALL_TARGET_MS:g} ms": by_key["max_size"],
  }
  print()
  print("targets (informational; the exit status is 0 regardless):")
  for name, r in targets.items():
    longest, control = r["evicting"]["longest_ms"], r["control"]["longest_ms"]
    note = ""
    if longest > STALL_TARGET_MS and control > STALL_TARGET_MS:
      note = "; the control, without the table, stalled over the target too"
    print(
      f"  {verdict(longest <= STALL_TARGET_MS)}  {name:<44} longest lookup {longest:.2f} ms "
      f"(median of {repeats} evictions {r['evicting']['median_longest_ms']:.2f} ms; control "
      f"{control:.2f} ms, median {r['control']['median_longest_ms']:.2f} ms{note})"
    )
  for key in ("tfra_way_on_tf_ext", "tfra"):
    if key in by_key:
      r = by_key[key]
      print(
        f"  INFO  {r['path']}: {r['seconds']:.2f} s, longest lookup "
        f"{r['evicting']['longest_ms']:.2f} ms (median {r['evicting']['median_longest_ms']:.2f})"
      )
  if "tfra" not in by_key:
    print(f"  INFO  TFRA's own restrict: {tfra_status}")
  results["targets"] = {
    name: {
      "longest_ms": r["evicting"]["longest_ms"],
      "pass": r["evicting"]["longest_ms"] <= STALL_TARGET_MS,
      "control_longest_ms": r["control"]["longest_ms"],
    }
    for name, r in targets.items()
  }
  results["tfra_status"] = tfra_status

  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

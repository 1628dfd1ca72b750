#!/usr/bin/env python3
"""Streaming and delta checkpoints of a 10 M-entry dynamic embedding table (dim 16, Adam slots).

In one run, each measurement in a fresh worker process (so that one path's memory does not hide
another's peak):
  1. save: builds the table (--keys random int64 ids, --dim floats, Adam's two slots), then saves
     it through tf.train.Checkpoint, which streams each table into a snapshot file beside the
     checkpoint (tf_ext >= 0.2); and through the anchor, the whole-copy path of tf_ext 0.1 and of
     TFRA (tensorflow/recommenders-addons issue 243): export the table into tensors, then SaveV2.
     It reports each save's time, file bytes and the peak RSS the save added (the process's
     high-water mark, reset through /proc/self/clear_refs before the save, after malloc_trim).
  2. restore: a new process restores each checkpoint into an empty table and reports the time
     and the peak RSS added beyond the restored table's own memory.
  3. delta: tf_ext.DeltaCheckpointManager writes a full link; --changed-fraction of the rows
     (1 % by default) then get Adam updates and a delta link is written. Reports both links'
     time and bytes, and the ratios.

  4. training: after a warm-up save (the first one traces its functions, holding the GIL),
     training steps (--step-ids random ids each, Adam) run back to back in a second thread, each
     timed, first alone for --control-seconds and then while the main thread saves the table
     (the streaming save). Reports the steps' p50/p99/max in both windows,
     the longest step wait the save added (max during the save minus the control's max), the
     save's time and the peak RSS it added.

Targets: extra RSS of the streaming save and restore <= 256 MiB; the delta <= 5 % of the full
link's time and <= 3 % of its bytes; no training step waits more than 10 ms longer during the
save than alone. PASS/MISS lines are informational: the exit status is 0
whatever the numbers.

  python benchmarks/checkpoint.py            # 10 M ids, dim 16, 1 % changed
  python benchmarks/checkpoint.py --quick    # 1 M ids, for development
  python benchmarks/checkpoint.py --json /tmp/checkpoint.json
  python benchmarks/checkpoint.py --phases training   # only the save during training
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
DELTA_TIME_TARGET, DELTA_BYTES_TARGET = 0.05, 0.03
STEP_WAIT_TARGET = 0.010
PHASES = ("save", "restore", "delta", "training")
# The anchor's checkpoint: the table exported into these tensors (as tf_ext 0.1 saved it).
WHOLE_COPY_NAMES = ["keys", "values", "slots", "update_counts", "last_steps", "slot_initial_values"]


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--keys", type=int, default=10_000_000, help="distinct ids in the table")
  p.add_argument("--dim", type=int, default=16, help="embedding width (float32)")
  p.add_argument(
    "--changed-fraction", type=float, default=0.01, help="rows updated between full and delta"
  )
  p.add_argument("--quick", action="store_true", help="1 M ids instead of --keys")
  p.add_argument("--phases", default=",".join(PHASES), help="which measurements to run, in order")
  p.add_argument("--step-ids", type=int, default=256, help="ids per training step (training)")
  p.add_argument(
    "--control-seconds", type=float, default=3.0, help="training alone before the save (training)"
  )
  p.add_argument("--dir", help="where checkpoints go (default: a temporary folder, removed)")
  p.add_argument("--worker", choices=PHASES, help=argparse.SUPPRESS)
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.keys = 1_000_000
  require_positive(p, args, ["keys", "dim", "step_ids"])
  args.phases = [phase for phase in args.phases.split(",") if phase]
  if not args.phases or set(args.phases) - set(PHASES):
    p.error(f"--phases: a comma-separated subset of {','.join(PHASES)}")
  if not 0 < args.changed_fraction <= 1:
    p.error("--changed-fraction must be in (0, 1]")
  return args


# ---- workers (one process each) ---------------------------------------------------------------


def _build_table(tf, tf_ext, np, keys, dim):
  """The table: `keys` random ids with rows and Adam's two slots (created by one Adam step)."""
  table = tf_ext.DynamicEmbeddingVariable("bench_table", dim, initializer="zeros")
  rng = np.random.default_rng(0)
  ids = np.unique(rng.integers(0, 2**62, int(keys * 1.01)))[:keys]
  rng.shuffle(ids)
  batch = 1_000_000
  for start in range(0, len(ids), batch):
    chunk = ids[start : start + batch]
    table.insert(chunk, rng.normal(size=(len(chunk), dim)).astype(np.float32))
    log(f"  built {min(start + batch, len(ids)):,} of {len(ids):,} rows")
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01))
  _train(tf, table, optimizer, ids[:1000])  # Adam's slots, for every row
  return table, optimizer, ids


def _train(tf, table, optimizer, ids):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(table.lookup(ids)))
  optimizer.apply_gradients(
    zip(tape.gradient(loss, [table.gradient_anchor]), [table.gradient_anchor])
  )


def _measure(fn):
  """(seconds, peak RSS added or None, result) of fn()."""
  with PeakRssAdded() as peak:
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
  return seconds, peak.bytes, result


def _beyond(extra, table_bytes):
  """The peak RSS a restore added beyond the restored table's own memory."""
  return None if extra is None else extra - table_bytes


def _files_bytes(prefix):
  folder, base = os.path.split(prefix)
  return sum(
    os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith(base + ".")
  )


def worker_save(args, tf, tf_ext, np):
  table, _, _ = _build_table(tf, tf_ext, np, args.keys, args.dim)
  results = {"rows": int(table.size()), "table_bytes": int(table.memory_bytes())}
  streaming = os.path.join(args.dir, "streaming", "ckpt")
  seconds, extra, path = _measure(lambda: tf.train.Checkpoint(table=table).write(streaming))
  results["streaming"] = {"seconds": seconds, "extra_rss": extra, "bytes": _files_bytes(path)}
  log(f"  streaming save: {seconds:.2f}s, extra RSS {mib(extra)}")
  whole = os.path.join(args.dir, "whole", "ckpt")
  os.makedirs(os.path.dirname(whole), exist_ok=True)

  def save_whole():
    tensors = table.export_with_slots()
    names = WHOLE_COPY_NAMES
    tf.raw_ops.SaveV2(
      prefix=whole, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )

  seconds, extra, _ = _measure(save_whole)
  results["whole_copy"] = {"seconds": seconds, "extra_rss": extra, "bytes": _files_bytes(whole)}
  log(f"  whole-copy save: {seconds:.2f}s, extra RSS {mib(extra)}")
  return results


def worker_restore(args, tf, tf_ext, np):
  del np
  results = {}
  table = tf_ext.DynamicEmbeddingVariable("bench_table", args.dim, initializer="zeros")
  streaming = os.path.join(args.dir, "streaming", "ckpt")
  seconds, extra, _ = _measure(lambda: tf.train.Checkpoint(table=table).read(streaming))
  own = int(table.memory_bytes())
  results["streaming"] = {"seconds": seconds, "extra_rss": _beyond(extra, own), "table_bytes": own}
  log(f"  streaming restore: {seconds:.2f}s, extra RSS {mib(_beyond(extra, own))} beyond the table")
  del table
  table = tf_ext.DynamicEmbeddingVariable("bench_table_whole", args.dim, initializer="zeros")
  whole = os.path.join(args.dir, "whole", "ckpt")

  def restore_whole():
    names = WHOLE_COPY_NAMES
    dtypes = [tf.int64, tf.float32, tf.float32, tf.int64, tf.int64, tf.float32]
    tensors = tf.raw_ops.RestoreV2(
      prefix=whole, tensor_names=names, shape_and_slices=[""] * len(names), dtypes=dtypes
    )
    table.import_with_slots(*tensors)

  seconds, extra, _ = _measure(restore_whole)
  own = int(table.memory_bytes())
  results["whole_copy"] = {"seconds": seconds, "extra_rss": _beyond(extra, own), "table_bytes": own}
  log(
    f"  whole-copy restore: {seconds:.2f}s, extra RSS {mib(_beyond(extra, own))} beyond the table"
  )
  return results


def worker_delta(args, tf, tf_ext, np):
  table, optimizer, ids = _build_table(tf, tf_ext, np, args.keys, args.dim)
  manager = tf_ext.DeltaCheckpointManager(os.path.join(args.dir, "chain"), [table])
  full = manager.save(1)
  log(f"  full link: {full['seconds']:.2f}s, {full['bytes']:,} bytes")
  changed = np.random.default_rng(1).choice(ids, int(len(ids) * args.changed_fraction), False)
  for start in range(0, len(changed), 65536):
    _train(tf, table, optimizer, changed[start : start + 65536])
  delta = manager.save(2)
  log(f"  delta link: {delta['seconds']:.3f}s, {delta['bytes']:,} bytes, {delta['rows']:,} rows")
  keep = ("seconds", "bytes", "rows", "tombstones")
  return {"full": {k: full[k] for k in keep}, "delta": {k: delta[k] for k in keep}}


def _quantiles(seconds):
  ordered = sorted(seconds)
  at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
  return {"steps": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": ordered[-1]}


def worker_training(args, tf, tf_ext, np):
  """Training steps timed in a second thread, alone and then while the table is saved."""
  import threading  # pylint: disable=import-outside-toplevel

  table, optimizer, ids = _build_table(tf, tf_ext, np, args.keys, args.dim)
  rng = np.random.default_rng(2)
  batches = [rng.choice(ids, args.step_ids) for _ in range(64)]
  steps, stop = [], threading.Event()  # steps: (start, end) of each, perf_counter seconds

  def train():
    while not stop.is_set():
      start = time.perf_counter()
      _train(tf, table, optimizer, batches[len(steps) % len(batches)])
      steps.append((start, time.perf_counter()))

  path = os.path.join(args.dir, "training", "ckpt")
  tf.train.Checkpoint(table=table).write(path)  # warm-up: the first save traces, holding the GIL
  trainer = threading.Thread(target=train)
  trainer.start()
  time.sleep(args.control_seconds)
  save_start = time.perf_counter()
  seconds, extra, _ = _measure(lambda: tf.train.Checkpoint(table=table).write(path))
  save_end = time.perf_counter()
  stop.set()
  trainer.join()
  # The control window skips the first steps (warm-up) and ends where the save starts.
  control = [end - start for start, end in steps[5:] if end < save_start]
  during = [end - start for start, end in steps if end > save_start and start < save_end]
  results = {
    "save": {"seconds": seconds, "extra_rss": extra},
    "control": _quantiles(control),
    "during_save": _quantiles(during),
  }
  results["added_wait"] = results["during_save"]["max"] - results["control"]["max"]
  longest = max((end - start, start) for start, end in steps if end > save_start)
  results["longest_step_starts_after_save_start"] = longest[1] - save_start
  during_max, control_max = results["during_save"]["max"], results["control"]["max"]
  log(
    f"  save during training: {seconds:.2f}s, extra RSS {mib(extra)}; step max "
    f"{during_max * 1e3:.1f} ms during it vs {control_max * 1e3:.1f} ms alone"
  )
  return results


WORKERS = {
  "save": worker_save,
  "restore": worker_restore,
  "delta": worker_delta,
  "training": worker_training,
}


def run_worker(args):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  print(json.dumps(WORKERS[args.worker](args, tf, tf_ext, np)))
  return 0


def report_save_and_restore(args, save, restore):
  print(
    f"\ntable: {save['rows']:,} rows, dim {args.dim}, Adam slots: {mib(save['table_bytes'])} "
    "in memory"
  )
  print(f"{'path':<34}{'time':>9}{'extra RSS':>16}{'file bytes':>16}")
  for label, phase, key in [
    ("save, streaming (tf_ext)", save, "streaming"),
    ("save, whole copy (0.1, TFRA)", save, "whole_copy"),
    ("restore, streaming (tf_ext)", restore, "streaming"),
    ("restore, whole copy (0.1, TFRA)", restore, "whole_copy"),
  ]:
    row = phase[key]
    size = f"{row['bytes']:,}" if "bytes" in row else ""
    print(f"{label:<34}{row['seconds']:>8.2f}s{mib(row['extra_rss']):>16}{size:>16}")
  for label, phase in [("streaming save   ", save), ("streaming restore", restore)]:
    stream, whole = phase["streaming"], phase["whole_copy"]
    print(
      f"{label}: extra RSS {mib(stream['extra_rss'])} (target <= 256 MiB): "
      f"{verdict(stream['extra_rss'] is not None and stream['extra_rss'] <= RSS_TARGET)}; "
      f"the whole copy added "
      f"{mib(whole['extra_rss'])}; time ratio to it {stream['seconds'] / whole['seconds']:.2f}"
    )


def report_delta(args, delta):
  """Prints the delta's ratios to the full link, and returns them."""
  full, dlt = delta["full"], delta["delta"]
  time_ratio, bytes_ratio = dlt["seconds"] / full["seconds"], dlt["bytes"] / full["bytes"]
  print(
    f"delta ({args.changed_fraction:.0%} of rows changed: {dlt['rows']:,} rows): "
    f"{dlt['seconds']:.3f}s vs full {full['seconds']:.2f}s = {time_ratio:.2%} "
    f"(target <= 5 %): {verdict(time_ratio <= DELTA_TIME_TARGET)}; "
    f"{dlt['bytes']:,} vs {full['bytes']:,} bytes = {bytes_ratio:.2%} (target <= 3 %): "
    f"{verdict(bytes_ratio <= DELTA_BYTES_TARGET)}"
  )
  return {"delta_time": time_ratio, "delta_bytes": bytes_ratio}


def report_training(training):
  print(f"\n{'training steps':<22}{'steps':>8}{'p50':>10}{'p99':>10}{'max':>10}")
  for label, key in [("alone", "control"), ("during the save", "during_save")]:
    q = training[key]
    print(
      f"{label:<22}{q['steps']:>8}{q['p50'] * 1e3:>8.1f}ms{q['p99'] * 1e3:>8.1f}ms"
      f"{q['max'] * 1e3:>8.1f}ms"
    )
  added, save = training["added_wait"], training["save"]
  print(
    f"save during training: {save['seconds']:.2f}s, extra RSS {mib(save['extra_rss'])}; the "
    f"longest step waited {added * 1e3:.1f} ms longer than alone (target <= 10 ms): "
    f"{verdict(added <= STEP_WAIT_TARGET)}"
  )


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    return run_worker(args)
  wall_start = time.perf_counter()
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  machine = machine_report(tf, tf_ext, np)
  extra_argv = ["--changed-fraction", str(args.changed_fraction), "--step-ids", str(args.step_ids)]
  extra_argv += ["--control-seconds", str(args.control_seconds)]
  measured = run_workers(__file__, args, args.phases, extra_argv, "tf_ext_ckpt_bench_")
  if "save" in measured and "restore" in measured:
    report_save_and_restore(args, measured["save"], measured["restore"])
  ratios = report_delta(args, measured["delta"]) if "delta" in measured else None
  if "training" in measured:
    report_training(measured["training"])
  results = {
    "machine": machine,
    "versions": versions(tf, tf_ext, np),
    "keys": args.keys,
    "dim": args.dim,
    **measured,
  }
  if ratios:
    results["ratios"] = ratios
  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

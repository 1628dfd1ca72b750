#!/usr/bin/env python3
"""A soak run: a model with a table trains on the Criteo-like stream for --minutes while a driver
kills it with SIGKILL at random moments and restarts it from the last checkpoint link.

The driver (this script) starts a training child (this script with --child), kills it at seeded
random moments (uniform in [0.5, 1.5] x --kill-interval seconds after the child wrote its first
link, so that every child makes progress and every kill leaves a link to restore, however slow
the machine), restarts it, and samples the child's resident memory (/proc/<pid>/status VmRSS)
every --sample-s seconds. The child trains a small CTR model (a table of dim --dim with
FrequencyAdmission(--min-count, a count-min sketch) and EvictionPolicy(ttl_steps=--ttl-steps),
Adagrad) on batches of the Criteo-like stream (benchmarks/_criteo_like.py), evicts every
--evict-every steps, writes a delta link every --delta-every steps and a full one every
--full-every (tf_ext.DeltaCheckpointManager, with the dense weights and the optimizer), and
looks rows up from a second thread all along.

What it checks, each with a PASS/MISS line:
  memory    the RSS slope over the steady part (from --steady-fraction of the run on, each
            process's first --warmup-s seconds left out; one line fitted per process, one common
            slope) is at most --rss-bound-mib-per-min;
  rows lost none: the child keeps a reference of every id trained (its training updates and its
            last step, pruned exactly as TTL eviction removes rows); at every save and at the
            end, every id with at least min_count updates since it was last evicted must have a
            row. Ids with fewer are accounted for by admission (the sketch may admit early,
            never late), ids pruned by eviction by eviction. The reference is saved with each
            link, so the check spans restarts: it covers every id trained since the last
            restored link;
  restores  every restore equals what was saved: before each save the child writes a digest of
            the table (keys, rows, slots, update counts, last steps) and of the dense state; after
            restoring that link, the restored tables must give the same digest;
  AUC       continuous across restarts: the progressive AUC (predictions made before each
            batch trains) of every window of --auc-every steps that a restarted child trained
            again must equal, within --auc-tolerance, what the killed child measured on it.

The run ends once --minutes are over and at least --min-kills kills were survived: past
--minutes, a child still owed a kill is killed as soon as it has written a link, and restarted;
the last child stops once it has written a link, so that it trained and its second thread looked
rows up (a lookups line that counts none is a MISS).
The exit status is 1 when a row is lost, a restore differs, a child fails other than by the
driver's SIGKILL, or nothing was restored; the memory and AUC lines are reported, not enforced.

  python benchmarks/soak.py                       # 30 minutes
  python benchmarks/soak.py --minutes 3 --kill-interval 40
  python benchmarks/soak.py --json build/soak/soak.json --png benchmarks/soak.png
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_json,
  argument_parser,
  log,
  process_rss,
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

use_checkout()

from _soak_child import EVENTS, STOP  # noqa: E402


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--minutes", type=float, default=30.0, help="length of the run")
  p.add_argument("--kill-interval", type=float, default=150.0, help="mean seconds between kills")
  p.add_argument(
    "--min-kills", type=int, default=1, help="kills (and restores) the run has, even past --minutes"
  )
  p.add_argument("--seed", type=int, default=0, help="seeds the stream and the kill moments")
  p.add_argument("--batch", type=int, default=1024, help="samples per training step")
  p.add_argument("--day-samples", type=int, default=100_000, help="samples per day of stream")
  p.add_argument("--dim", type=int, default=8, help="embedding width")
  p.add_argument("--min-count", type=int, default=2, help="FrequencyAdmission's min_count")
  p.add_argument("--sketch-mib", type=int, default=8, help="the admission sketch's size")
  p.add_argument("--ttl-steps", type=int, default=300, help="EvictionPolicy's ttl_steps")
  p.add_argument("--evict-every", type=int, default=25, help="steps between evictions")
  p.add_argument("--delta-every", type=int, default=50, help="steps between links")
  p.add_argument("--full-every", type=int, default=500, help="steps between full links")
  p.add_argument("--auc-every", type=int, default=25, help="steps per AUC window")
  p.add_argument("--auc-tolerance", type=float, default=0.002, help="replayed window's AUC, +-")
  p.add_argument("--sample-s", type=float, default=1.0, help="seconds between RSS samples")
  p.add_argument("--warmup-s", type=float, default=60.0, help="per process, left out of the fit")
  p.add_argument("--steady-fraction", type=float, default=0.33, help="the steady part starts")
  p.add_argument("--rss-bound-mib-per-min", type=float, default=2.0, help="the memory bound")
  p.add_argument("--dir", default="build/soak", help="checkpoints, events and samples go here")
  p.add_argument("--png", default=chart_path("soak.png"), help="chart ('' for none)")
  p.add_argument("--child", action="store_true", help="(internal) the training process")
  add_json(p)
  args = p.parse_args(argv)
  require_positive(p, args, ["batch", "day_samples", "dim", "sketch_mib", "ttl_steps"])
  require_positive(p, args, ["evict_every", "delta_every", "full_every", "auc_every"])
  if args.min_count < 2:
    p.error("--min-count must be >= 2")
  if args.delta_every % args.auc_every or args.full_every % args.delta_every:
    p.error("--auc-every must divide --delta-every, which must divide --full-every")
  if args.minutes <= 0 or args.kill_interval <= 0:
    p.error("--minutes and --kill-interval must be > 0")
  if args.min_kills < 0:
    p.error("--min-kills must be >= 0")
  return args


# ---- the driver ------------------------------------------------------------------------------


def read_events(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


def drive(args, argv):
  """Runs children until --minutes are over and --min-kills kills were survived, killing each
  child at a random moment after its first link; returns the RSS samples (t, segment, rss), the
  kills (t, segment), the children's exit statuses and the start time."""
  rng = np.random.default_rng([args.seed, 37])
  events_path = os.path.join(args.dir, EVENTS)
  start = time.time()
  deadline = start + args.minutes * 60
  samples, kills, exits = [], [], []
  segment, said_overtime = 0, False
  while True:
    env = dict(os.environ, SOAK_SEGMENT=str(segment))
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", *argv], env=env)
    kill_at = None
    while child.poll() is None:
      now = time.time()
      rss = process_rss(child.pid)
      if rss is not None:
        samples.append((now - start, segment, rss))
      if kill_at is None and any(
        e["kind"] == "save" and e["seg"] == segment for e in read_events(events_path)[-50:]
      ):
        kill_at = now + rng.uniform(0.5, 1.5) * args.kill_interval
      owed, linked = len(kills) < args.min_kills, kill_at is not None
      if now >= deadline and not owed and linked:
        open(os.path.join(args.dir, STOP), "w").close()
      elif linked and (now >= kill_at or now >= deadline):
        child.send_signal(signal.SIGKILL)
        child.wait()
        kills.append((now - start, segment))
        log(f"[soak] {now - start:7.1f}s: SIGKILL to segment {segment}")
        break
      elif now >= deadline and owed and not said_overtime:
        said_overtime = True
        log(f"[soak] --minutes are over; going on until kill {args.min_kills} (--min-kills)")
      time.sleep(args.sample_s)
    exits.append(child.returncode)
    if child.returncode not in (0, -signal.SIGKILL):
      log(f"[soak] segment {segment} failed with status {child.returncode}")
      break
    if child.returncode == 0:
      break
    segment += 1
  return samples, kills, exits, start


def steady_slope(samples, start_t, warmup_s):
  """MiB per minute: one slope, a line per process (its own intercept), over the samples from
  start_t on and past each process's first warmup_s seconds; None without enough samples."""
  by_segment = {}
  for t, seg, rss in samples:
    by_segment.setdefault(seg, []).append((t, rss))
  num = den = 0.0
  for points in by_segment.values():
    first = points[0][0]
    kept = np.array([(t, r) for t, r in points if t >= start_t and t - first >= warmup_s])
    if len(kept) < 3:
      continue
    t, r = kept[:, 0], kept[:, 1] / 2**20
    num += float(((t - t.mean()) * (r - r.mean())).sum())
    den += float(((t - t.mean()) ** 2).sum())
  return None if den == 0 else num / den * 60


def draw(path, samples, events, kills, bound_note):
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
  axes[0].plot([s[0] / 60 for s in samples], [s[2] / 2**20 for s in samples], ".", ms=2)
  axes[0].set_ylabel("child RSS (MiB)")
  axes[0].set_title(f"soak run: SIGKILL at the dashed lines; {bound_note}", fontsize=9)
  sizes = [(e["t"], e["size"]) for e in events if e["kind"] == "auc"]
  axes[1].plot([t / 60 for t, _ in sizes], [s for _, s in sizes], ".", ms=3)
  axes[1].set_ylabel("table rows")
  aucs = [(e["t"], e["auc"]) for e in events if e["kind"] == "auc"]
  axes[2].plot([t / 60 for t, _ in aucs], [a for _, a in aucs], ".", ms=3)
  axes[2].set_ylabel("window AUC")
  axes[2].set_xlabel("minutes")
  for axis in axes:
    for t, _ in kills:
      axis.axvline(t / 60, color="red", ls="--", lw=0.6)
  save_figure(fig, plt, path, dpi=110)


def report(args, samples, kills, exits, start, results):
  events = read_events(os.path.join(args.dir, EVENTS))
  for e in events:
    e["t"] -= start
  ok = True

  # Memory.
  steady_start = args.minutes * 60 * args.steady_fraction
  slope = steady_slope(samples, steady_start, args.warmup_s)
  first = {}
  for t, seg, _ in samples:
    first.setdefault(seg, t)
  steady = [r for t, seg, r in samples if t >= steady_start and t - first[seg] >= args.warmup_s]
  sizes = [e["size"] for e in events if e["kind"] == "auc" and e["t"] >= steady_start]
  memory_ok = slope is not None and slope <= args.rss_bound_mib_per_min
  print(
    f"memory       : RSS slope over the steady part (from minute {steady_start / 60:.1f}) "
    f"{'n/a' if slope is None else format(slope, '+.2f')} MiB/min (bound <= "
    f"{args.rss_bound_mib_per_min:g} MiB/min): {verdict(memory_ok)}; RSS there "
    f"{min(steady, default=0) / 2**20:,.0f} to {max(steady, default=0) / 2**20:,.0f} MiB, "
    f"table {min(sizes, default=0):,} to {max(sizes, default=0):,} rows"
  )
  # What the process holds, less the heap memory glibc keeps free (fragmentation, not a leak).
  heap = [e for e in events if e["kind"] == "check" and "heap_free" in e]
  live_slope = steady_slope(
    [(e["t"], e["seg"], e["rss"] - e["heap_free"]) for e in heap], steady_start, args.warmup_s
  )
  in_use_slope = steady_slope(
    [(e["t"], e["seg"], e["heap_in_use"]) for e in heap], steady_start, args.warmup_s
  )
  if live_slope is not None:
    print(
      f"               RSS less the heap's free memory: {live_slope:+.2f} MiB/min; heap in use "
      f"{in_use_slope:+.2f} MiB/min (glibc's mallinfo2 at each link)"
    )

  # Restarts and restores.
  restores = [e for e in events if e["kind"] == "restore"]
  matched = sum(e["matched"] for e in restores)
  mid_save = 0
  for _, seg in kills:
    kinds = [e["kind"] for e in events if e["seg"] == seg and e["kind"] in ("save_begin", "save")]
    mid_save += bool(kinds) and kinds[-1] == "save_begin"
  failed = [code for code in exits if code not in (0, -signal.SIGKILL)]
  print(
    f"restarts     : {len(kills)} SIGKILLs survived ({mid_save} during a save), "
    f"{len(restores)} restores; child failures: {len(failed)}"
  )
  restores_ok = matched == len(restores) and len(restores) > 0 and not failed
  print(
    f"restores     : {matched} of {len(restores)} equal to what was saved (target: all): "
    f"{verdict(restores_ok)}"
  )
  ok &= restores_ok

  # Rows.
  checks = [e for e in events if e["kind"] in ("check", "restore", "final")]
  lost = sum(e["lost"] for e in checks)
  evictions = [e for e in events if e["kind"] == "evict"]
  removed = sum(e["removed"] for e in evictions)
  expected = sum(e["expected_at_least"] for e in evictions)
  final = next((e for e in events if e["kind"] == "final"), None)
  rows_ok = lost == 0 and final is not None
  print(
    f"rows lost    : {lost} (target 0) in {len(checks)} checks of every id with >= "
    f"{args.min_count} updates since its eviction: {verdict(rows_ok)}; last check "
    f"{final['must'] if final else 0:,} ids, {final['waiting'] if final else 0:,} waiting for "
    f"admission; evicted {removed:,} rows (>= {expected:,} certainly admitted ones: "
    f"{verdict(removed >= expected)})"
  )
  ok &= rows_ok and removed >= expected

  # AUC continuity: windows trained by a killed child and again after its restart.
  by_step = {}
  for e in events:
    if e["kind"] == "auc":
      by_step.setdefault(e["step"], []).append((e["seg"], e["auc"]))
  replayed = [max(a for _, a in v) - min(a for _, a in v) for v in by_step.values() if len(v) > 1]
  worst = max(replayed, default=0.0)
  auc_ok = worst <= args.auc_tolerance
  print(
    f"AUC          : {len(replayed)} windows trained again after a restart differ by at most "
    f"{worst:.4f} (tolerance {args.auc_tolerance:g}): {verdict(auc_ok)}"
  )
  segments = sorted({e["seg"] for e in events if e["kind"] == "auc"})
  for seg in segments:
    own = [e for e in events if e["kind"] == "auc" and e["seg"] == seg]
    print(
      f"  segment {seg:>3}: steps {own[0]['step'] - args.auc_every:>7,} to {own[-1]['step']:>7,}, "
      f"AUC {own[0]['auc']:.4f} -> {own[-1]['auc']:.4f}, table {own[-1]['size']:,} rows"
    )
  lookups = next((e for e in events if e["kind"] == "lookups"), None)
  lookup_ok = lookups is not None and lookups["error_count"] == 0 and lookups["count"] > 0
  print(
    f"lookups      : {lookups['count'] if lookups else 0:,} from the second thread in the last "
    f"segment, {lookups['error_count'] if lookups else 'n/a'} errors: {verdict(lookup_ok)}"
  )
  ok &= lookup_ok
  steps = max((e["step"] for e in events if e["kind"] == "auc"), default=0)
  print(
    f"trained      : {steps:,} steps of {args.batch} samples, "
    f"{sum(e['kind'] == 'save' for e in events)} links written"
  )
  results.update(
    rss_slope_mib_per_min=slope,
    live_slope_mib_per_min=live_slope,
    heap_in_use_slope_mib_per_min=in_use_slope,
    memory_pass=memory_ok,
    kills=len(kills),
    kills_during_save=mid_save,
    restores=len(restores),
    restores_matched=matched,
    rows_lost=lost,
    checks=len(checks),
    evicted=removed,
    auc_replayed_windows=len(replayed),
    auc_worst_replay_difference=worst,
    steps=steps,
    samples=samples,
    kill_times=[t for t, _ in kills],
  )
  note = f"RSS slope {'n/a' if slope is None else format(slope, '+.2f')} MiB/min"
  if args.png:
    write_chart(args.png, results, lambda path: draw(path, samples, events, kills, note))
  return ok


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  if args.child:
    import _soak_child  # pylint: disable=import-outside-toplevel

    return _soak_child.run_child(args)
  wall_start = time.perf_counter()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  print("== tf_ext soak run ==")
  machine = machine_report(tf, tf_ext, np)
  print(
    f"workload     : {args.minutes:g} min; batches of {args.batch} Criteo-like samples "
    f"(days of {args.day_samples:,}); table dim {args.dim}, admission min_count "
    f"{args.min_count} ({args.sketch_mib} MiB sketch), TTL {args.ttl_steps} steps evicted every "
    f"{args.evict_every}; a delta link every {args.delta_every} steps, a full one every "
    f"{args.full_every}; SIGKILL every {args.kill_interval:g} s on average (seed {args.seed})"
  )
  shutil.rmtree(args.dir, ignore_errors=True)
  os.makedirs(args.dir)
  samples, kills, exits, start = drive(args, argv)  # the child ignores --json and --png
  results = {"machine": machine, "versions": versions(tf, tf_ext, np), "config": vars(args)}
  ok = report(args, samples, kills, exits, start, results)
  print(f"verdict      : {verdict(ok)} (rows lost, restores, lookups, child failures)")
  finish(results, args.json, wall_start)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())

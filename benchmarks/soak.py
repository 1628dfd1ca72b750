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

import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_json,
  argument_parser,
  chart_path,
  finish,
  log,
  machine_report,
  require_positive,
  save_figure,
  use_checkout,
  verdict,
  versions,
  write_chart,
)

use_checkout()

TABLE_NAME = "soak_ids"
EVENTS, STOP = "events.jsonl", "STOP"


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


# ---- the child: training, checks, links ------------------------------------------------------


class Reference:
  """What the table must hold: each id trained, its training updates and the step of its last
  one, in arrays sorted by id (ids new since the last merge wait in a buffer). Pruned as TTL
  eviction removes rows, so that it stays as small as the table's recent ids."""

  def __init__(self, keys=None, counts=None, last=None):
    empty = np.zeros(0, np.int64)
    self.keys = empty if keys is None else keys
    self.counts = empty if counts is None else counts
    self.last = empty if last is None else last
    self._new_keys, self._new_steps = [], []

  def train(self, ids, step):
    """One training update of each of the distinct `ids` at `step`."""
    pos = np.searchsorted(self.keys, ids)
    found = pos < len(self.keys)
    found[found] = self.keys[pos[found]] == ids[found]
    self.counts[pos[found]] += 1
    self.last[pos[found]] = step
    self._new_keys.append(ids[~found])
    self._new_steps.append(np.full(int((~found).sum()), step, np.int64))

  def merge(self):
    if not self._new_keys:
      return
    keys, inverse = np.unique(np.concatenate(self._new_keys), return_inverse=True)
    counts = np.bincount(inverse, minlength=len(keys)).astype(np.int64)
    last = np.zeros(len(keys), np.int64)
    np.maximum.at(last, inverse, np.concatenate(self._new_steps))
    self._new_keys, self._new_steps = [], []
    order = np.argsort(np.concatenate([self.keys, keys]), kind="stable")
    self.keys = np.concatenate([self.keys, keys])[order]
    self.counts = np.concatenate([self.counts, counts])[order]
    self.last = np.concatenate([self.last, last])[order]

  def evict(self, now, ttl, min_count):
    """Prunes what EvictionPolicy(ttl_steps=ttl) removes at `now`; returns how many of those had
    certainly been admitted (the table's eviction removes those and any admitted early)."""
    self.merge()
    keep = now - self.last < ttl
    admitted = int(((~keep) & (self.counts >= min_count)).sum())
    self.keys, self.counts, self.last = self.keys[keep], self.counts[keep], self.last[keep]
    return admitted

  def lost(self, table_keys, min_count):
    """(ids that must have a row, the ids of them without one, ids waiting for admission)."""
    self.merge()
    must = self.keys[self.counts >= min_count]
    present = np.isin(must, table_keys, assume_unique=True)
    return len(must), must[~present], int((self.counts < min_count).sum())


def table_digest(table, dense_variables):
  """A digest of everything a link holds: the table's rows with their slots and metadata, sorted
  by id, and the dense state; with the table's ids (sorted)."""
  exported = [t.numpy() for t in table.export_with_slots()]
  order = np.argsort(exported[0], kind="stable")
  digest = hashlib.sha256()
  for array in exported[:5]:
    digest.update(np.ascontiguousarray(array[order]).tobytes())
  digest.update(np.ascontiguousarray(exported[5]).tobytes())
  for variable in dense_variables:
    digest.update(variable.name.encode())
    digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
  return digest.hexdigest(), exported[0][order]


class _MallInfo2(ctypes.Structure):
  _fields_ = [
    (name, ctypes.c_size_t)
    for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
    + ("uordblks", "fordblks", "keepcost")
  ]


def heap_stats():
  """This process's RSS and glibc's heap: bytes in use, free inside the heap (resident until
  the allocator gives them back), and mapped on their own; {} where glibc has no mallinfo2."""
  try:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
  except (OSError, AttributeError):
    return {}
  info = libc.mallinfo2()
  return {
    "rss": child_rss(os.getpid()),
    "heap_in_use": info.uordblks,
    "heap_free": info.fordblks,
    "mmapped": info.hblkhd,
  }


class Events:
  """JSON lines, one per event, flushed at once (a SIGKILL loses none written)."""

  def __init__(self, path, segment):
    self._file = open(path, "a")  # pylint: disable=consider-using-with
    self._segment = segment

  def __call__(self, kind, **fields):
    self._file.write(json.dumps({"t": time.time(), "seg": self._segment, "kind": kind, **fields}))
    self._file.write("\n")
    self._file.flush()


class Lookups:
  """The second thread: looks up the latest batch's ids until stopped; counts lookups, errors."""

  def __init__(self, lookup):
    self._lookup, self.ids = lookup, None
    self.count, self.errors = 0, []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="lookups", daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.wait(0.005):
      ids = self.ids
      if ids is None:
        continue
      try:
        rows = self._lookup(ids).numpy()
        if not np.isfinite(rows).all():
          raise ValueError("a looked-up row is not finite")
        self.count += 1
      except Exception as error:  # pylint: disable=broad-except
        self.errors.append(f"{type(error).__name__}: {error}")

  def stop(self):
    self._stop.set()
    self._thread.join()


class Stream:
  """Batch `step` of the stream: batches of --batch samples over days of --day-samples."""

  def __init__(self, args):
    from _criteo_like import CriteoLike  # pylint: disable=import-outside-toplevel

    self._gen, self._args = CriteoLike(seed=args.seed), args
    self._per_day = args.day_samples // args.batch
    self._day = None

  def batch(self, step):
    day, index = divmod(step, self._per_day)
    if self._day is None or self._day.index != day:
      self._day = self._gen.day(day, self._args.day_samples)
    part = slice(index * self._args.batch, (index + 1) * self._args.batch)
    return self._day.ids[part], self._day.dense[part], self._day.label[part]


def run_child(args):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from _criteo_like import NUM_DENSE, NUM_FIELDS, auc  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  segment = int(os.environ.get("SOAK_SEGMENT", "0"))
  events = Events(os.path.join(args.dir, EVENTS), segment)
  table = tf_ext.get_dynamic_embedding_variable(
    TABLE_NAME,
    args.dim,
    admission=tf_ext.FrequencyAdmission(args.min_count, sketch_bytes=args.sketch_mib << 20),
    eviction=tf_ext.EvictionPolicy(ttl_steps=args.ttl_steps),
  )
  init = tf.random.stateless_normal
  width = NUM_FIELDS * args.dim + NUM_DENSE
  hidden_w = tf.Variable(init([width, 32], seed=[args.seed, 1]) * 0.1, name="hidden_w")
  hidden_b = tf.Variable(tf.zeros([32]), name="hidden_b")
  out_w = tf.Variable(init([32, 1], seed=[args.seed, 2]) * 0.1, name="out_w")
  out_b = tf.Variable(tf.zeros([1]), name="out_b")
  dense = [hidden_w, hidden_b, out_w, out_b]
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.05))
  optimizer.build(dense)  # its slots exist before a restore, so that it restores them at once
  state = [*dense, optimizer.iterations, *optimizer.variables]
  manager = tf_ext.DeltaCheckpointManager(
    os.path.join(args.dir, "chain"),
    [table],
    full_every_n_deltas=args.full_every // args.delta_every,
    dense=tf.train.Checkpoint(dense=dense, optimizer=optimizer),
  )
  batch_spec = [
    tf.TensorSpec([None, NUM_FIELDS], tf.int64),
    tf.TensorSpec([None, NUM_DENSE], tf.float32),
    tf.TensorSpec([None], tf.float32),
  ]

  @tf.function(input_signature=batch_spec)
  def train_step(ids, features, labels):
    with tf.GradientTape() as tape:
      rows = tf.reshape(table.lookup(ids), [-1, NUM_FIELDS * args.dim])
      hidden = tf.nn.relu(tf.concat([rows, features], 1) @ hidden_w + hidden_b)
      logits = tf.squeeze(hidden @ out_w + out_b, 1)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
    variables = [table.gradient_anchor, *dense]
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return tf.sigmoid(logits)

  lookups = Lookups(tf.function(table.lookup, input_signature=[batch_spec[0]]))

  def state_path(step):
    return os.path.join(args.dir, "state", f"{step:012d}.npz")

  # -- restore ----------------------------------------------------------------------------------
  reference, step = Reference(), 0
  started = time.perf_counter()
  restored = manager.restore()
  if restored is not None:
    step = int(optimizer.iterations.numpy())
    saved = np.load(state_path(restored))
    reference = Reference(saved["keys"], saved["counts"], saved["last"])
    digest, keys = table_digest(table, state)
    must, lost, _ = reference.lost(keys, args.min_count)
    events(
      "restore",
      step=restored,
      iterations=step,
      matched=digest == str(saved["digest"]) and step == restored,
      rows=len(keys),
      must=must,
      lost=len(lost),
      seconds=time.perf_counter() - started,
    )
  events("ready", step=step, size=int(table.size()))

  # -- train ------------------------------------------------------------------------------------
  stream = Stream(args)
  predictions, labels = [], []
  stop_file = os.path.join(args.dir, STOP)
  while True:
    if os.path.exists(stop_file):
      must, lost, waiting = reference.lost(table.export()[0].numpy(), args.min_count)
      events("final", step=step, must=must, lost=len(lost), waiting=waiting)
      break
    ids, features, label = stream.batch(step)
    id_tensor = tf.constant(ids)
    lookups.ids = id_tensor
    predictions.append(train_step(id_tensor, tf.constant(features), tf.constant(label)).numpy())
    labels.append(label)
    reference.train(np.unique(ids), step)  # the table's last step for these rows: `step`
    step += 1
    if step % args.evict_every == 0:
      expected = reference.evict(step - 1, args.ttl_steps, args.min_count)
      removed = int(table.evict(step=step - 1))
      events("evict", step=step, removed=removed, expected_at_least=expected)
    if step % args.auc_every == 0:
      window_auc = auc(np.concatenate(predictions), np.concatenate(labels))
      predictions, labels = [], []
      events("auc", step=step, auc=window_auc, size=int(table.size()), lookups=lookups.count)
    if step % args.delta_every == 0:
      digest, keys = table_digest(table, state)
      must, lost, waiting = reference.lost(keys, args.min_count)
      events(
        "check",
        step=step,
        must=must,
        lost=len(lost),
        waiting=waiting,
        rows=len(keys),
        **heap_stats(),
      )
      if len(lost):
        events("lost_ids", step=step, ids=[int(i) for i in lost[:20]])
      os.makedirs(os.path.dirname(state_path(step)), exist_ok=True)
      partial = state_path(step) + ".partial.npz"
      np.savez(
        partial,
        keys=reference.keys,
        counts=reference.counts,
        last=reference.last,
        digest=np.array(digest),
      )
      os.replace(partial, state_path(step))
      events("save_begin", step=step)
      link = manager.save(step, full=step % args.full_every == 0)
      events("save", step=step, link=link["kind"], rows=link["rows"], bytes=link["bytes"])
      kept = {state_path(link["step"]) for link in manager.links()}
      for name in os.listdir(os.path.dirname(state_path(step))):
        if os.path.join(os.path.dirname(state_path(step)), name) not in kept:
          os.remove(os.path.join(os.path.dirname(state_path(step)), name))
  lookups.stop()
  events("lookups", count=lookups.count, errors=lookups.errors[:5], error_count=len(lookups.errors))
  return 0


# ---- the driver ------------------------------------------------------------------------------


def child_rss(pid):
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError):
    pass
  return None


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
      rss = child_rss(child.pid)
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
    return run_child(args)
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

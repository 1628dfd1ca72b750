"""The training process of soak.py (`soak.py --child`): a small CTR model with a table under
admission and TTL eviction trains on the Criteo-like stream, checks at every link that no row was
lost, saves the digest a restore must give back, measures the progressive AUC per window, and
looks rows up from a second thread; every event is a JSON line that a SIGKILL cannot lose."""

import ctypes
import hashlib
import json
import os
import threading
import time

import numpy as np
from _common import process_rss

EVENTS, STOP = "events.jsonl", "STOP"


TABLE_NAME = "soak_ids"


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
    "rss": process_rss(os.getpid()),
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

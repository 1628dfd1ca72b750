"""Full and delta checkpoints of tables: `tf_ext.DeltaCheckpointManager`.

A *chain* is one full snapshot of every table followed by deltas, each holding only the rows
changed and the ids removed since the link before it. Restoring the chain's first k links gives
exactly the tables as they were when link k was saved. Every file is streamed in chunks by the
table's snapshot ops (kernels/dynamic_embedding/checkpoint_kernels.cc), never copied whole.

Directory layout (any file system TensorFlow writes):

  MANIFEST.json                         the chains and their links; replaced atomically, last
  chain-<id>/<sequence>/<table>.snap    one snapshot file per table and link
  chain-<id>/<sequence>/dense*          optionally, a TF checkpoint of the dense variables

A save writes its link's files first and the manifest last, so a save that fails or is killed
leaves the manifest, and every link it names, as they were. A delta taken after a failed save
could miss changes the failed one had consumed, so the save after a failure is always full.
"""

import ctypes
import hashlib
import json
import logging
import os
import random
import re
import time

import tensorflow as tf

from tf_ext import _ops_loader, settings
from tf_ext.dynamic_embedding import alltoall, checkpoint, live_tables
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.every_n_steps import check_every_n_steps

MANIFEST = "MANIFEST.json"
_FORMAT = 1
_log = logging.getLogger("tf_ext.delta_checkpoint")


def _table_file(name):
  """A file name for the table: readable, and unique through a hash of the full name."""
  readable = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
  return f"{readable}-{hashlib.sha256(name.encode('utf-8')).hexdigest()[:10]}.snap"


def _trim_heap():
  """Gives the heap memory this process freed back to the system (glibc's malloc_trim, which also
  releases whole free pages inside its arenas). Long jobs need it: glibc otherwise keeps the
  memory freed by training steps, fragmented, and the resident size creeps up though the memory
  in use stays flat."""
  try:
    ctypes.CDLL(None).malloc_trim(0)
  except AttributeError:  # another C library: no malloc_trim
    pass


def _rank_folder(rank, ranks):
  return f"rank-{rank}-of-{ranks}"


def _read_manifest(directory):
  """The manifest in `directory` (see DeltaCheckpointManager.read_manifest), or None."""
  path = os.path.join(directory, MANIFEST)
  if not tf.io.gfile.exists(path):
    return None
  try:
    with tf.io.gfile.GFile(path, "r") as f:
      manifest = json.load(f)
    if manifest.get("format") != _FORMAT or not isinstance(manifest.get("chains"), list):
      raise ValueError(f"format {manifest.get('format')!r}, expected {_FORMAT}")
  except (ValueError, AttributeError) as error:
    raise tf.errors.DataLossError(
      None, None, f"delta checkpoint manifest '{path}': {error}"
    ) from None
  return manifest


def _chosen_link(manifest, step):
  """(chain, index) of the latest link at or before `step` (None: the latest), or None."""
  chosen = None
  for chain in manifest["chains"]:
    for index, link in enumerate(chain["links"]):
      if step is None or link["step"] <= step:
        chosen = (chain, index)
  return chosen


def _total(link, key):
  """A link's rows, tombstones or bytes, over its tables."""
  return sum(table[key] for table in link["tables"].values())


class _SaverState:
  """Dense variables saved with each link through a tf.compat.v1.train.Saver (graph mode)."""

  def __init__(self, saver):
    self._saver = saver

  def save(self, path, session):
    self._saver.save(session, path, write_meta_graph=False, write_state=False)

  def restore(self, path, session):
    self._saver.restore(session, path)


class _CheckpointState:
  """Dense variables saved with each link through a tf.train.Checkpoint (eager)."""

  def __init__(self, checkpoint):
    self._checkpoint = checkpoint

  def save(self, path, session):
    del session
    self._checkpoint.write(path)

  def restore(self, path, session):
    del session
    self._checkpoint.read(path).expect_partial()


def _dense_state(dense):
  if dense is None:
    return None
  if isinstance(dense, tf.compat.v1.train.Saver):
    return _SaverState(dense)
  if isinstance(dense, tf.train.Checkpoint):
    return _CheckpointState(dense)
  raise ValueError(
    "DeltaCheckpointManager: dense must be a tf.compat.v1.train.Saver (graph mode), a "
    f"tf.train.Checkpoint (eager) or None, got {dense!r}"
  )


class PeriodicSaves:
  """What the session hook and the Keras callback share: their arguments (checked at once), when
  the next link is due (every n steps and/or every n seconds since the last save), their
  manager, and what each save returned (`saved`)."""

  def __init__(
    self, owner, directory, every_n_steps, every_n_secs, full_every_n_deltas, max_chains, tables
  ):
    if every_n_steps is None and every_n_secs is None:
      raise ValueError(f"{owner}: give every_n_steps, every_n_secs or both")
    if every_n_steps is not None:
      check_every_n_steps(owner, every_n_steps)
    if every_n_secs is not None and (
      isinstance(every_n_secs, bool)
      or not isinstance(every_n_secs, (int, float))
      or every_n_secs <= 0
    ):
      raise ValueError(f"{owner}: every_n_secs must be a positive number, got {every_n_secs!r}")
    check_every_n_steps(owner, full_every_n_deltas, "full_every_n_deltas")
    check_every_n_steps(owner, max_chains, "max_chains")
    self._every_n_steps, self._every_n_secs = every_n_steps, every_n_secs
    self._arguments = (os.fspath(directory), full_every_n_deltas, max_chains)
    self.tables = tables
    self.manager = None
    self.saved = []
    self.last_step = None  # the owner marks its starting step

  def start(self, tables, dense):
    """Creates the manager of `tables` (the given ones if any) and `dense` state."""
    directory, full_every_n_deltas, max_chains = self._arguments
    self.manager = DeltaCheckpointManager(
      directory, self.tables or tables, full_every_n_deltas, max_chains, dense
    )
    return self.manager

  def mark(self, step):
    self.last_step, self._last_time = step, time.monotonic()

  def due(self, step):
    """Whether a link is due at `step`; mark() the starting step first."""
    if self._every_n_steps is not None and step - self.last_step >= self._every_n_steps:
      return True
    return (
      self._every_n_secs is not None and time.monotonic() - self._last_time >= self._every_n_secs
    )

  def save(self, step, session=None):
    self.saved.append(self.manager.save(step, session))
    self.mark(step)


class SavesPeriodically:
  """Base of the session hook and the Keras callback (listed first among their bases): their
  arguments, and the PeriodicSaves made from them. Errors name the class."""

  def __init__(
    self,
    directory,
    every_n_steps=None,
    every_n_secs=None,
    full_every_n_deltas=10,
    max_chains=2,
    tables=None,
    dense=True,
    restore=True,
  ):
    super().__init__()
    self._saves = PeriodicSaves(
      type(self).__name__,
      directory,
      every_n_steps,
      every_n_secs,
      full_every_n_deltas,
      max_chains,
      tables,
    )
    self._dense, self._restore = dense, restore

  @property
  def manager(self):
    """The DeltaCheckpointManager, once training began."""
    return self._saves.manager

  @property
  def saved(self):
    """What each save returned (DeltaCheckpointManager.save)."""
    return self._saves.saved


class DeltaCheckpointManager:
  """Writes and restores chains of full and delta snapshots of dynamic embedding tables.

    manager = tf_ext.DeltaCheckpointManager("/ckpt/tables", full_every_n_deltas=10)
    manager.save(step)     # the first save of a chain is full, the next 10 are deltas
    manager.restore()      # the latest chain: its full snapshot, then its deltas in order

  Args:
    directory: where the chains and their manifest live.
    tables: the DynamicEmbeddingVariables to save (default: every table of the current graph,
      or every eager table, when the manager is created).
    full_every_n_deltas: a chain gets this many deltas, then the next save starts a new chain
      with a full snapshot.
    max_chains: chains kept; older ones are deleted once a newer chain's full snapshot is saved.
    dense: optionally, the dense state saved and restored with each link: a
      tf.compat.v1.train.Saver (graph mode; e.g. over tf.compat.v1.global_variables()) or a
      tf.train.Checkpoint (eager). It is written whole at every link.

  In graph mode, call `build()` before the graph is finalized (the session hook does) and pass
  the session to `save` and `restore`. One manager writes a directory at a time.
  """

  def __init__(self, directory, tables=None, full_every_n_deltas=10, max_chains=2, dense=None):
    owner = "DeltaCheckpointManager"
    self._directory = os.fspath(directory)
    if tables is None:
      tables = live_tables.tables()
    self._tables = list(tables)
    for table in self._tables:
      if not isinstance(table, variable_lib.DynamicEmbeddingVariable):
        raise ValueError(f"{owner}: tables must be DynamicEmbeddingVariables, got {table!r}")
    if not self._tables:
      raise ValueError(f"{owner}: no tables to save (create them first, or pass tables=...)")
    names = [t.name for t in self._tables]
    if len(set(names)) != len(names):
      raise ValueError(f"{owner}: two tables share a name: {sorted(names)}")
    check_every_n_steps(owner, full_every_n_deltas, "full_every_n_deltas")
    check_every_n_steps(owner, max_chains, "max_chains")
    self._root = self._directory
    split = [t for t in self._tables if isinstance(t, alltoall.AllToAllDynamicEmbeddingVariable)]
    self._ranks = split[0].ranks if split else None
    if split:  # every rank saves its parts, in a folder of its own under the one given
      self._directory = os.path.join(self._root, _rank_folder(split[0].rank, self._ranks))
    self._full_every = full_every_n_deltas
    self._max_chains = max_chains
    self._dense = _dense_state(dense)
    self._graph_ops = None
    # The chain this process continues: its id, the sequence of its last link, and each
    # table's version at that link (TfExtTableSaveSnapshot's since_version for the next delta).
    self._chain_id = None
    self._sequence = None
    self._since = {}

  @property
  def directory(self):
    """Where this manager's manifest and links are: the directory given, or with tables split
    across Horovod ranks, this rank's folder in it (`rank-<r>-of-<ranks>`)."""
    return self._directory

  def _saved_by_other_ranks(self):
    """Where a restore that finds no manifest of its own reads: the folders of every rank that
    saved the tables split across another number of ranks, or the directory given, which one
    process's tables saved; [] when nothing was saved. An error where this rank's folder alone
    lost its manifest, or where several numbers of ranks saved."""
    pattern = os.path.join(self._root, _rank_folder("*", "*"), MANIFEST)
    counts = sorted({re.sub(r".*-of-", "", os.path.dirname(p)) for p in tf.io.gfile.glob(pattern)})
    if str(self._ranks) in counts:
      raise tf.errors.NotFoundError(
        None,
        None,
        f"DeltaCheckpointManager: {self._directory} holds no manifest, while other ranks' "
        f"folders in {self._root} do: this rank's part of the checkpoint is missing",
      )
    if len(counts) > 1:
      raise ValueError(
        f"DeltaCheckpointManager: {self._root} holds delta checkpoints saved by "
        f"{' and by '.join(counts)} ranks; keep one of them there"
      )
    if counts:
      ranks = int(counts[0])
      folders = [os.path.join(self._root, _rank_folder(r, ranks)) for r in range(ranks)]
      missing = [f for f in folders if not tf.io.gfile.exists(os.path.join(f, MANIFEST))]
      if missing:
        raise tf.errors.NotFoundError(
          None, None, f"DeltaCheckpointManager: the parts saved by {ranks} ranks lack {missing}"
        )
      return folders
    if self._root != self._directory and tf.io.gfile.exists(os.path.join(self._root, MANIFEST)):
      return [self._root]
    return []

  @property
  def tables(self):
    return list(self._tables)

  # ---- ops, eager or graph ------------------------------------------------------------------

  def build(self):
    """Graph mode: creates the save and restore ops in the current graph (idempotent)."""
    if tf.executing_eagerly() or self._graph_ops is not None:
      return
    ops = {}
    with tf.name_scope("delta_checkpoint"):
      for table in self._tables:
        feeds = {
          "path": tf.compat.v1.placeholder(tf.string, []),
          "since": tf.compat.v1.placeholder(tf.int64, []),
          "chain": tf.compat.v1.placeholder(tf.int64, []),
          "sequence": tf.compat.v1.placeholder(tf.int64, []),
          "step": tf.compat.v1.placeholder(tf.int64, []),
          "paths": tf.compat.v1.placeholder(tf.string, [None]),
        }
        ops[table.name] = (
          feeds,
          self._save_op(table, feeds),
          self._restore_op(table, feeds),
          self._restore_op(table, feeds, verify_only=True),
        )
    self._graph_ops = ops

  @staticmethod
  def _save_op(table, feeds):
    with table.colocated():
      return _ops_loader.load().tf_ext_table_save_snapshot(
        table.resource_handle,
        feeds["path"],
        since_version=feeds["since"],
        chain_id=feeds["chain"],
        sequence=feeds["sequence"],
        step=feeds["step"],
        track=True,
      )[:4]

  @staticmethod
  def _restore_op(table, feeds, verify_only=False):
    # A table split across ranks keeps the ids it owns (of chains saved by any number of ranks).
    num_shards, shard_index = checkpoint.kept_part_of(table)
    with table.colocated():
      return _ops_loader.load().tf_ext_table_restore_snapshots(
        table.resource_handle,
        feeds["paths"],
        track=True,
        verify_only=verify_only,
        num_shards=num_shards,
        shard_index=shard_index,
      )

  def _run(self, table, kind, session, **values):
    """Runs the table's "save", "restore" or "verify" (a restore's checks, changing nothing) op
    with these inputs; returns numpy results."""
    if tf.executing_eagerly():
      feeds = {
        k: tf.constant(v, tf.string if k in ("path", "paths") else tf.int64)
        for k, v in values.items()
      }
      if kind == "save":
        return [t.numpy() for t in self._save_op(table, feeds)]
      return [t.numpy() for t in self._restore_op(table, feeds, verify_only=kind == "verify")]
    if self._graph_ops is None:
      raise RuntimeError(
        "DeltaCheckpointManager: in graph mode, call build() before the graph is finalized"
      )
    if session is None:
      raise ValueError("DeltaCheckpointManager: in graph mode, pass session=")
    feeds, save, restore, verify = self._graph_ops[table.name]
    op = {"save": save, "restore": restore, "verify": verify}[kind]
    return session.run(op, {feeds[k]: v for k, v in values.items()})

  # ---- manifest -----------------------------------------------------------------------------

  def _path(self, relative):
    return os.path.join(self._directory, relative)

  def read_manifest(self):
    """The manifest: {"format": 1, "chains": [{"chain_id", "links": [...]}, ...]}, oldest
    chain first; None when nothing was saved yet."""
    return _read_manifest(self._directory)

  def _write_manifest(self, manifest):
    path = self._path(MANIFEST)
    temporary = f"{path}.tmp-{os.getpid()}-{random.getrandbits(32):08x}"
    with tf.io.gfile.GFile(temporary, "w") as f:
      json.dump(manifest, f, indent=1)
    tf.io.gfile.rename(temporary, path, overwrite=True)

  def links(self):
    """The links of every chain kept, oldest first: dicts with chain_id, sequence, kind, step,
    time, bytes."""
    manifest = self.read_manifest() or {"chains": []}
    return [
      {
        "chain_id": chain["chain_id"],
        "sequence": link["sequence"],
        "kind": link["kind"],
        "step": link["step"],
        "time": link["time"],
        "bytes": _total(link, "bytes"),
      }
      for chain in manifest["chains"]
      for link in chain["links"]
    ]

  # ---- save ---------------------------------------------------------------------------------

  def save(self, step=0, session=None, full=False):
    """Writes the next link: a delta, or a full snapshot when a new chain is due (the first
    save, every full_every_n_deltas + 1 saves, after a failed save or a restore of an older
    link) or when `full`. Returns a dict describing the link (kind, sequence, step, rows,
    tombstones, bytes, seconds)."""
    step = int(step)
    start = time.perf_counter()
    delta = (
      not full
      and self._chain_id is not None
      and self._sequence < self._full_every
      and all(t.name in self._since for t in self._tables)
    )
    if delta:
      try:
        return self._write_link(False, step, session, start)
      except tf.errors.FailedPreconditionError as error:  # a table cannot take a delta
        _log.warning("tf_ext: writing a full snapshot instead of a delta: %s", error.message)
    return self._write_link(True, step, session, start)

  def _write_link(self, full, step, session, start):
    chain_id = random.getrandbits(62) if full else self._chain_id
    sequence = 0 if full else self._sequence + 1
    chain_name = f"{chain_id:016x}"  # as the manifest and the folder name it
    link_dir = f"chain-{chain_name}/{sequence:06d}"
    self._remove(link_dir)  # what a killed save of this link may have left
    tf.io.gfile.makedirs(self._path(link_dir))
    link = {"sequence": sequence, "kind": "full" if full else "delta", "step": step, "tables": {}}
    since = {}
    try:
      for table in self._tables:
        relative = f"{link_dir}/{_table_file(table.name)}"
        version, rows, tombstones, size = self._run(
          table,
          "save",
          session,
          path=self._path(relative),
          since=-1 if full else self._since[table.name],
          chain=chain_id,
          sequence=sequence,
          step=step,
        )
        since[table.name] = int(version)
        link["tables"][table.name] = {
          "file": relative,
          "rows": int(rows),
          "tombstones": int(tombstones),
          "bytes": int(size),
        }
      if self._dense is not None:
        link["dense"] = f"{link_dir}/dense"
        self._dense.save(self._path(link["dense"]), session)
      link["time"] = time.time()
      manifest = self.read_manifest() or {"format": _FORMAT, "chains": []}
      if full:
        manifest["chains"].append({"chain_id": chain_name, "links": [link]})
      else:
        chain = manifest["chains"][-1] if manifest["chains"] else None
        if chain is None or chain["chain_id"] != chain_name:
          raise tf.errors.FailedPreconditionError(
            None, None, f"the manifest's latest chain is not {chain_name}"
          )
        chain["links"].append(link)
      manifest["chains"] = manifest["chains"][-self._max_chains :]
      self._write_manifest(manifest)
    except BaseException:
      # The tables may have forgotten changes this link consumed: the next save is full.
      self._chain_id, self._sequence, self._since = None, None, {}
      self._remove(link_dir)
      raise
    self._chain_id, self._sequence, self._since = chain_id, sequence, since
    # Chains dropped from the manifest, and any a killed save left behind.
    kept = {f"chain-{chain['chain_id']}" for chain in manifest["chains"]}
    for entry in tf.io.gfile.listdir(self._directory):
      entry = entry.rstrip("/")
      if entry.startswith("chain-") and entry not in kept:
        self._remove(entry)
    summary = {k: link[k] for k in ("kind", "sequence", "step")}
    for key in ("rows", "tombstones", "bytes"):
      summary[key] = _total(link, key)
    summary["seconds"] = time.perf_counter() - start
    if settings.get("TF_EXT_TRIM_HEAP_AFTER_SAVE"):
      _trim_heap()
    return summary

  def _remove(self, relative):
    path = self._path(relative)
    try:
      if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
    except tf.errors.OpError as error:  # a leftover directory is no reason to fail a save
      _log.warning("tf_ext: could not delete %s: %s", path, error.message)

  # ---- restore ------------------------------------------------------------------------------

  def latest_step(self):
    """The step of the latest link, or None when nothing was saved."""
    links = self.links()
    return links[-1]["step"] if links else None

  def _chain_files(self, table, directory, chain, links):
    """The files of `table` in `links` of `chain` (the manifest's in `directory`), each present."""
    files = []
    for link in links:
      entry = link["tables"].get(table.name)
      if entry is None:
        raise variable_lib.invalid_argument(
          table.name,
          f"delta checkpoint '{os.path.join(directory, MANIFEST)}' has no snapshot of this "
          f"table in chain {chain['chain_id']} link {link['sequence']}",
        )
      files.append(os.path.join(directory, entry["file"]))
    for path in files:  # before any table changes
      if not tf.io.gfile.exists(path):
        raise tf.errors.NotFoundError(
          None, None, f"dynamic embedding table '{table.name}': snapshot file '{path}' is missing"
        )
    return files

  def restore(self, session=None, step=None):
    """Restores every table (and the dense state, when the manager has one) from the latest
    link, or from the latest link at or before `step`. Returns the link's step, or None when
    the directory holds no checkpoint. Every file of every table is checked (present, its
    checksums, its place in the chain) before the first table changes: a missing, corrupt or
    out-of-order file is an error naming it, and leaves every table as it was.

    Tables split across Horovod ranks restore their rank's folder. Where it holds nothing, a
    checkpoint that another number of ranks saved (or one process's plain tables) restores:
    every rank reads every part's chain and keeps the ids it owns; a plain table reads every
    part. The parts' links must have the same step; the next save then starts a new chain."""
    manifest = self.read_manifest()
    sources = [self._directory]
    if manifest is None:
      sources = self._saved_by_other_ranks()
      if not sources:
        return None
    manifests = [manifest] if manifest is not None else [_read_manifest(d) for d in sources]
    chosen = [_chosen_link(m, step) for m in manifests]
    if any(c is None for c in chosen):
      return None
    steps = {c[0]["links"][c[1]]["step"] for c in chosen}
    if len(steps) > 1:
      raise ValueError(
        f"DeltaCheckpointManager: the ranks' latest links in {self._root} were saved at "
        f"different steps {sorted(steps)}; pass restore(step=) one that every rank saved"
      )
    paths = {}
    for table in self._tables:
      chains = []  # one per folder: the chains of a table's parts, merged by the restore
      for source, (chain, index) in zip(sources, chosen):
        chains.append(self._chain_files(table, source, chain, chain["links"][: index + 1]))
      paths[table.name] = [p for files in chains for p in ["", *files]][1:]
    for table in self._tables:  # every file read and checked in full before any table changes
      self._run(table, "verify", session, paths=paths[table.name])
    since = {}
    for table in self._tables:
      version, _ = self._run(table, "restore", session, paths=paths[table.name])
      since[table.name] = int(version)
    (chain, index), source = chosen[0], sources[0]
    last = chain["links"][index]
    if self._dense is not None and last.get("dense"):  # (the same on every rank)
      self._dense.restore(os.path.join(source, last["dense"]), session)
    # Continue the chain only from its latest link; from an earlier one, start a new chain.
    tip = manifest is not None and chain is manifest["chains"][-1]
    tip = tip and index == len(chain["links"]) - 1
    if tip:
      self._chain_id = int(chain["chain_id"], 16)
      self._sequence = last["sequence"]
      self._since = since
    else:
      self._chain_id, self._sequence, self._since = None, None, {}
    return last["step"]

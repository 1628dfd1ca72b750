"""The tables of a TFRA checkpoint: TfraCheckpoint finds each Variable's and slot Variable's
tables (TableGroup) by their names in a bundle, or as FileSystemSaver's key and value files, and
reads their rows in chunks."""

import collections
import os
import re

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding.tfra.checkpoint_slots import SLOT_NAMES
from tf_ext.dynamic_embedding.tfra.tensor_bundle import DTYPES, Bundle, data_loss

# ---- FileSystemSaver's key and value files ---------------------------------------------------


class KeyValueFiles:
  """The `-keys` / `-values` files FileSystemSaver writes: raw little-endian keys and rows."""

  def __init__(self, key_dtype=tf.int64, value_dtype=tf.float32):
    self.key_dtype = tf.as_dtype(key_dtype)
    self.value_dtype = tf.as_dtype(value_dtype)
    if self.key_dtype == tf.string:
      raise ValueError("tf_ext.tfra: FileSystemSaver files of string keys are not read")

  def rows(self, keys_path, values_path, dim=None):
    """(rows, dim) of a pair of files; DataLossError when their sizes disagree."""
    key_bytes = tf.io.gfile.stat(keys_path).length
    value_bytes = tf.io.gfile.stat(values_path).length
    key_item = DTYPES[self.key_dtype].itemsize
    value_item = DTYPES[self.value_dtype].itemsize
    if key_bytes % key_item:
      raise data_loss(keys_path, f"truncated: {key_bytes} bytes is not a whole number of keys")
    rows = key_bytes // key_item
    if dim is None:
      dim = value_bytes // (rows * value_item) if rows else 0
    if value_bytes != rows * dim * value_item:
      raise data_loss(
        values_path,
        f"truncated or corrupt: {value_bytes} bytes, {rows} rows of dim {dim} "
        f"({keys_path} holds {rows} keys) need {rows * dim * value_item}",
      )
    return rows, dim

  def chunks(self, path, rows_per_chunk, row_items, dtype):
    item = DTYPES[dtype]
    with tf.io.gfile.GFile(path, "rb") as f:
      while True:
        data = f.read(rows_per_chunk * row_items * item.itemsize)
        if not data:
          return
        yield np.frombuffer(data, item).reshape([-1] + ([row_items] if row_items > 1 else []))


# ---- The tables of a TFRA checkpoint -----------------------------------------------------------

_TF1_TABLE = re.compile(
  r"^(?:(?P<scope>.*)/)?(?P<table>[^/]+)_mht_(?P<i>\d+)of(?P<n>\d+)-(?P<part>keys|values)$"
)
_OBJECT_TABLE = re.compile(
  r"^(?P<path>(?:.*/)?)tables_of_(?P<var>[^/]+)/(?P<i>\d+)/\.ATTRIBUTES/table-"
  r"(?P<part>keys|values|shard_upsert_restore)$"
)
_FILE_TABLE = re.compile(
  r"^(?P<table>.+)_mht_(?P<i>\d+)of(?P<n>\d+)_rank(?P<r>\d+)_size(?P<s>\d+)-(?P<part>keys|values)$"
)
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def unescape_local_name(local_name):
  """A trackable's local name as TensorFlow wrote it ("/" is ".S", "." is "..")."""
  return re.sub(r"\.(.)", lambda m: {"S": "/", ".": "."}.get(m.group(1), m.group(0)), local_name)


def flat_name(name):
  return name.replace("/", "_")


class Shard:
  """One TFRA table: a shard of a Variable, its keys and values (tensors or files)."""

  def __init__(self, index, keys, values, rows, files=()):
    self.index, self.keys, self.values, self.rows = index, keys, values, rows
    self.files = list(files)  # [(keys path, values path)] of FileSystemSaver's ranks


class TableGroup:
  """A TFRA Variable (or slot Variable) of a checkpoint: its shards.

  name: the Variable's name where the checkpoint keeps it (object-based), else its name with "/"
    as "_" (as in its tables' names); exact says which. path: the checkpoint key of its object
    (object-based) or its tables' op scope (TF1)."""

  def __init__(self, name, exact, path, shards, dim, key_dtype, value_dtype, source):
    self.name, self.exact, self.path = name, exact, path
    self.shards, self.dim = shards, dim
    self.key_dtype, self.value_dtype, self.source = key_dtype, value_dtype, source

  @property
  def flat(self):
    return flat_name(self.name)

  @property
  def rows(self):
    return sum(s.rows for s in self.shards)

  def is_named(self, name):
    return self.name == name if self.exact else self.flat == flat_name(name)

  def slot_of(self, name):
    """(scope, slot) when this is a slot Variable of the Variable `name`, else None."""
    if self.exact:
      match = re.match(re.escape(name) + r"/(.+)/([^/]+)$", self.name)
    else:
      match = re.match(re.escape(flat_name(name)) + r"_(.+)_([^_]+)$", self.flat)
    return (match.group(1), match.group(2)) if match else None

  def __repr__(self):
    return f"<TFRA table group '{self.name}' shards={len(self.shards)} rows={self.rows}>"


def _checkpoint_prefix(path):
  """The checkpoint prefix `path` names (a prefix, an index file, a checkpoint directory, a
  SavedModel), or ("files", dir) for a directory of FileSystemSaver files."""
  if path.endswith(".index") and tf.io.gfile.exists(path):
    return path[: -len(".index")]
  if tf.io.gfile.isdir(path):
    saved = os.path.join(path, "variables", "variables")
    if tf.io.gfile.exists(saved + ".index"):
      return saved
    latest = tf.train.latest_checkpoint(path)
    if latest:
      return latest
    if any(_FILE_TABLE.match(n) for n in tf.io.gfile.listdir(path)):
      return ("files", path)
    raise tf.errors.NotFoundError(
      None,
      None,
      f"'{path}' holds no TFRA checkpoint (no checkpoint, SavedModel or FileSystemSaver files)",
    )
  return path


def _kv_directories(prefix):
  """Where FileSystemSaver's files of the checkpoint at `prefix` are."""
  parent = os.path.dirname(prefix)
  found = [os.path.join(parent, "TFRADynamicEmbedding")]
  step = re.search(r"-(\d+)$", prefix)
  if step:
    number = int(step.group(1))
    found += [
      os.path.join(parent, f"TFRADynamicEmbedding-{number}"),
      os.path.join(parent, f"TFRADynamicEmbedding-{number:08d}"),
    ]
  return [d for d in found if tf.io.gfile.isdir(d)]


class TfraCheckpoint:
  """The TFRA tables of a checkpoint, FileSystemSaver directory or SavedModel at `path`.

  groups: {name: TableGroup}, each Variable and slot Variable. bundle: the checkpoint (None for
  a directory of files). key_dtype, value_dtype: of FileSystemSaver files (they do not say)."""

  def __init__(self, path, key_dtype=tf.int64, value_dtype=tf.float32):
    self.path = path
    self.kv = KeyValueFiles(key_dtype, value_dtype) if tf.as_dtype(key_dtype) != tf.string else None
    prefix = _checkpoint_prefix(path)
    self.groups = {}
    self.table_tensors = set()
    if isinstance(prefix, tuple):
      self.prefix, self.bundle, self.kind = prefix[1], None, "files"
      self._add_files(prefix[1], {})
      return
    self.prefix = prefix
    self.bundle = Bundle(prefix)
    self.kind = "object" if _OBJECT_GRAPH in self.bundle.entries else "saver"
    found = collections.defaultdict(dict)  # (name, exact, path) -> {index: {part: tensor}}
    shard_counts = {}
    upserted = {}  # FileSystemSaver: flat name -> (exact name, object path)
    for tensor in self.bundle.entries:
      match = _OBJECT_TABLE.match(tensor)
      if match:
        name = unescape_local_name(match.group("var"))
        self.table_tensors.add(tensor)
        if match.group("part") == "shard_upsert_restore":
          upserted[flat_name(name)] = (name, match.group("path").rstrip("/"))
          continue
        key = (name, True, match.group("path").rstrip("/"))
        found[key].setdefault(int(match.group("i")), {})[match.group("part")] = tensor
        continue
      match = _TF1_TABLE.match(tensor)
      if match and self.kind == "saver":
        self.table_tensors.add(tensor)
        key = (match.group("table"), False, match.group("scope") or "")
        found[key].setdefault(int(match.group("i")) - 1, {})[match.group("part")] = tensor
        shard_counts.setdefault(key, set()).add(int(match.group("n")))
    for (name, exact, path), shards in found.items():
      self._add_tensors(name, exact, path, shards, shard_counts.get((name, exact, path)))
    if upserted:
      directories = _kv_directories(prefix)
      if not directories:
        raise tf.errors.NotFoundError(
          None,
          None,
          f"TFRA checkpoint '{prefix}' was saved with FileSystemSaver, and its key and value "
          f"files are not beside it (TFRADynamicEmbedding-*/ in {os.path.dirname(prefix)})",
        )
      self._add_files(directories[-1], upserted)

  def _add_tensors(self, name, exact, path, shards, counts):
    where = self.bundle.index_path
    if counts is not None and len(counts) != 1:
      raise data_loss(where, f"tables of '{name}' disagree on their number of shards {counts}")
    total = counts.pop() if counts else len(shards)
    if sorted(shards) != list(range(total)) or any(len(p) != 2 for p in shards.values()):
      raise data_loss(where, f"the checkpoint holds only part of the tables of '{name}'")
    result, dim, key_dtype, value_dtype = [], None, None, None
    for index in range(total):
      keys, values = shards[index]["keys"], shards[index]["values"]
      key_shape, value_shape = self.bundle.shape(keys), self.bundle.shape(values)
      if len(key_shape) != 1 or len(value_shape) != 2 or value_shape[0] != key_shape[0]:
        raise data_loss(where, f"table {keys!r} has keys {key_shape} and values {value_shape}")
      dim, key_dtype, value_dtype = (
        value_shape[1],
        self.bundle.dtype(keys),
        self.bundle.dtype(values),
      )
      result.append(Shard(index, keys, values, key_shape[0]))
    self.groups[name] = TableGroup(name, exact, path, result, dim, key_dtype, value_dtype, "bundle")

  def _add_files(self, directory, exact_names):
    if self.kv is None:
      raise ValueError("tf_ext.tfra: FileSystemSaver files of string keys are not read")
    by_table = collections.defaultdict(lambda: collections.defaultdict(dict))
    counts = collections.defaultdict(set)
    for file in sorted(tf.io.gfile.listdir(directory)):
      match = _FILE_TABLE.match(file)
      if not match:
        continue
      table, index = match.group("table"), int(match.group("i")) - 1
      rank = (int(match.group("r")), int(match.group("s")))
      by_table[table][index].setdefault(rank, {})[match.group("part")] = os.path.join(
        directory, file
      )
      counts[table].add(int(match.group("n")))
    for table, shards in by_table.items():
      total = counts[table].pop()
      if sorted(shards) != list(range(total)):
        raise data_loss(directory, f"FileSystemSaver files of '{table}' miss shards")
      result, dim = [], None
      for index in range(total):
        files, rows = [], 0
        for rank, parts in sorted(shards[index].items()):
          if len(parts) != 2:
            raise data_loss(directory, f"'{table}' shard {index + 1} rank {rank} lacks a file")
          count, dim = self.kv.rows(parts["keys"], parts["values"], dim)
          files.append((parts["keys"], parts["values"]))
          rows += count
        result.append(Shard(index, None, None, rows, files))
      name, path = exact_names.get(table, (table, ""))
      self.groups[name] = TableGroup(
        name,
        table in exact_names,
        path,
        result,
        dim,
        self.kv.key_dtype,
        self.kv.value_dtype,
        "files",
      )

  # ---- reading a group's rows ----------------------------------------------------------------

  def shard_chunks(self, group, shard, rows_per_chunk):
    """(keys, values) chunks of one shard: int64 keys (numpy) or lists of bytes, rows as saved."""
    if group.source == "files":
      for keys_path, values_path in shard.files:
        keys = self.kv.chunks(keys_path, rows_per_chunk, 1, self.kv.key_dtype)
        values = self.kv.chunks(values_path, rows_per_chunk, group.dim, self.kv.value_dtype)
        for k, v in zip(keys, values):
          yield _stored_keys(k), v
      return
    keys = self.bundle.chunks(shard.keys, rows_per_chunk)
    values = self.bundle.chunks(shard.values, rows_per_chunk)
    for k, v in zip(keys, values):
      yield _stored_keys(k), np.asarray(v)
    # Both generators run to their end, so each one's checksum is checked.
    for _ in keys:
      pass
    for _ in values:
      pass

  def key_chunks(self, group, rows_per_chunk):
    for shard in group.shards:
      if group.source == "files":
        for keys_path, _ in shard.files:
          for k in self.kv.chunks(keys_path, rows_per_chunk, 1, self.kv.key_dtype):
            yield _stored_keys(k)
      else:
        for k in self.bundle.chunks(shard.keys, rows_per_chunk):
          yield _stored_keys(k)

  def chunks(self, group, rows_per_chunk):
    for shard in group.shards:
      yield from self.shard_chunks(group, shard, rows_per_chunk)

  def dense_tensors(self):
    """The names of the checkpoint's tensors that are no TFRA table."""
    if self.bundle is None:
      return []
    return sorted(set(self.bundle.entries) - self.table_tensors - {_OBJECT_GRAPH})

  # ---- Variables and their slots ---------------------------------------------------------------

  def group_of(self, name):
    for group in self.groups.values():
      if group.is_named(name):
        return group
    return None

  def slot_groups(self, name, exclude=()):
    """{scope: {slot: TableGroup}} of the slot Variables of the Variable `name`."""
    found = collections.defaultdict(dict)
    for group in self.groups.values():
      if group.is_named(name) or group in exclude:
        continue
      slot = group.slot_of(name)
      if slot and slot[1] in SLOT_NAMES:
        found[slot[0]][slot[1]] = group
    return dict(found)

  def variables(self):
    """The groups that are Variables (not another group's slots)."""
    slots = set()
    for group in self.groups.values():
      for scopes in self.slot_groups(group.name).values():
        slots.update(scopes.values())
    return [g for g in self.groups.values() if g not in slots]


def _stored_keys(keys):
  if isinstance(keys, list):
    return keys
  return keys.astype(np.int64, copy=False)

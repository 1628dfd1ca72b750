"""A TFRA Variable (and its slots) streamed into tf_ext snapshot files, a chunk of rows at a
time."""

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding.tfra import dtypes
from tf_ext.dynamic_embedding.tfra.tensor_bundle import DTYPES, data_loss, read_exactly, seek

CHUNK_ROWS = 65536


class _SlotSource:
  """A slot Variable's rows, joined with the Variable's by key: in step when both hold the same
  keys in the same order (TFRA's tables of a Variable and its slots are filled alike), else by
  key (the slot's keys, not its rows, in memory)."""

  def __init__(self, checkpoint, group, slot, rows_per_chunk):
    self.checkpoint, self.slot, self.rows_per_chunk = checkpoint, slot, rows_per_chunk
    self.in_step = _same_keys(checkpoint, group, slot, rows_per_chunk)
    self.matched = 0
    if self.in_step:
      self._chunks = checkpoint.chunks(slot, rows_per_chunk)
      return
    keys = list(checkpoint.key_chunks(slot, rows_per_chunk))
    if slot.key_dtype == tf.string:
      flat = [k for chunk in keys for k in chunk]
      self._positions = {k: i for i, k in enumerate(flat)}
    else:
      flat = np.concatenate(keys) if keys else np.zeros(0, np.int64)
      self._order = np.argsort(flat, kind="stable")
      self._sorted = flat[self._order]
    # Where each position's row is: (shard, first position of the shard).
    self._starts = np.cumsum([0] + [s.rows for s in slot.shards])
    for _ in checkpoint.chunks(slot, rows_per_chunk):  # its rows' checksums, before any use
      pass

  def rows_for(self, keys, dim, initial):
    """The slot's rows for `keys` (the Variable's chunk); its initial value where it has none."""
    if self.in_step:
      slot_keys, rows = next(self._chunks)
      self.matched += len(slot_keys)
      return rows
    out = np.full((len(keys), dim), initial, np.float32)
    if self.slot.key_dtype == tf.string:
      pairs = [(i, self._positions[k]) for i, k in enumerate(keys) if k in self._positions]
      where = np.array([p[0] for p in pairs], np.int64)
      positions = np.array([p[1] for p in pairs], np.int64)
    else:
      at = np.searchsorted(self._sorted, keys)
      found = at < len(self._sorted)
      found[found] = self._sorted[at[found]] == keys[found]
      where = np.flatnonzero(found)
      positions = self._order[at[found]]
    self.matched += len(where)
    for index, shard in enumerate(self.slot.shards):
      inside = (positions >= self._starts[index]) & (positions < self._starts[index + 1])
      if not inside.any():
        continue
      local = positions[inside] - self._starts[index]
      out[where[inside]] = self._read(shard, local)
    return out

  def _read(self, shard, positions):
    if self.slot.source == "bundle":
      return self.checkpoint.bundle.read_rows(shard.values, positions).astype(np.float32)
    # FileSystemSaver files: the positions run over the shard's rank files in turn.
    out, first = np.zeros((len(positions), self.slot.dim), np.float32), 0
    for keys_path, values_path in shard.files:
      rows, _ = self.checkpoint.kv.rows(keys_path, values_path, self.slot.dim)
      inside = (positions >= first) & (positions < first + rows)
      item = DTYPES[self.checkpoint.kv.value_dtype]
      with tf.io.gfile.GFile(values_path, "rb") as f:
        for i in np.flatnonzero(inside):
          seek(f, int(positions[i] - first) * self.slot.dim * item.itemsize, values_path, "rows")
          out[i] = np.frombuffer(
            read_exactly(f, self.slot.dim * item.itemsize, values_path, "rows"), item
          )
      first += rows
    return out


def _same_keys(checkpoint, group, slot, rows_per_chunk):
  if [s.rows for s in group.shards] != [s.rows for s in slot.shards]:
    return False
  for a, b in zip(
    checkpoint.key_chunks(group, rows_per_chunk), checkpoint.key_chunks(slot, rows_per_chunk)
  ):
    if len(a) != len(b) or (isinstance(a, list) and a != b):
      return False
    if not isinstance(a, list) and not np.array_equal(a, b):
      return False
  return True


def write_snapshots(
  checkpoint,
  group,
  slots,
  slot_initial_values,
  writers,
  route,
  update_count,
  rows_per_chunk=CHUNK_ROWS,
  progress=None,
  encode=None,
):
  """Streams the TFRA Variable `group` and its `slots` (TableGroup or None each) into `writers`
  (SnapshotWriters), each key to writers[route(keys)[i]], its rows as encode(rows) (`row_encoder`;
  default: as float32). Returns {"rows", "missing_slot_rows", "dropped_slot_rows"}."""
  for slot in slots:
    if slot is not None and slot.dim != group.dim:
      raise data_loss(
        checkpoint.path, f"slot '{slot.name}' has dim {slot.dim}, '{group.name}' has {group.dim}"
      )
  sources = [
    None if slot is None else _SlotSource(checkpoint, group, slot, rows_per_chunk) for slot in slots
  ]
  rows = missing = 0
  last_step = max(update_count - 1, 0)
  for keys, values in checkpoint.chunks(group, rows_per_chunk):
    parts = [encode(values) if encode is not None else np.asarray(values, np.float32)]
    for source, initial in zip(sources, slot_initial_values):
      if source is None:
        parts.append(np.full((len(keys), group.dim), initial, np.float32))
        missing += len(keys)
      else:
        before = source.matched
        parts.append(np.asarray(source.rows_for(keys, group.dim, initial), np.float32))
        if not source.in_step:
          missing += len(keys) - (source.matched - before)
    block = np.concatenate(parts, axis=1)
    shard_of = np.asarray(route(keys))
    counts = np.full(len(keys), update_count, np.uint32)
    steps = np.full(len(keys), last_step, np.int64)
    for index, writer in enumerate(writers):
      chosen = np.flatnonzero(shard_of == index)
      if len(chosen) == 0:
        continue
      if isinstance(keys, list):
        shard_keys = [keys[i] for i in chosen]
      else:
        shard_keys = keys[chosen]
      writer.add(shard_keys, counts[chosen], steps[chosen], block[chosen])
    rows += len(keys)
    if progress is not None:
      progress(len(keys))
  dropped = sum(s.slot.rows - s.matched for s in sources if s is not None)
  return {"rows": rows, "missing_slot_rows": missing, "dropped_slot_rows": dropped}


def row_encoder(value_dtype, dim):
  """(stored dim, encode): how a tf.tfra Variable of `value_dtype` holds rows in its float32 table
  (dtypes.RowCodec, in numpy): by value, or the bits of int32, int64 and float64 rows."""
  codec = dtypes.RowCodec(value_dtype, dim)
  numpy_dtype = codec.value_dtype.as_numpy_dtype

  def encode(rows):
    rows = np.asarray(rows)
    if not codec.bitwise:
      return rows.astype(np.float32)
    words = np.ascontiguousarray(rows.astype(numpy_dtype)).view(np.float32)
    return words.reshape(len(rows), codec.stored_dim)

  return codec.stored_dim, encode

"""TFRA 0.7.2 checkpoints, read without TFRA, restored into tf_ext.tfra Variables.

`restore_from_tfra(path, variables, optimizer)` fills the Variables' tf_ext tables from a checkpoint
that TFRA wrote: their rows, and the optimizer's slots, which TFRA keeps as Variables of their own
and tf_ext inside each row's table entry. The tables are streamed in chunks into tf_ext snapshot
files (snapshot_file.cc's format) in a temporary directory, then restored by the table's own
restore op, which replaces a table only once its file was read whole: a truncated or corrupt TFRA
file is a DataLossError naming it, and leaves every table as it was.

How TFRA names a table (one per device of a Variable, and one per slot Variable):
  table             `<variable name, "/" as "_">_mht_<i>of<n>` (i from 1)
  slot Variable     `<variable name>/<scope>/<slot>`: scope is the TF1 optimizer's name ("Adam"),
                    or for Keras optimizers the trainable's name (a ShadowVariable's,
                    "DynamicEmbedding/<layer>-shadow" in a Keras layer); slot "m", "v", "vhat",
                    "accumulator", "momentum", "linear" (TF1 FTRL: "accum")
  tf.compat.v1.train.Saver   `<op scope>/<table>-keys` [n] and `<op scope>/<table>-values` [n, dim]
  object-based (tf.train.Checkpoint, Keras save_weights, SavedModel variables/)
                    `<object path>/tables_of_<variable name>/<i-1>/.ATTRIBUTES/table-keys|-values`;
                    slot Variables are the optimizer's children, named by their full name
  FileSystemSaver   files `<table>_rank<r>_size<s>-keys|-values` (raw little-endian keys and
                    rows); a checkpoint then holds `.../table-shard_upsert_restore` instead, and
                    the files are in `TFRADynamicEmbedding-<step>/` beside it (a SavedModel's in
                    `variables/TFRADynamicEmbedding/`)

What restores exactly: keys, rows (any row dtype a tf_ext.tfra Variable holds: float16 and
bfloat16 widened to float32, int32, int64 and float64 rows as their bits; int32 keys as int64) and
the slots of the optimizer (Adam m and v, AMSGrad vhat, Adagrad accumulator, TF1 momentum, Keras
SGD momentum, FTRL accumulator and linear) into tf_ext's slot layout (optimizers.h: the slots in
that order). TFRA bias-corrects every Adam row at the optimizer's global step t (TF1 `beta1_power`
and `beta2_power`, or Keras' `iterations`): a Keras optimizer passed in gets `iterations` = t, and
every row gets update count t (the steps the optimizer took: log(beta1_power) / log(beta1) - 1, or
`iterations`), so that the next step of every row is TFRA's next step whether tf_ext corrects by
the optimizer's step (its default) or by the row's own count. A TF1 program's global step comes
back with its Saver. A row's last step is t - 1 (TFRA keeps none). A key with a row
but no slot row gets the slot's initial value, as TFRA would read it; a slot row without a row is
dropped. Not restored here: dense variables (restore them with TensorFlow's savers, or convert the
checkpoint with convert.py, which keeps them), TFRA's restrict-policy status tables, and
FileSystemSaver files of string keys (their layout is not read). Key/value files keep no
step count: pass update_count= for Adam.
"""

import collections
import math
import os
import re
import shutil
import struct
import tempfile
import warnings

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import tensor_bundle_pb2
from tensorflow.python.ops import variable_scope

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import checkpoint as table_checkpoint
from tf_ext.dynamic_embedding.tfra import dtypes
from tf_ext.dynamic_embedding.tfra import variable as variable_lib

__all__ = [
  "SnapshotWriter",
  "TableGroup",
  "TfraCheckpoint",
  "crc32c_extend",
  "standard_crc32c",
  "optimizer_slots",
  "restore_from_tfra",
  "step_count",
]

CHUNK_ROWS = 65536

# ---- CRC32C -------------------------------------------------------------------------------------
# TensorFlow's bundles checksum with CRC32C, masked; tf_ext's snapshot files with CRC32C as is
# (Crc32c in snapshot_file.cc). Both come from crc32c_extend, in numpy: the data is cut into lanes
# that are checksummed side by side, then combined (CRC is linear), which makes Python checksum at
# about 100 MB/s instead of 2.


def _crc_table():
  table = []
  for i in range(256):
    crc = i
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC_LIST = _crc_table()
_CRC_TABLE = np.array(_CRC_LIST, np.uint32)
_ZERO_BYTE = [_CRC_LIST[(1 << bit) & 0xFF] ^ ((1 << bit) >> 8) for bit in range(32)]
_ZERO_OPERATORS = {}


def _apply_operator(columns, crc):
  out, bit = 0, 0
  while crc:
    if crc & 1:
      out ^= columns[bit]
    crc >>= 1
    bit += 1
  return out


def _zeros_operator(n):
  """The linear map of a CRC state over n zero bytes, as the images of its 32 bits."""
  cached = _ZERO_OPERATORS.get(n)
  if cached is not None:
    return cached
  result, power, count = [1 << bit for bit in range(32)], _ZERO_BYTE, n
  while count:
    if count & 1:
      result = [_apply_operator(power, column) for column in result]
    power = [_apply_operator(power, column) for column in power]
    count >>= 1
  if len(_ZERO_OPERATORS) > 256:
    _ZERO_OPERATORS.clear()
  _ZERO_OPERATORS[n] = result
  return result


def _shift_all(states, n):
  """Each CRC state of `states` (uint32 array) carried over n zero bytes."""
  columns = _zeros_operator(n)
  out = np.zeros_like(states)
  for bit in range(32):
    out ^= np.where(
      (states >> np.uint32(bit)) & np.uint32(1), np.uint32(columns[bit]), np.uint32(0)
    )
  return out


def crc32c_extend(crc, data):
  """The CRC32C register (Castagnoli, reflected, no inversion) after `data`, from `crc`. The
  CRC32C of data continuing a CRC32C c (tf_ext's Crc32c(c, data), TensorFlow's
  crc32c::Extend) is crc32c_extend(c ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF: standard_crc32c."""
  data = memoryview(data).cast("B")
  piece = 1 << 22  # bounds the lanes' copy (4 bytes a byte)
  for first in range(0, len(data), piece):
    crc = _crc_piece(crc, data[first : first + piece])
  return crc


def _crc_piece(crc, data):
  n = len(data)
  if n < 4096:
    table = _CRC_LIST
    for byte in bytes(data):
      crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc
  lanes = min(1 << 14, 1 << int(math.log2(n // 64)))
  width = n // lanes
  covered = lanes * width
  columns = np.ascontiguousarray(
    np.frombuffer(data, np.uint8, count=covered).reshape(lanes, width).T
  ).astype(np.uint32)
  states = np.zeros(lanes, np.uint32)
  states[0] = crc
  mask = np.uint32(0xFF)
  eight = np.uint32(8)
  for column in columns:
    states = _CRC_TABLE[(states ^ column) & mask] ^ (states >> eight)
  while len(states) > 1:
    states = _shift_all(states[0::2], width) ^ states[1::2]
    width *= 2
  return _crc_piece(int(states[0]), data[covered:])


def standard_crc32c(crc, data):
  return crc32c_extend(crc ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF


def _unmask(masked):
  rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
  return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _mask(crc):
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _data_loss(path, problem):
  return tf.errors.DataLossError(None, None, f"TFRA checkpoint file '{path}': {problem}")


# ---- TensorFlow's tensor bundle (a checkpoint), read in slices ----------------------------------
# RestoreV2 with shape_and_slices reads the whole stored tensor for any slice of a tensor saved
# whole (BundleReader::GetSliceValue), and CheckpointReader reads whole tensors: neither streams.
# So the index (a LevelDB table of BundleEntryProto) is read here, and each tensor's bytes from
# its data file, a chunk of rows at a time, checksummed as TensorFlow's reader does.

_TABLE_MAGIC = 0xDB4775248B80FB57
_DTYPES = {
  tf.float32: np.dtype("<f4"),
  tf.float16: np.dtype("<f2"),
  tf.bfloat16: np.dtype(tf.bfloat16.as_numpy_dtype),
  tf.float64: np.dtype("<f8"),
  tf.int64: np.dtype("<i8"),
  tf.int32: np.dtype("<i4"),
  tf.int16: np.dtype("<i2"),
  tf.int8: np.dtype("i1"),
  tf.uint64: np.dtype("<u8"),
  tf.uint32: np.dtype("<u4"),
  tf.uint16: np.dtype("<u2"),
  tf.uint8: np.dtype("u1"),
  tf.bool: np.dtype("?"),
}


def _varint(buffer, pos, path):
  result = shift = 0
  while True:
    if pos >= len(buffer) or shift > 63:
      raise _data_loss(path, "corrupt index (bad varint)")
    byte = buffer[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    if byte < 0x80:
      return result, pos
    shift += 7


def _index_block(buffer, offset, size, path):
  """The contents of the block at offset (checked against its CRC)."""
  if offset + size + 5 > len(buffer):
    raise _data_loss(path, "truncated index (a block ends past the file's end)")
  contents = buffer[offset : offset + size]
  kind = buffer[offset + size]
  (stored,) = struct.unpack_from("<I", buffer, offset + size + 1)
  if _unmask(stored) != standard_crc32c(0, contents + bytes([kind])):
    raise _data_loss(path, "corrupt index (block checksum mismatch)")
  if kind != 0:
    raise _data_loss(path, f"index block compressed (type {kind}), which TensorFlow never writes")
  return contents


def _block_entries(block, path):
  if len(block) < 4:
    raise _data_loss(path, "corrupt index (short block)")
  (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
  limit = len(block) - 4 - 4 * restarts
  if limit < 0:
    raise _data_loss(path, "corrupt index (bad restart count)")
  pos, key = 0, b""
  while pos < limit:
    shared, pos = _varint(block, pos, path)
    own, pos = _varint(block, pos, path)
    size, pos = _varint(block, pos, path)
    if shared > len(key) or pos + own + size > limit:
      raise _data_loss(path, "corrupt index (bad entry)")
    key = key[:shared] + block[pos : pos + own]
    pos += own
    yield key, block[pos : pos + size]
    pos += size


class Bundle:
  """A TensorFlow checkpoint (tensor bundle) at `prefix`: its entries, and its tensors in chunks."""

  def __init__(self, prefix):
    self.prefix = prefix
    self.index_path = prefix + ".index"
    if not tf.io.gfile.exists(self.index_path):
      if tf.io.gfile.exists(prefix) and not tf.io.gfile.isdir(prefix):
        raise _data_loss(prefix, "not a TensorFlow checkpoint (no index file beside it)")
      raise tf.errors.NotFoundError(None, None, f"no TFRA checkpoint at '{prefix}'")
    with tf.io.gfile.GFile(self.index_path, "rb") as f:
      buffer = f.read()
    path = self.index_path
    if len(buffer) < 48 or struct.unpack_from("<Q", buffer, len(buffer) - 8)[0] != _TABLE_MAGIC:
      raise _data_loss(path, "not a TensorFlow checkpoint index (truncated, or no table magic)")
    pos = len(buffer) - 48
    _, pos = _varint(buffer, pos, path)
    _, pos = _varint(buffer, pos, path)
    index_offset, pos = _varint(buffer, pos, path)
    index_size, pos = _varint(buffer, pos, path)
    self.entries = {}
    header = None
    for _, handle in _block_entries(_index_block(buffer, index_offset, index_size, path), path):
      offset, at = _varint(handle, 0, path)
      size, _ = _varint(handle, at, path)
      for key, value in _block_entries(_index_block(buffer, offset, size, path), path):
        try:
          if key == b"":
            header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
          else:
            self.entries[key.decode("utf-8")] = tensor_bundle_pb2.BundleEntryProto.FromString(value)
        except Exception as error:  # a protobuf DecodeError: the index is corrupt
          raise _data_loss(path, f"corrupt index entry {key!r}: {error}") from None
    if header is None:
      raise _data_loss(path, "corrupt index (no bundle header)")
    if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE:
      raise _data_loss(path, "a big-endian checkpoint, which tf_ext does not read")
    self.num_shards = header.num_shards

  def data_path(self, entry):
    return f"{self.prefix}.data-{entry.shard_id:05d}-of-{self.num_shards:05d}"

  def readable(self, name):
    """Whether `read` and `chunks` read the tensor (numbers, bools and strings)."""
    return self.dtype(name) in _DTYPES or self.dtype(name) == tf.string

  def dtype(self, name):
    return tf.as_dtype(self.entries[name].dtype)

  def shape(self, name):
    return [d.size for d in self.entries[name].shape.dim]

  def read(self, name):
    """A whole (small) tensor as numpy."""
    chunks = list(self.chunks(name, None))
    if self.dtype(name) == tf.string:
      return np.array([s for chunk in chunks for s in chunk], dtype=object).reshape(
        self.shape(name)
      )
    if not chunks:
      return np.zeros(self.shape(name), _DTYPES[self.dtype(name)])
    return np.concatenate(chunks).reshape(self.shape(name))

  def _numeric_layout(self, name):
    entry, dtype = self.entries[name], self.dtype(name)
    if dtype not in _DTYPES:
      raise _data_loss(self.data_path(entry), f"tensor {name!r} is {dtype.name}, not read here")
    shape = self.shape(name)
    item = _DTYPES[dtype]
    row_items = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    total = int(np.prod(shape)) * item.itemsize
    if entry.size != total:
      raise _data_loss(
        self.data_path(entry),
        f"tensor {name!r} takes {entry.size} bytes, its shape {shape} needs {total}",
      )
    return entry, item, row_items, shape

  def chunks(self, name, rows_per_chunk):
    """The tensor's rows, `rows_per_chunk` at a time (numpy; strings: lists of bytes); the last
    chunk is yielded only once the tensor's checksum held."""
    if self.dtype(name) == tf.string:
      yield from self._string_chunks(name, rows_per_chunk)
      return
    entry, item, row_items, shape = self._numeric_layout(name)
    path = self.data_path(entry)
    rows = shape[0] if shape else 1
    step = rows_per_chunk or max(rows, 1)
    crc = 0
    pending = None
    with tf.io.gfile.GFile(path, "rb") as f:
      _seek(f, entry.offset, path, name)
      for first in range(0, rows, step):
        count = min(step, rows - first)
        data = _read(f, count * row_items * item.itemsize, path, name)
        crc = standard_crc32c(crc, data)
        if pending is not None:
          yield pending
        pending = np.frombuffer(data, item).reshape([count] + shape[1:])
    if _unmask(entry.crc32c) != crc:
      raise _data_loss(path, f"corrupt: tensor {name!r} fails its checksum")
    if pending is not None:
      yield pending

  def read_rows(self, name, positions):
    """Rows at `positions` of a numeric tensor (unchecked: `chunks` checks the tensor)."""
    entry, item, row_items, shape = self._numeric_layout(name)
    row_bytes = row_items * item.itemsize
    out = np.empty([len(positions)] + shape[1:], item)
    order = np.argsort(positions, kind="stable")
    path = self.data_path(entry)
    with tf.io.gfile.GFile(path, "rb") as f:
      at = 0
      while at < len(order):
        # Consecutive positions are one read.
        end = at + 1
        while end < len(order) and positions[order[end]] == positions[order[end - 1]] + 1:
          end += 1
        _seek(f, entry.offset + int(positions[order[at]]) * row_bytes, path, name)
        data = _read(f, (end - at) * row_bytes, path, name)
        out[order[at:end]] = np.frombuffer(data, item).reshape([end - at] + shape[1:])
        at = end
    return out

  def _varints(self, f, path, count, name):
    """Yields the `count` varint64 lengths at f's position, in numpy chunks; returns the bytes."""
    consumed, carry, done = 0, np.zeros(0, np.uint8), 0
    while done < count:
      try:
        data = f.read(1 << 20)
      except tf.errors.OutOfRangeError:
        data = b""
      if not data and not len(carry):
        raise _data_loss(path, f"truncated: tensor {name!r} ends past the file's end")
      if not data:
        raise _data_loss(path, f"corrupt: tensor {name!r} has a bad string length")
      buffer = np.concatenate([carry, np.frombuffer(data, np.uint8)])
      ends = np.flatnonzero(buffer < 0x80)[: count - done]
      if not len(ends):
        carry = buffer
        continue
      used = int(ends[-1]) + 1
      starts = np.concatenate([[0], ends[:-1] + 1])
      lengths = ends - starts + 1
      if lengths.max() > 10:
        raise _data_loss(path, f"corrupt: tensor {name!r} has a bad string length")
      group = np.repeat(np.arange(len(ends)), lengths)
      within = (np.arange(used) - starts[group]).astype(np.uint64)
      values = (buffer[:used] & 0x7F).astype(np.uint64) << (np.uint64(7) * within)
      yield np.add.reduceat(values, starts)
      done += len(ends)
      consumed += used
      carry = buffer[used:]
      if done == count:
        return consumed, carry.tobytes()
    return consumed, b""

  def _string_chunks(self, name, rows_per_chunk):
    # [varint64 len]*n [masked CRC of the lengths] [bytes]: the CRC covers the lengths (as uint32,
    # or uint64 past 2^32), the 4 bytes of that masked CRC, then every string's bytes.
    entry = self.entries[name]
    path = self.data_path(entry)
    count = int(np.prod(self.shape(name)))
    if count == 0:
      return
    crc = 0
    with tf.io.gfile.GFile(path, "rb") as f:
      _seek(f, entry.offset, path, name)
      lengths = self._varints(f, path, count, name)
      while True:
        try:
          chunk = next(lengths)
        except StopIteration as stop:
          header_bytes, rest = stop.value
          break
        crc = standard_crc32c(crc, _length_bytes(chunk))
      checksum = rest[:4] if len(rest) >= 4 else rest + _read(f, 4 - len(rest), path, name)
      if _unmask(struct.unpack("<I", checksum)[0]) != crc:
        raise _data_loss(path, f"corrupt: tensor {name!r} fails its string length checksum")
      crc = standard_crc32c(crc, checksum)
    body = entry.offset + header_bytes + 4
    step = rows_per_chunk or count
    pending = None
    with tf.io.gfile.GFile(path, "rb") as lengths_file, tf.io.gfile.GFile(path, "rb") as f:
      _seek(lengths_file, entry.offset, path, name)
      _seek(f, body, path, name)
      batch = []
      for chunk in self._varints(lengths_file, path, count, name):
        for first in range(0, len(chunk), step):
          sizes = chunk[first : first + step]
          data = _read(f, int(sizes.sum()), path, name)
          crc = standard_crc32c(crc, data)
          bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
          batch.extend(data[bounds[i] : bounds[i + 1]] for i in range(len(sizes)))
          while len(batch) >= step:
            if pending is not None:
              yield pending
            pending, batch = batch[:step], batch[step:]
    if _unmask(entry.crc32c) != crc:
      raise _data_loss(path, f"corrupt: tensor {name!r} fails its checksum")
    if pending is not None:
      yield pending
    if batch:
      yield batch


def _read(f, n, path, name):
  """n bytes of f, or DataLossError when the file ends first."""
  try:
    data = f.read(n)
  except tf.errors.OutOfRangeError:
    data = b""
  if len(data) < n:
    raise _data_loss(path, f"truncated: tensor {name!r} ends past the file's end")
  return data


def _seek(f, offset, path, name):
  try:
    f.seek(offset)
  except tf.errors.OutOfRangeError:
    raise _data_loss(path, f"truncated: tensor {name!r} starts past the file's end") from None


def _length_bytes(lengths):
  if lengths.max(initial=0) <= 0xFFFFFFFF:
    return lengths.astype("<u4").tobytes()
  return b"".join(
    struct.pack("<I", v) if v <= 0xFFFFFFFF else struct.pack("<Q", v) for v in lengths.tolist()
  )


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
    key_item = _DTYPES[self.key_dtype].itemsize
    value_item = _DTYPES[self.value_dtype].itemsize
    if key_bytes % key_item:
      raise _data_loss(keys_path, f"truncated: {key_bytes} bytes is not a whole number of keys")
    rows = key_bytes // key_item
    if dim is None:
      dim = value_bytes // (rows * value_item) if rows else 0
    if value_bytes != rows * dim * value_item:
      raise _data_loss(
        values_path,
        f"truncated or corrupt: {value_bytes} bytes, {rows} rows of dim {dim} "
        f"({keys_path} holds {rows} keys) need {rows * dim * value_item}",
      )
    return rows, dim

  def chunks(self, path, rows_per_chunk, row_items, dtype):
    item = _DTYPES[dtype]
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
      raise _data_loss(where, f"tables of '{name}' disagree on their number of shards {counts}")
    total = counts.pop() if counts else len(shards)
    if sorted(shards) != list(range(total)) or any(len(p) != 2 for p in shards.values()):
      raise _data_loss(where, f"the checkpoint holds only part of the tables of '{name}'")
    result, dim, key_dtype, value_dtype = [], None, None, None
    for index in range(total):
      keys, values = shards[index]["keys"], shards[index]["values"]
      key_shape, value_shape = self.bundle.shape(keys), self.bundle.shape(values)
      if len(key_shape) != 1 or len(value_shape) != 2 or value_shape[0] != key_shape[0]:
        raise _data_loss(where, f"table {keys!r} has keys {key_shape} and values {value_shape}")
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
        raise _data_loss(directory, f"FileSystemSaver files of '{table}' miss shards")
      result, dim = [], None
      for index in range(total):
        files, rows = [], 0
        for rank, parts in sorted(shards[index].items()):
          if len(parts) != 2:
            raise _data_loss(directory, f"'{table}' shard {index + 1} rank {rank} lacks a file")
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
      if slot and slot[1] in _SLOT_NAMES:
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


# ---- optimizers: TFRA's slot names in tf_ext's slot order ---------------------------------------

# The slots of each tf_ext update kind (optimizers.h NumSlots), by the names TFRA's slot Variables
# have under TF1, Keras and legacy Keras optimizers.
_KIND_SLOTS = {
  "sgd": [],
  "adagrad": [("accumulator",)],
  "momentum": [("momentum",)],
  "keras_momentum": [("m", "momentum")],
  "adam": [("m",), ("v",)],
  "amsgrad": [("m",), ("v",), ("vhat",)],
  "ftrl": [("accumulator", "accum"), ("linear",)],
}
_SLOT_NAMES = {name for slots in _KIND_SLOTS.values() for names in slots for name in names}


def _update_kind(optimizer):
  """The tf_ext update kind of an optimizer (the wrapped one of a DynamicEmbeddingOptimizer)."""
  v1, keras, legacy = tf.compat.v1.train, tf.keras.optimizers, tf.keras.optimizers.legacy
  for cls, kind in (
    (v1.GradientDescentOptimizer, "sgd"),
    (v1.AdagradOptimizer, "adagrad"),
    (v1.AdamOptimizer, "adam"),
    (v1.MomentumOptimizer, "momentum"),
    (v1.FtrlOptimizer, "ftrl"),
    (keras.Adagrad, "adagrad"),
    (keras.Ftrl, "ftrl"),
    (legacy.Adagrad, "adagrad"),
    (legacy.Ftrl, "ftrl"),
  ):
    if isinstance(optimizer, cls):
      return kind
  if isinstance(optimizer, (keras.Adam, legacy.Adam)):
    return "amsgrad" if optimizer.amsgrad else "adam"
  if isinstance(optimizer, keras.SGD):
    momentum = optimizer.momentum
    return "sgd" if isinstance(momentum, (int, float)) and momentum == 0 else "keras_momentum"
  if isinstance(optimizer, legacy.SGD):
    return "keras_momentum" if optimizer._momentum else "sgd"  # noqa: SLF001
  raise ValueError(
    f"tf_ext.tfra: cannot restore slots for a {type(optimizer).__name__}; use SGD, Momentum, "
    "Adagrad, Adam or Ftrl (tf.compat.v1.train or tf.keras.optimizers)"
  )


def _kind_of_slots(names):
  """The update kind whose slots are exactly `names` (TFRA slot names), or None."""
  names = set(names)
  for kind, slots in _KIND_SLOTS.items():
    if len(slots) == len(names) and all(any(n in names for n in choice) for choice in slots):
      return kind
  return None


def _slot_initial_values(kind, optimizer):
  values = [0.0] * len(_KIND_SLOTS[kind])
  if kind in ("adagrad", "ftrl"):
    # TF1's and Keras' default initial accumulator: 0.1.
    value = 0.1
    if optimizer is not None:
      value = getattr(optimizer, "initial_accumulator_value", None)
      if value is None:
        value = getattr(optimizer, "_initial_accumulator_value", 0.1)
    values[0] = float(value)
  return values


def optimizer_slots(checkpoint, name, optimizer=None, exclude=()):
  """(kind, [TableGroup or None per tf_ext slot], slot_initial_values) of the Variable `name`.

  With `optimizer` (TF1, Keras or legacy Keras, as the tf_ext program trains with), its slots;
  without, the kind whose slots the checkpoint holds. A slot the checkpoint lacks is None (its
  rows start at its initial value)."""
  scopes = checkpoint.slot_groups(name, exclude)
  if optimizer is not None:
    kind = _update_kind(optimizer)
    wanted = _KIND_SLOTS[kind]
    usable = {
      scope: slots
      for scope, slots in scopes.items()
      if any(n in slots for choice in wanted for n in choice)
    }
  else:
    usable = {s: slots for s, slots in scopes.items() if _kind_of_slots(slots)}
    kinds = {_kind_of_slots(slots) for slots in usable.values()}
    if len(kinds) > 1:
      raise ValueError(
        f"tf_ext.tfra: TFRA checkpoint '{checkpoint.path}' holds slots of several optimizers for "
        f"'{name}' ({sorted(kinds)}): pass optimizer= to say which"
      )
    kind = kinds.pop() if kinds else "sgd"
    wanted = _KIND_SLOTS[kind]
  if len(usable) > 1:
    raise ValueError(
      f"tf_ext.tfra: TFRA checkpoint '{checkpoint.path}' holds slots of '{name}' under several "
      f"scopes ({sorted(usable)}); restore them one optimizer at a time"
    )
  slots = next(iter(usable.values())) if usable else {}
  chosen = [next((slots[n] for n in choice if n in slots), None) for choice in wanted]
  return kind, chosen, _slot_initial_values(kind, optimizer)


def step_count(checkpoint, optimizer=None):
  """The number of steps TFRA's optimizer took (Adam's t), from the checkpoint: Keras'
  `iterations`, TF1 Adam's beta1_power (beta1 from `optimizer`, else 0.9) or `global_step`; 0
  when it holds none of them."""
  bundle = checkpoint.bundle
  if bundle is None:
    return 0
  names = bundle.entries
  iterations = [
    n for n in names if re.search(r"(^|/)(_iterations|iter)/\.ATTRIBUTES/VARIABLE_VALUE$", n)
  ]
  tf1_adam = isinstance(optimizer, tf.compat.v1.train.AdamOptimizer)
  if iterations and not tf1_adam:
    return int(bundle.read(sorted(iterations)[0]))
  if "beta1_power" in names:
    beta1 = 0.9
    if tf1_adam:
      beta1 = float(optimizer._call_if_callable(optimizer._beta1))  # noqa: SLF001
    power = float(bundle.read("beta1_power"))
    if any(re.match(r"^beta1_power_\d+$", n) for n in names):
      warnings.warn(
        f"tf_ext.tfra: TFRA checkpoint '{checkpoint.path}' holds the beta powers of several Adam "
        "optimizers; the step count comes from 'beta1_power' (pass update_count= otherwise)",
        stacklevel=3,
      )
    if 0.0 < power < 1.0 and 0.0 < beta1 < 1.0:
      return max(int(round(math.log(power) / math.log(beta1))) - 1, 0)
  for name in ("global_step", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
    if name in names:
      return int(bundle.read(name))
  if iterations:
    return int(bundle.read(sorted(iterations)[0]))
  return 0


# ---- tf_ext's snapshot file, written in Python (kernels/dynamic_embedding/core/snapshot_file.cc)

_MAGIC = b"TFEXTSNP"
_CHUNK_BYTES = 1 << 20
_BLOCK_ROWS, _BLOCK_END = 2, 3


class SnapshotWriter:
  """Writes one full snapshot of a table, as SnapshotWriter in snapshot_file.cc does: the header
  (version 1, or 3 for a table of initializer version other than 1), blocks of rows of about
  1 MiB with their CRC32C, and the end block. The row count is unknown until the end, so the
  header is written again then (same length): the file is a local one."""

  def __init__(
    self, path, table_name, key_dtype, dim, slot_initial_values, step=0, initializer_version=1
  ):
    self.path = path
    self.key_dtype = tf.as_dtype(key_dtype)
    if self.key_dtype not in (tf.int64, tf.string):
      raise ValueError(f"tf_ext tables have int64 or string keys, not {self.key_dtype.name}")
    self.dim = int(dim)
    self.slot_initial_values = [float(v) for v in slot_initial_values]
    self.width = self.dim * (1 + len(self.slot_initial_values))
    self.table_name = table_name
    self.step = int(step)
    self.initializer_version = int(initializer_version)
    self.rows = 0
    self._chunk = bytearray()
    self._chunk_records = 0
    self._record = np.dtype(
      [("key", "<i8"), ("count", "<u4"), ("step", "<i8"), ("values", "<f4", (self.width,))]
    )
    self._tail = np.dtype([("count", "<u4"), ("step", "<i8"), ("values", "<f4", (self.width,))])
    self._file = open(path, "w+b")  # noqa: SIM115 (closed by finish or close)
    self._file.write(self._header())

  def _header(self):
    versioned = self.initializer_version != 1
    head = _MAGIC + struct.pack(
      "<5I5Q",
      3 if versioned else 1,
      0,  # kind: full
      1 if self.key_dtype == tf.string else 0,
      self.dim,
      len(self.slot_initial_values),
      0,  # chain id
      0,  # sequence
      self.step & 0xFFFFFFFFFFFFFFFF,
      self.rows,
      0,  # tombstones
    )
    if versioned:
      head += struct.pack("<IIQI", 0, 0, 0, self.initializer_version)
    head += struct.pack(f"<{len(self.slot_initial_values)}f", *self.slot_initial_values)
    name = self.table_name.encode("utf-8")
    head += struct.pack("<I", len(name)) + name
    return head + struct.pack("<I", standard_crc32c(0, head))

  def add(self, keys, update_counts, last_steps, values):
    """Appends rows: keys (int64 numpy or a list of bytes), update counts (uint32), last steps
    (int64) and values [n, dim * (1 + num_slots)] (the row, then each slot)."""
    n = len(keys)
    if n == 0:
      return
    values = np.asarray(values, np.float32).reshape(n, self.width)
    if self.key_dtype == tf.int64:
      records = np.empty(n, self._record)
      records["key"] = keys
    else:
      records = np.empty(n, self._tail)
    records["count"] = update_counts
    records["step"] = last_steps
    records["values"] = values
    size = records.itemsize
    data = records.tobytes()
    for first in range(0, n, max(1, _CHUNK_BYTES // size)):
      last = min(n, first + max(1, _CHUNK_BYTES // size))
      if self.key_dtype == tf.int64:
        self._chunk += data[first * size : last * size]
      else:
        for i in range(first, last):
          key = keys[i]
          self._chunk += struct.pack("<I", len(key)) + key + data[i * size : (i + 1) * size]
      self._chunk_records += last - first
      if len(self._chunk) >= _CHUNK_BYTES:
        self._flush(_BLOCK_ROWS)
    self.rows += n

  def _flush(self, kind):
    if self._chunk_records == 0 and kind != _BLOCK_END:
      return
    head = struct.pack("<III", kind, self._chunk_records, len(self._chunk))
    crc = standard_crc32c(standard_crc32c(0, head), self._chunk)
    self._file.write(head + struct.pack("<I", crc))
    self._file.write(self._chunk)
    self._chunk = bytearray()
    self._chunk_records = 0

  def finish(self):
    """Writes the last block and the end block, then the header with the row count."""
    self._flush(_BLOCK_ROWS)
    self._chunk += struct.pack("<QQ", self.rows, 0)
    self._flush(_BLOCK_END)
    self._file.seek(0)
    self._file.write(self._header())
    self._file.close()
    return self.rows

  def close(self):
    if not self._file.closed:
      self._file.close()


# ---- a TFRA Variable (and its slots) into tf_ext snapshot files ---------------------------------


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
      item = _DTYPES[self.checkpoint.kv.value_dtype]
      with tf.io.gfile.GFile(values_path, "rb") as f:
        for i in np.flatnonzero(inside):
          _seek(f, int(positions[i] - first) * self.slot.dim * item.itemsize, values_path, "rows")
          out[i] = np.frombuffer(_read(f, self.slot.dim * item.itemsize, values_path, "rows"), item)
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
      raise _data_loss(
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


# ---- restore_from_tfra -------------------------------------------------------------------------


def _router(variable, session):
  """keys -> the shard of each, by the Variable's partitioner."""
  if variable.shard_num == 1:
    return lambda keys: np.zeros(len(keys), np.int32)
  dtype = tf.string if variable.key_dtype == tf.string else tf.int64
  if tf.executing_eagerly():
    return lambda keys: variable.partition(tf.constant(keys, dtype)).numpy()
  with tf.name_scope("restore_from_tfra"):
    placeholder = tf.compat.v1.placeholder(dtype, [None])
    parts = variable.partition(placeholder)
  return lambda keys: session.run(parts, {placeholder: keys})


def _variables_of_store():
  store = variable_scope._get_default_variable_store()._vars  # noqa: SLF001 (TF's variable store)
  return [v for v in store.values() if isinstance(v, variable_lib.Variable)]


def _restore_op(table, path, verify_only):
  with table.colocated():
    return _ops_loader.load().tf_ext_table_restore_snapshots(
      table.resource_handle, [path], track=False, verify_only=verify_only
    )


def restore_from_tfra(
  checkpoint_path,
  variables=None,
  optimizer=None,
  update_count=None,
  session=None,
  key_dtype=None,
  chunk_rows=CHUNK_ROWS,
):
  """Fills tf_ext.tfra Variables from a checkpoint that TFRA wrote; needs no TFRA.

  checkpoint_path: a checkpoint prefix (tf.compat.v1.train.Saver, tf.train.Checkpoint, Keras
    save_weights), a checkpoint directory (its latest), a SavedModel directory, or a directory of
    FileSystemSaver files (also found beside a checkpoint saved with FileSystemSaver).
  variables: the de.Variables to fill, each from the TFRA Variable of its name (its tables are
    routed to this Variable's shards by its partitioner, whatever TFRA's count was); None: every
    Variable of de.get_variable and the Keras layers (TF's variable store) that the checkpoint
    holds.
  optimizer: the optimizer the program trains with (TF1, Keras or legacy Keras; wrapped or not):
    its slots are restored, in tf_ext's order, and its initial accumulator fills missing slot rows.
    None: the slots the checkpoint holds, by their names.
  update_count: every row's update count, and a Keras `optimizer`'s `iterations`; default: TFRA's
    step count (`step_count`), so that the next Adam step is TFRA's (tf_ext bias-corrects every
    row by the optimizer's step, as TFRA does, or by the row's own count: either is then TFRA's).
  session: in a TF1 graph, the session to run the restore in (default: the default session);
    the tables must exist in it (run their initializers first).
  key_dtype: the key dtype of FileSystemSaver files (they do not say); default each Variable's.

  Returns {variable name: {"rows", "slots" (TFRA slot names), "update_count",
  "missing_slot_rows", "dropped_slot_rows"}}. Raises DataLossError (naming the file) for a
  truncated or corrupt checkpoint, NotFoundError for a Variable it does not hold; either way no
  table changes. Every table is read into a snapshot file in a temporary directory first, then
  all are checked, then restored.
  """
  eager = tf.executing_eagerly()
  if not eager:
    session = session or tf.compat.v1.get_default_session()
    if session is None:
      raise ValueError(
        "tf_ext.tfra: restore_from_tfra in a TF1 graph needs session= (or a default session)"
      )
  if variables is None:
    variables = _variables_of_store()
  variables = list(variables)
  guessed_keys = key_dtype or (variables[0].key_dtype if variables else tf.int64)
  stored_keys = tf.int64 if tf.as_dtype(guessed_keys) == tf.int32 else guessed_keys
  values = variables[0].value_dtype if variables else tf.float32
  checkpoint = TfraCheckpoint(checkpoint_path, key_dtype=stored_keys, value_dtype=values)
  plan = []
  primaries = []
  for variable in variables:
    group = checkpoint.group_of(variable.name)
    if group is None:
      raise tf.errors.NotFoundError(
        None,
        None,
        f"TFRA checkpoint '{checkpoint_path}' holds no Variable '{variable.name}' "
        f"(it holds {sorted(g.name for g in checkpoint.variables())})",
      )
    if group.dim != variable.dim and group.source == "files":
      files = [v for shard in group.shards for _, v in shard.files]
      raise _data_loss(
        files[0] if len(files) == 1 else os.path.dirname(files[0]),
        f"truncated or corrupt: its rows are not rows of dim {variable.dim} ('{variable.name}')",
      )
    if group.dim != variable.dim:
      raise ValueError(
        f"tf_ext.tfra Variable '{variable.name}' has dim {variable.dim}, the TFRA checkpoint's "
        f"has dim {group.dim}"
      )
    primaries.append(group)
    plan.append((variable, group))
  steps = step_count(checkpoint, optimizer) if update_count is None else int(update_count)
  results = {}
  directory = tempfile.mkdtemp(prefix="tf_ext_tfra_restore_")
  try:
    restores = []
    for variable, group in plan:
      kind, slots, initial = optimizer_slots(checkpoint, variable.name, optimizer, primaries)
      stored_dim, encode = row_encoder(variable.value_dtype, variable.dim)
      if stored_dim != variable.dim and any(slots):
        # Rows held as bits are never trained in tf_ext: they take no slots.
        kind, slots, initial = "sgd", [], []
      writers = []
      for index, table in enumerate(variable.tables):
        writers.append(
          SnapshotWriter(
            os.path.join(directory, f"{len(restores)}_{index}.snapshot"),
            table.name,
            table.key_dtype,
            stored_dim,
            initial,
            step=steps,
            initializer_version=table.initializer_spec.version,
          )
        )
      try:
        stats = write_snapshots(
          checkpoint,
          group,
          slots,
          initial,
          writers,
          _router(variable, session),
          steps,
          chunk_rows,
          encode=encode,
        )
        for writer in writers:
          writer.finish()
      finally:
        for writer in writers:
          writer.close()
      restores.extend((table, writer.path) for table, writer in zip(variable.tables, writers))
      results[variable.name] = {
        "rows": stats["rows"],
        "slots": [s.name if s is not None else None for s in slots],
        "kind": kind,
        "update_count": steps,
        "missing_slot_rows": stats["missing_slot_rows"],
        "dropped_slot_rows": stats["dropped_slot_rows"],
      }
    # Every file checked before the first table changes.
    if eager:
      for table, path in restores:
        _restore_op(table, path, True)
      for table, path in restores:
        _restore_op(table, path, False)
    else:
      checks = [_restore_op(table, path, True) for table, path in restores]
      session.run(checks)
      session.run([_restore_op(table, path, False) for table, path in restores])
    _restore_keras_step(optimizer, steps, session)
  finally:
    shutil.rmtree(directory, ignore_errors=True)
  return results


def _restore_keras_step(optimizer, steps, session):
  """Sets a Keras optimizer's `iterations` to TFRA's step count: tf_ext's table updates
  bias-correct every row by it (DynamicEmbeddingOptimizer's bias_correction_step), as TFRA's."""
  iterations = getattr(optimizer, "iterations", None)
  if iterations is None or isinstance(optimizer, tf.compat.v1.train.Optimizer):
    return
  assign = iterations.assign(steps)
  if session is not None and not tf.executing_eagerly():
    session.run(assign)


def describe(checkpoint_path):
  """A JSON-able summary of a TFRA checkpoint: its Variables, their shards, rows and slots."""
  checkpoint = TfraCheckpoint(checkpoint_path)
  out = {"path": checkpoint.path, "kind": checkpoint.kind, "variables": {}}
  for group in checkpoint.variables():
    scopes = checkpoint.slot_groups(group.name)
    out["variables"][group.name] = {
      "shards": len(group.shards),
      "rows": group.rows,
      "dim": group.dim,
      "slots": {scope: sorted(slots) for scope, slots in scopes.items()},
    }
  return out


# The table snapshots' file names beside a tf_ext checkpoint prefix (checkpoint.py).
snapshot_suffix = table_checkpoint.snapshot_suffix

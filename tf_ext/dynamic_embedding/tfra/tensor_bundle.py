"""TensorFlow's tensor bundle (a checkpoint), read in slices, and its checks.

RestoreV2 with shape_and_slices reads the whole stored tensor for any slice of a tensor saved
whole (BundleReader::GetSliceValue), and CheckpointReader reads whole tensors: neither streams.
So the index (a LevelDB table of BundleEntryProto) is read here, and each tensor's bytes from
its data file, a chunk of rows at a time, checksummed as TensorFlow's reader does.
"""

import struct

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import tensor_bundle_pb2

from tf_ext.dynamic_embedding.tfra.crc32c import standard_crc32c


def _unmask(masked):
  rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
  return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _mask(crc):
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def data_loss(path, problem):
  return tf.errors.DataLossError(None, None, f"TFRA checkpoint file '{path}': {problem}")


_TABLE_MAGIC = 0xDB4775248B80FB57
DTYPES = {
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
      raise data_loss(path, "corrupt index (bad varint)")
    byte = buffer[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    if byte < 0x80:
      return result, pos
    shift += 7


def _index_block(buffer, offset, size, path):
  """The contents of the block at offset (checked against its CRC)."""
  if offset + size + 5 > len(buffer):
    raise data_loss(path, "truncated index (a block ends past the file's end)")
  contents = buffer[offset : offset + size]
  kind = buffer[offset + size]
  (stored,) = struct.unpack_from("<I", buffer, offset + size + 1)
  if _unmask(stored) != standard_crc32c(0, contents + bytes([kind])):
    raise data_loss(path, "corrupt index (block checksum mismatch)")
  if kind != 0:
    raise data_loss(path, f"index block compressed (type {kind}), which TensorFlow never writes")
  return contents


def _block_entries(block, path):
  if len(block) < 4:
    raise data_loss(path, "corrupt index (short block)")
  (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
  limit = len(block) - 4 - 4 * restarts
  if limit < 0:
    raise data_loss(path, "corrupt index (bad restart count)")
  pos, key = 0, b""
  while pos < limit:
    shared, pos = _varint(block, pos, path)
    own, pos = _varint(block, pos, path)
    size, pos = _varint(block, pos, path)
    if shared > len(key) or pos + own + size > limit:
      raise data_loss(path, "corrupt index (bad entry)")
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
        raise data_loss(prefix, "not a TensorFlow checkpoint (no index file beside it)")
      raise tf.errors.NotFoundError(None, None, f"no TFRA checkpoint at '{prefix}'")
    with tf.io.gfile.GFile(self.index_path, "rb") as f:
      buffer = f.read()
    path = self.index_path
    if len(buffer) < 48 or struct.unpack_from("<Q", buffer, len(buffer) - 8)[0] != _TABLE_MAGIC:
      raise data_loss(path, "not a TensorFlow checkpoint index (truncated, or no table magic)")
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
          raise data_loss(path, f"corrupt index entry {key!r}: {error}") from None
    if header is None:
      raise data_loss(path, "corrupt index (no bundle header)")
    if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE:
      raise data_loss(path, "a big-endian checkpoint, which tf_ext does not read")
    self.num_shards = header.num_shards

  def data_path(self, entry):
    return f"{self.prefix}.data-{entry.shard_id:05d}-of-{self.num_shards:05d}"

  def readable(self, name):
    """Whether `read` and `chunks` read the tensor (numbers, bools and strings)."""
    return self.dtype(name) in DTYPES or self.dtype(name) == tf.string

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
      return np.zeros(self.shape(name), DTYPES[self.dtype(name)])
    return np.concatenate(chunks).reshape(self.shape(name))

  def _numeric_layout(self, name):
    entry, dtype = self.entries[name], self.dtype(name)
    if dtype not in DTYPES:
      raise data_loss(self.data_path(entry), f"tensor {name!r} is {dtype.name}, not read here")
    shape = self.shape(name)
    item = DTYPES[dtype]
    row_items = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    total = int(np.prod(shape)) * item.itemsize
    if entry.size != total:
      raise data_loss(
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
      seek(f, entry.offset, path, name)
      for first in range(0, rows, step):
        count = min(step, rows - first)
        data = read_exactly(f, count * row_items * item.itemsize, path, name)
        crc = standard_crc32c(crc, data)
        if pending is not None:
          yield pending
        pending = np.frombuffer(data, item).reshape([count] + shape[1:])
    if _unmask(entry.crc32c) != crc:
      raise data_loss(path, f"corrupt: tensor {name!r} fails its checksum")
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
        seek(f, entry.offset + int(positions[order[at]]) * row_bytes, path, name)
        data = read_exactly(f, (end - at) * row_bytes, path, name)
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
        raise data_loss(path, f"truncated: tensor {name!r} ends past the file's end")
      if not data:
        raise data_loss(path, f"corrupt: tensor {name!r} has a bad string length")
      buffer = np.concatenate([carry, np.frombuffer(data, np.uint8)])
      ends = np.flatnonzero(buffer < 0x80)[: count - done]
      if not len(ends):
        carry = buffer
        continue
      used = int(ends[-1]) + 1
      starts = np.concatenate([[0], ends[:-1] + 1])
      lengths = ends - starts + 1
      if lengths.max() > 10:
        raise data_loss(path, f"corrupt: tensor {name!r} has a bad string length")
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
      seek(f, entry.offset, path, name)
      lengths = self._varints(f, path, count, name)
      while True:
        try:
          chunk = next(lengths)
        except StopIteration as stop:
          header_bytes, rest = stop.value
          break
        crc = standard_crc32c(crc, _length_bytes(chunk))
      checksum = rest[:4] if len(rest) >= 4 else rest + read_exactly(f, 4 - len(rest), path, name)
      if _unmask(struct.unpack("<I", checksum)[0]) != crc:
        raise data_loss(path, f"corrupt: tensor {name!r} fails its string length checksum")
      crc = standard_crc32c(crc, checksum)
    body = entry.offset + header_bytes + 4
    step = rows_per_chunk or count
    pending = None
    with tf.io.gfile.GFile(path, "rb") as lengths_file, tf.io.gfile.GFile(path, "rb") as f:
      seek(lengths_file, entry.offset, path, name)
      seek(f, body, path, name)
      batch = []
      for chunk in self._varints(lengths_file, path, count, name):
        for first in range(0, len(chunk), step):
          sizes = chunk[first : first + step]
          data = read_exactly(f, int(sizes.sum()), path, name)
          crc = standard_crc32c(crc, data)
          bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
          batch.extend(data[bounds[i] : bounds[i + 1]] for i in range(len(sizes)))
          while len(batch) >= step:
            if pending is not None:
              yield pending
            pending, batch = batch[:step], batch[step:]
    if _unmask(entry.crc32c) != crc:
      raise data_loss(path, f"corrupt: tensor {name!r} fails its checksum")
    if pending is not None:
      yield pending
    if batch:
      yield batch


def read_exactly(f, n, path, name):
  """n bytes of f, or DataLossError when the file ends first."""
  try:
    data = f.read(n)
  except tf.errors.OutOfRangeError:
    data = b""
  if len(data) < n:
    raise data_loss(path, f"truncated: tensor {name!r} ends past the file's end")
  return data


def seek(f, offset, path, name):
  try:
    f.seek(offset)
  except tf.errors.OutOfRangeError:
    raise data_loss(path, f"truncated: tensor {name!r} starts past the file's end") from None


def _length_bytes(lengths):
  if lengths.max(initial=0) <= 0xFFFFFFFF:
    return lengths.astype("<u4").tobytes()
  return b"".join(
    struct.pack("<I", v) if v <= 0xFFFFFFFF else struct.pack("<Q", v) for v in lengths.tolist()
  )

"""tf_ext's snapshot file, written in Python (kernels/dynamic_embedding/core/snapshot_file.cc)."""

import struct

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding.tfra.crc32c import standard_crc32c

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

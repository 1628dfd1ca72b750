"""The documented limits (docs/dynamic_embedding.md, Limits) as a user meets them: each at its limit
(works) and one past it (an error naming the table, the value and the limit). The limits too large
to reach here (rows, ids per call, file bytes written) are checked at their limits by
tests/kernels/dynamic_embedding/limits_test.cc; the file tests below reach the row and size limits
through a snapshot header that claims them."""

import os
import re
import struct

import pytest
import tensorflow as tf

import tf_ext
from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import limits, sharded

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(ROOT, "kernels", "dynamic_embedding", "core", "limits.h")


def _header_constants():
  with open(HEADER, encoding="utf-8") as f:
    text = f.read()
  found = {}
  for name, expression in re.findall(r"constexpr \w+ (kMax\w+) = ([^;]+);", text):
    python = re.sub(r"\w+\{(\d+)\}", r"\1", expression)  # int64_t{1} -> 1
    found[name] = eval(python, {"__builtins__": {}})  # noqa: S307 (a constant of the header)
  return found


def test_python_limits_are_the_headers():
  assert _header_constants() == {
    "kMaxDim": limits.MAX_DIM,
    "kMaxShards": limits.MAX_SHARDS,
    "kMaxTableRows": limits.MAX_TABLE_ROWS,
    "kMaxKeyBytes": limits.MAX_KEY_BYTES,
    "kMaxIdsPerCall": limits.MAX_IDS_PER_CALL,
    "kMaxSnapshotFileBytes": limits.MAX_SNAPSHOT_FILE_BYTES,
  }


def _table(name, dim=2, key_dtype=tf.int64, **kwargs):
  return tf_ext.get_dynamic_embedding_variable(name, dim=dim, key_dtype=key_dtype, **kwargs)


def test_dim_at_the_limit_works_and_one_past_is_refused():
  table = _table("limits_dim_at", dim=limits.MAX_DIM)
  assert table.lookup(tf.constant([3], tf.int64)).shape == (1, limits.MAX_DIM)
  with pytest.raises(
    tf.errors.InvalidArgumentError, match=r"'limits_dim_past'.*\[1, 4096\], got 4097"
  ):
    _table("limits_dim_past", dim=limits.MAX_DIM + 1)


def test_shards_at_the_limit_work_and_one_past_is_refused():
  # 65536 tables are too many to build here: the check and the routing op at the limit.
  assert sharded.check_num_shards("limits_shards_at", limits.MAX_SHARDS) == limits.MAX_SHARDS
  shards = sharded.shard_of(tf.range(10000, dtype=tf.int64), limits.MAX_SHARDS)
  assert 0 <= int(tf.reduce_min(shards)) and int(tf.reduce_max(shards)) < limits.MAX_SHARDS
  with pytest.raises(
    tf.errors.InvalidArgumentError, match=r"'limits_shards_past'.*\[1, 65536\], got 65537"
  ):
    _table("limits_shards_past", num_shards=limits.MAX_SHARDS + 1)


def test_string_keys_at_the_limit_work_and_one_byte_more_is_refused():
  table = _table("limits_keys", key_dtype=tf.string)
  longest = b"k" * limits.MAX_KEY_BYTES
  too_long = tf.constant([b"short", longest + b"k"])
  table.insert(tf.constant([longest]), tf.constant([[1.0, 2.0]]))
  assert table.lookup(tf.constant([longest])).numpy().tolist() == [[1.0, 2.0]]
  message = r"'limits_keys': string key 1 of 1048577 bytes is over the limit of 1048576 bytes"
  for call in (
    lambda: table.lookup(too_long),
    lambda: table.insert(too_long, tf.zeros([2, 2])),
    lambda: table.remove(too_long),
  ):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
      call()
  assert int(table.size()) == 1
  table.remove(tf.constant([longest]))
  assert int(table.size()) == 0


# A snapshot file's header (kernels/dynamic_embedding/core/snapshot_file.h, format version 1),
# with no record after it: what a restore reads before any row.
def _crc32c(data):
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
  return crc ^ 0xFFFFFFFF


def _header_claiming(path, rows, dim, name="claimed"):
  fixed = b"TFEXTSNP" + struct.pack("<5I5Q", 1, 0, 0, dim, 0, 7, 0, 0, rows, 0)
  body = fixed + struct.pack("<I", len(name)) + name.encode()
  with open(path, "wb") as f:
    f.write(body + struct.pack("<I", _crc32c(body)))
  return path


def _restore(table, path):
  _ops_loader.load().tf_ext_table_restore_snapshots(table.resource_handle, [path])


def test_a_file_of_more_rows_than_a_table_holds_is_refused_before_reading(tmp_path):
  table = _table("limits_rows", dim=1)
  # At the limit the rows are read, and this file has none: truncated.
  at_limit = _header_claiming(str(tmp_path / "at"), limits.MAX_TABLE_ROWS, dim=1)
  with pytest.raises(tf.errors.DataLossError, match="'limits_rows'.*truncated"):
    _restore(table, at_limit)
  past = _header_claiming(str(tmp_path / "past"), limits.MAX_TABLE_ROWS + 1, dim=1)
  with pytest.raises(
    tf.errors.ResourceExhaustedError,
    match=r"'limits_rows': .*2147483649 rows is over the limit of 2147483648 rows",
  ):
    _restore(table, past)


def test_a_file_claiming_more_bytes_than_the_limit_is_refused_before_reading(tmp_path):
  dim = limits.MAX_DIM
  table = _table("limits_file", dim=dim)
  row_bytes = 8 + 4 + 8 + 4 * dim  # key, update count, last step, embedding
  fixed_bytes = 8 + 5 * 4 + 5 * 8 + 4 + len("claimed") + 4 + 32  # header, end block
  rows = (limits.MAX_SNAPSHOT_FILE_BYTES - fixed_bytes) // row_bytes
  at_limit = _header_claiming(str(tmp_path / "at"), rows, dim)
  with pytest.raises(tf.errors.DataLossError, match="'limits_file'.*truncated"):
    _restore(table, at_limit)
  past = _header_claiming(str(tmp_path / "past"), rows + 1, dim)
  with pytest.raises(
    tf.errors.DataLossError,
    match=r"'limits_file'.*its header claims at least \d+ bytes, over the limit of "
    r"1099511627776 bytes per snapshot file",
  ):
    _restore(table, past)

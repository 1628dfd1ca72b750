"""The documented limits (docs/dynamic_embedding.md, Limits) as a user meets them: each at its limit
(works) and one past it (an error naming the table, the value and the limit). The limits too large
to reach here (rows, ids per call, file bytes written) are checked at their limits by
tests/kernels/dynamic_embedding/limits_test.cc; the file tests below reach the row and size limits
through a snapshot header that claims them."""

import os
import re
import struct

import numpy as np
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


def _capped_table(name, max_rows, key_dtype=tf.int64):
  """A table whose row limit is lowered through the op's max_rows (the library's own limit,
  2^31 rows, does not fit this machine's memory), used through the raw ops."""
  return _ops_loader.load().tf_ext_dynamic_table(
    table_name=name, shared_name=name, key_dtype=key_dtype, dim=2, max_rows=max_rows
  )


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_rows_at_the_limit_work_and_one_past_is_refused_by_every_path(key_dtype):
  ops = _ops_loader.load()
  name = f"capped_{key_dtype.name}"
  table = _capped_table(name, 10, key_dtype)

  def keys(*values):
    return tf.constant([str(v) if key_dtype == tf.string else v for v in values], key_dtype)

  def size():
    return int(ops.tf_ext_table_size(table))

  ops.tf_ext_table_insert(table, keys(*range(8)), tf.ones([8, 2]), dim=2)
  zero = tf.constant(0.0)

  def train(*values):
    ops.tf_ext_table_apply_gradient(
      table, keys(*values), tf.ones([len(values), 2]), 0.1, zero, zero, zero,
      tf.constant(1, tf.int64), [], dim=2, optimizer="sgd",
    )  # fmt: skip

  train(0, 8, 8)  # one new row (twice): 9
  ops.tf_ext_table_insert(table, keys(1, 9, 2), tf.ones([3, 2]), dim=2)  # at the limit: 10
  assert size() == 10
  train(*range(10))  # existing rows only, at the limit
  past = f"dynamic embedding table '{name}'.*would hold 11 rows.*limit of 10 rows"
  with pytest.raises(tf.errors.ResourceExhaustedError, match=past):
    ops.tf_ext_table_insert(table, keys(3, 10), tf.ones([2, 2]), dim=2)
  with pytest.raises(tf.errors.ResourceExhaustedError, match=past):
    train(4, 10)
  assert size() == 10  # nothing of a refused call was applied
  # Rows 3 and 4 as the last accepted update left them (an insert would have set 3 to ones).
  np.testing.assert_allclose(
    ops.tf_ext_table_find(table, keys(3, 4), 0.0, dim=2).numpy(), np.full([2, 2], 0.9)
  )


def test_fused_training_updates_are_held_to_the_row_limit():
  """The fused apply (TfExtFusedEmbeddingApply) checks each field's new ids, and, where fields
  share one table update (field_updates), their ids together: two fields that each add one row
  pass alone and are refused together, with nothing applied."""
  ops = _ops_loader.load()
  table = _capped_table("capped_fused", 10)
  ops.tf_ext_table_insert(table, tf.range(9, dtype=tf.int64), tf.ones([9, 2]), dim=2)

  def apply(fields, field_updates=()):
    return ops.tf_ext_fused_embedding_apply(
      [table] * len(fields),
      [tf.constant(ids, tf.int64) for ids in fields],
      [tf.range(len(ids), dtype=tf.int64) for ids in fields],
      [tf.constant(len(ids), tf.int64) for ids in fields],
      [tf.ones([len(ids), 2]) for ids in fields],
      0.1, 0.9, 0.999, 1e-7, tf.constant(1, tf.int64), [], [],
      [tf.zeros([0], tf.int32)] * len(fields),
      dims=[2] * len(fields), combiners=["sum"] * len(fields), optimizer="sgd",
      field_updates=list(field_updates),
    )  # fmt: skip

  past = "dynamic embedding table 'capped_fused'.*would hold 11 rows.*limit of 10 rows"
  with pytest.raises(tf.errors.ResourceExhaustedError, match=past):
    apply([[0, 20, 21]])  # one field, two new ids
  with pytest.raises(tf.errors.ResourceExhaustedError, match=past):
    apply([[0, 20], [1, 21]], field_updates=[0, 0])  # one new id each, two together
  assert int(ops.tf_ext_table_size(table)) == 9
  rows = ops.tf_ext_table_find(table, tf.constant([0, 1], tf.int64), 0.0, dim=2)
  np.testing.assert_allclose(rows.numpy(), 1.0)  # untouched by the refused updates
  apply([[0, 20], [1, 20]], field_updates=[0, 0])  # the same new id: one row, at the limit
  assert int(ops.tf_ext_table_size(table)) == 10


@pytest.mark.parametrize("max_rows", [0, limits.MAX_TABLE_ROWS + 1])
def test_a_row_limit_out_of_range_is_refused(max_rows):
  with pytest.raises(tf.errors.InvalidArgumentError, match="'capped_bad': max_rows must be in"):
    _capped_table("capped_bad", max_rows)


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

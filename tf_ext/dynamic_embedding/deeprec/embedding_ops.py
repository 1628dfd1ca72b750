"""DeepRec's lookups of an EmbeddingVariable: tf.nn.embedding_lookup and its sparse forms.

Given a tf_ext table, they read its rows; given anything else (a tf.Variable, a list of them, a
PartitionedVariable, a tensor), they are TensorFlow's own tf.compat.v1.nn functions, so a DeepRec
program can route every lookup through them. The sparse forms look each distinct id up once and
hand TensorFlow's function the rows, so combiners, weights, max_norm and output shapes are
TensorFlow's.

With a feature filter (CounterFilter, CBFFilter), an id not admitted yet reads the
InitializerOption's default_value_no_permission (0.0 by default), as in DeepRec; its gradient
still reaches the optimizer, which counts it towards admission and drops it.
"""

import tensorflow as tf

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import lookup as lookup_lib
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.deeprec import variable as deeprec_variable
from tf_ext.dynamic_embedding.sharded import ShardedDynamicEmbeddingVariable

# Integer ids that an int64 table widens (as its own lookups do).
_WIDENED = (tf.int32, tf.int16, tf.int8, tf.uint8, tf.uint16, tf.uint32)


def _table_of(params):
  """The table in `params` (itself, or alone in a list), or None for TensorFlow's params."""
  if isinstance(params, (list, tuple)):
    tables = [p for p in params if deeprec_variable.is_table(p)]
    if not tables:
      return None
    if len(params) != 1:
      raise ValueError(
        "tf_ext.deeprec: pass the EmbeddingVariable itself, not a list of "
        f"{len(params)}: a partitioned EmbeddingVariable is one table of num_shards shards"
      )
    return tables[0]
  return params if deeprec_variable.is_table(params) else None


def _keys(table, ids):
  """`ids` as a tensor of the table's key dtype."""
  ids = tf.convert_to_tensor(ids)
  if ids.dtype == table.key_dtype:
    return ids
  if table.key_dtype == tf.int64 and ids.dtype in _WIDENED:
    return tf.cast(ids, tf.int64)
  raise variable_lib.invalid_argument(
    table.name, f"ids must be {table.key_dtype.name}, got {ids.dtype.name}"
  )


def _find_with_presence(table, flat_ids):
  """(rows, present) of a plain table for 1-D ids; the rows' gradient reaches its anchor."""
  anchor = table.gradient_anchor.value() if table.trainable else tf.constant(0.0)
  with table.colocated():
    return _ops_loader.load().tf_ext_table_find_with_presence(
      table.resource_handle, flat_ids, anchor, dim=table.dim
    )


def _rows_and_presence(table, flat_ids):
  """(rows, present) for 1-D ids of a plain or sharded table."""
  if not isinstance(table, ShardedDynamicEmbeddingVariable):
    return _find_with_presence(table, flat_ids)
  shards = table.shards
  if len(shards) == 1:
    return _find_with_presence(shards[0], flat_ids)
  parts = table.shard_of(flat_ids)
  positions = tf.dynamic_partition(tf.range(tf.size(flat_ids)), parts, len(shards))
  keys = tf.dynamic_partition(flat_ids, parts, len(shards))
  found = [_find_with_presence(shard, part) for shard, part in zip(shards, keys)]
  rows = tf.dynamic_stitch(positions, [r for r, _ in found])
  present = tf.dynamic_stitch(positions, [p for _, p in found])
  return rows, present


def _filtered_rows(table, ids, no_permission):
  """Rows of `ids` (any shape), ids without a row reading `no_permission`; the gradient passes
  to every row as if it had been read (the optimizer counts it and drops it)."""
  ids = _keys(table, ids)
  rows, present = _rows_and_presence(table, tf.reshape(ids, [-1]))
  shown = tf.where(present[:, None], rows, tf.constant(no_permission, tf.float32))
  # Forward: `shown` exactly (rows - rows is 0); backward: the identity onto `rows`.
  rows = tf.stop_gradient(shown) + (rows - tf.stop_gradient(rows))
  out = tf.reshape(rows, tf.concat([tf.shape(ids), [table.dim]], 0))
  out.set_shape(ids.shape.concatenate([table.dim]))
  return out


def _rows(table, ids):
  """Rows of `ids` (any shape), as DeepRec reads them."""
  config = deeprec_variable.config_of(table)
  # A serving export replaces the table by its own (tf_ext.saved_model): it answers alone.
  if config is None or not config.filtered or variable_lib.serving_replacement(table) is not None:
    if isinstance(table, ShardedDynamicEmbeddingVariable):
      # Its own lookup: tf_ext.embedding_lookup's fusion marker fails on a one-shard table.
      return table.lookup(_keys(table, ids))
    return lookup_lib.embedding_lookup(table, _keys(table, ids))
  return _filtered_rows(table, ids, config.default_value_no_permission)


def _clip(rows, max_norm):
  return rows if max_norm is None else tf.clip_by_norm(rows, max_norm, axes=[-1])


def embedding_lookup(
  params, ids, partition_strategy="mod", name=None, validate_indices=True, max_norm=None
):
  """The rows of `ids` (any shape): ids.shape + [embedding_dim].

  As tf.compat.v1.nn.embedding_lookup; for a table, partition_strategy and validate_indices are
  hints (a sharded table routes ids by a hash of its own), and max_norm clips each row's L2
  norm. Lookups never create rows: training updates do.
  """
  table = _table_of(params)
  if table is None:
    return tf.compat.v1.nn.embedding_lookup(
      params, ids, partition_strategy, name, validate_indices, max_norm
    )
  del partition_strategy, validate_indices
  with tf.name_scope(name or "embedding_lookup"):
    return _clip(_rows(table, ids), max_norm)


def _distinct_rows(table, sparse_ids, max_norm, first_ids=None):
  """(rows, positions): the rows of `first_ids` (if given) and then of sparse_ids' distinct ids,
  and sparse_ids with each id replaced by the index of its row."""
  if not isinstance(sparse_ids, tf.SparseTensor):
    raise TypeError(f"sp_ids must be a SparseTensor, got {type(sparse_ids).__name__}")
  distinct, index = tf.unique(_keys(table, sparse_ids.values))
  index = tf.cast(index, tf.int64)
  if first_ids is not None:
    first_ids = tf.reshape(_keys(table, first_ids), [-1])
    distinct = tf.concat([first_ids, distinct], 0)
    index += tf.size(first_ids, out_type=tf.int64)
  rows = _clip(_rows(table, distinct), max_norm)
  return rows, tf.SparseTensor(sparse_ids.indices, index, sparse_ids.dense_shape)


def embedding_lookup_sparse(
  params, sp_ids, sp_weights, partition_strategy="mod", name=None, combiner=None, max_norm=None
):
  """Combined rows of a SparseTensor of ids, as tf.compat.v1.nn.embedding_lookup_sparse.

  combiner: "mean" (default), "sqrtn" or "sum", weighted by sp_weights (None: 1.0 each). The
  output has as many rows as TensorFlow's: up to the last row of sp_ids that holds an id.
  """
  table = _table_of(params)
  if table is None:
    return tf.compat.v1.nn.embedding_lookup_sparse(
      params, sp_ids, sp_weights, partition_strategy, name, combiner, max_norm
    )
  with tf.name_scope(name or "embedding_lookup_sparse"):
    rows, positions = _distinct_rows(table, sp_ids, max_norm)
    return tf.compat.v1.nn.embedding_lookup_sparse(rows, positions, sp_weights, combiner=combiner)


def safe_embedding_lookup_sparse(
  embedding_weights,
  sparse_ids,
  sparse_weights=None,
  combiner="mean",
  default_id=None,
  name=None,
  partition_strategy="div",
  max_norm=None,
):
  """As tf.compat.v1.nn.safe_embedding_lookup_sparse: one row per input row, entries with a
  weight <= 0 dropped, empty rows zeros (or default_id's row), ids of rank > 2 allowed.

  Every id of a table is a key, negative ones too: they are not pruned (TensorFlow prunes ids
  < 0, which cannot index a dense variable). default_id is a key whose row fills empty rows.
  """
  table = _table_of(embedding_weights)
  if table is None:
    return tf.compat.v1.nn.safe_embedding_lookup_sparse(
      embedding_weights,
      sparse_ids,
      sparse_weights,
      combiner,
      default_id,
      name,
      partition_strategy,
      max_norm,
    )
  with tf.name_scope(name or "safe_embedding_lookup_sparse"):
    # default_id's row goes first, at index 0: TensorFlow's function takes a Python int.
    rows, positions = _distinct_rows(table, sparse_ids, max_norm, default_id)
    return tf.compat.v1.nn.safe_embedding_lookup_sparse(
      rows, positions, sparse_weights, combiner, default_id=None if default_id is None else 0
    )

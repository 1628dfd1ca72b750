"""Lookups with combiners over Tensor, SparseTensor and RaggedTensor ids."""

import tensorflow as tf

from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.fusion_markers import marked

COMBINERS = ("sum", "mean", "sqrtn")


def _combine(rows, segment_ids, num_segments, combiner):
  summed = tf.math.unsorted_segment_sum(rows, segment_ids, num_segments)
  if combiner == "sum":
    return summed
  counts = tf.math.unsorted_segment_sum(
    tf.ones_like(segment_ids, tf.float32), segment_ids, num_segments
  )
  scale = counts if combiner == "mean" else tf.sqrt(counts)
  return summed / tf.expand_dims(tf.maximum(scale, 1.0), -1)  # empty rows stay zero


_NO_SEGMENTS = ([], 0)  # combiner "none": one output row per id


def embedding_lookup(table, ids, combiner=None, name=None):
  """Looks `ids` up in `table`.

  - Tensor ids of shape S give S + [dim]; with a combiner and rank >= 2, the last axis is
    combined: S[:-1] + [dim] (rank-1 ids are one id per row, so [batch, dim] either way).
  - SparseTensor or RaggedTensor ids of shape [batch, None] give [batch, dim], combining each
    row's ids with `combiner` ("sum", "mean" (default) or "sqrtn"); empty rows give zeros.
  """
  if combiner is not None and combiner not in COMBINERS:
    raise variable_lib.invalid_argument(
      table.name, f"combiner must be one of {COMBINERS}, got {combiner!r}"
    )
  with tf.name_scope(name or f"{table.name}_embedding_lookup"):
    if isinstance(ids, tf.SparseTensor):
      if ids.shape.rank not in (None, 2):
        raise variable_lib.invalid_argument(
          table.name, f"SparseTensor ids must have rank 2, got {ids.shape.rank}"
        )
      rows = table.lookup(ids.values)
      segments = (ids.indices[:, 0], ids.dense_shape[0])
      combined = _combine(rows, *segments, combiner or "mean")
      return marked(table, rows, combined, *segments, combiner or "mean")
    if isinstance(ids, tf.RaggedTensor):
      if ids.shape.rank not in (None, 2):
        raise variable_lib.invalid_argument(
          table.name, f"RaggedTensor ids must have rank 2, got {ids.shape.rank}"
        )
      rows = table.lookup(ids.values)
      segments = (ids.value_rowids(), ids.nrows())
      combined = _combine(rows, *segments, combiner or "mean")
      return marked(table, rows, combined, *segments, combiner or "mean")
    rows = table.lookup(ids)
    if combiner is None or rows.shape.rank == 2:
      return marked(table, rows, rows, *_NO_SEGMENTS, "none")
    if rows.shape.rank is not None and rows.shape.rank < 2:
      raise variable_lib.invalid_argument(table.name, "a combiner needs ids of rank >= 1")
    if combiner == "sum":
      return tf.reduce_sum(rows, axis=-2)
    count = tf.cast(tf.shape(rows)[-2], tf.float32)
    scale = count if combiner == "mean" else tf.sqrt(count)
    return tf.reduce_sum(rows, axis=-2) / tf.maximum(scale, 1.0)


def _key_dtype_of(ids):
  dtype = ids.dtype
  return tf.string if dtype == tf.string else tf.int64


def dynamic_embedding(
  ids,
  dim,
  name,
  initializer=None,
  combiner=None,
  key_dtype=None,
  trainable=True,
  admission=None,
  eviction=None,
  num_shards=None,
):
  """Functional form: gets or creates the table `name` and looks `ids` up in it.

  key_dtype defaults to tf.string for string ids and tf.int64 otherwise. admission and eviction
  are the table's policies, num_shards its sharding (see get_dynamic_embedding_variable).
  """
  if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
    ids = tf.convert_to_tensor(ids)
  table = variable_lib.get_dynamic_embedding_variable(
    name,
    dim,
    key_dtype=key_dtype or _key_dtype_of(ids),
    initializer=initializer,
    trainable=trainable,
    admission=admission,
    eviction=eviction,
    num_shards=num_shards,
  )
  return embedding_lookup(table, ids, combiner=combiner)

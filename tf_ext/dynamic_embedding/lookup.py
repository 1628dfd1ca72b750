"""Lookups with combiners over Tensor, SparseTensor and RaggedTensor ids."""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import get_or_create
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.fusion_markers import marked, marked_rows
from tf_ext.padding import padded_extent

COMBINERS = ("sum", "mean", "sqrtn")

tf.no_gradient("TfExtRaggedSegmentIds")


def _combine(rows, segment_ids, num_segments, combiner):
  summed = tf.math.unsorted_segment_sum(rows, segment_ids, num_segments)
  if combiner == "sum":
    return summed
  counts = tf.math.unsorted_segment_sum(
    tf.ones_like(segment_ids, tf.float32), segment_ids, num_segments
  )
  scale = counts if combiner == "mean" else tf.sqrt(counts)
  return summed / tf.expand_dims(tf.maximum(scale, 1.0), -1)  # empty rows stay zero


def embedding_lookup(table, ids, combiner=None, name=None):
  """Looks `ids` up in `table`.

  - Tensor ids of shape S give S + [dim]; with a combiner and rank >= 2, the last axis is
    combined: S[:-1] + [dim] (rank-1 ids are one id per row, so [batch, dim] either way).
  - SparseTensor or RaggedTensor ids of shape [batch, None] give [batch, dim], combining each
    row's ids with `combiner` ("sum", "mean" (default) or "sqrtn"); empty rows give zeros.
  - Inside a tf_ext.jit.function or a Bucketing.padded block, the padded positions of dense ids
    (a padded input, or a cast, hash or slice of one) are not looked up: they give zero rows and
    touch no table row, as a padded SparseTensor's empty rows do.
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
      # One op instead of TensorFlow's chain of them for value_rowids().
      segments = (_ops_loader.load().tf_ext_ragged_segment_ids(ids.row_splits), ids.nrows())
      combined = _combine(rows, *segments, combiner or "mean")
      return marked(table, rows, combined, *segments, combiner or "mean")
    extent = padded_extent(ids)
    if extent:
      return _lookup_real_ids(table, ids, combiner, extent)
    return _dense_lookup(table, ids, combiner)


def _dense_lookup(table, ids, combiner):
  rows = table.lookup(ids)
  if combiner is None or rows.shape.rank == 2:
    return marked_rows(table, rows)
  if rows.shape.rank is not None and rows.shape.rank < 2:
    raise variable_lib.invalid_argument(table.name, "a combiner needs ids of rank >= 1")
  count = rows.shape[-2] if rows.shape[-2] is not None else tf.shape(rows)[-2]
  return _combine_last_axis(rows, combiner, count)


def _combine_last_axis(rows, combiner, count):
  """Combines rows [..., ids, dim] over their ids axis; `count`: the ids per row."""
  if combiner == "sum":
    return tf.reduce_sum(rows, axis=-2)
  count = tf.cast(count, tf.float32)
  scale = count if combiner == "mean" else tf.sqrt(count)
  return tf.reduce_sum(rows, axis=-2) / tf.maximum(scale, 1.0)


def _lookup_real_ids(table, ids, combiner, extent):
  """A padded dense id tensor (tf_ext.jit; extent: {axis: (true size, padded length)}): only its
  real block is looked up, so padded positions insert, read and update no table row (a padded id
  is a zero, a real key). The rows are padded back with zeros, as a SparseTensor's padded rows
  are, before a combiner, which divides by the real number of ids."""
  rank = ids.shape.rank
  real = tf.slice(
    ids,
    tf.zeros([rank], tf.int32),
    tf.stack([tf.cast(extent[a][0], tf.int32) if a in extent else -1 for a in range(rank)]),
  )
  real.set_shape([None if a in extent else ids.shape[a] for a in range(rank)])
  rows = table.lookup(real)
  combined = combiner is not None and rank >= 2
  if not combined:
    rows = marked_rows(table, rows)
  paddings = [
    tf.stack([0, tf.cast(extent[a][1], tf.int32) - tf.cast(extent[a][0], tf.int32)])
    if a in extent
    else tf.zeros([2], tf.int32)
    for a in range(rank + 1)
  ]
  padded = tf.pad(rows, tf.stack(paddings))
  # The pad's input has the real rows' shape, which changes every batch: it stays outside XLA's
  # cluster (tf_ext.graph's dense-part pass keeps an op's own XLA attribute), or the
  # cluster would compile once per real batch size.
  padded.op._set_attr("_XlaCompile", attr_value_pb2.AttrValue(b=False))  # noqa: SLF001
  padded.set_shape(ids.shape.concatenate([table.dim]))
  if not combined:
    return padded
  last = rank - 1
  count = extent[last][0] if last in extent else ids.shape[last] or tf.shape(ids)[last]
  return _combine_last_axis(padded, combiner, count)


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
  distribution=None,
):
  """Functional form: gets or creates the table `name` and looks `ids` up in it.

  key_dtype defaults to tf.string for string ids and tf.int64 otherwise. admission and eviction
  are the table's policies, num_shards its sharding and distribution ("alltoall": split across
  Horovod ranks) its placement (see get_dynamic_embedding_variable).
  """
  if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
    ids = tf.convert_to_tensor(ids)
  table = get_or_create.get_dynamic_embedding_variable(
    name,
    dim,
    key_dtype=key_dtype or _key_dtype_of(ids),
    initializer=initializer,
    trainable=trainable,
    admission=admission,
    eviction=eviction,
    num_shards=num_shards,
    distribution=distribution,
  )
  return embedding_lookup(table, ids, combiner=combiner)

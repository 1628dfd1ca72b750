"""TFRA's lookups: embedding_lookup, embedding_lookup_unique, embedding_lookup_sparse and
safe_embedding_lookup_sparse, with TFRA's shapes, names and errors.

TFRA oddities kept on purpose:
- safe_embedding_lookup_sparse looks an id of -1 up as an ordinary id (tf.nn's version drops
  negative ids); only weights <= 0 are dropped, and only when the combiner is not "sum";
- embedding_lookup_sparse has one output row per segment up to the largest row index present
  (TensorFlow's segment ops), not per row of the SparseTensor's dense shape; trailing empty rows
  are missing from it, as in TFRA (safe_embedding_lookup_sparse fills them).
A TFRA bug not kept: with weights and the "mean" or "sqrtn" combiner, TFRA gives NaN for an empty
row below the last one; here it is zeros, as tf.nn.embedding_lookup_sparse gives.
"""

import tensorflow as tf

from tf_ext.dynamic_embedding.tfra import shadow_ops
from tf_ext.dynamic_embedding.tfra import variable as variable_lib

_COMBINERS = ("mean", "sqrtn", "sum")


embedding_lookup = variable_lib.embedding_lookup


def _check_sparse(ids_name, ids, weights_name, weights):
  if not isinstance(ids, tf.SparseTensor):
    raise TypeError(f"{ids_name} must be SparseTensor")
  if weights is not None and not isinstance(weights, tf.SparseTensor):
    raise TypeError(f"{weights_name} must be either None or SparseTensor")


def _scoped(name):
  """The absolute name scope `<variable scope>/<name>/`, as TFRA names its sparse lookups."""
  scope = tf.compat.v1.get_variable_scope().name
  return tf.name_scope((f"{scope}/{name}" if scope else name) + "/")


def embedding_lookup_unique(
  params,
  ids,
  partition_strategy=None,
  name=None,
  validate_indices=None,
  max_norm=None,
  return_trainable=False,
):
  """As embedding_lookup, looking each distinct id up once (RaggedTensor ids too)."""
  del partition_strategy, validate_indices
  params = variable_lib.single_params(params)
  dim = params.params.dim if isinstance(params, variable_lib.TrainableWrapper) else params.dim
  wrappers = []

  def lookup(unique_ids):
    rows, wrapper = embedding_lookup(
      params, unique_ids, name=name, max_norm=max_norm, return_trainable=True
    )
    wrappers.append(wrapper)
    return rows

  rows = shadow_ops.embedding_lookup_unique_base(
    ids, dim, lookup, with_unique=True, name=name or "EmbeddingLookupUnique"
  )
  return (rows, wrappers[0]) if return_trainable else rows


def embedding_lookup_sparse(
  params,
  sp_ids,
  sp_weights,
  partition_strategy=None,
  name="embedding_lookup_sparse",
  combiner="mean",
  max_norm=None,
  return_trainable=False,
):
  """Rows of a [batch, M] SparseTensor of ids combined per row (weighted by `sp_weights` when
  given): "sum", "mean" (sum / total weight) or "sqrtn" (sum / sqrt of the summed squared
  weights), as tf.nn.embedding_lookup_sparse."""
  del partition_strategy
  if combiner not in _COMBINERS:
    raise ValueError("combiner must be one of 'mean', 'sqrtn' or 'sum'")
  _check_sparse("sp_ids", sp_ids, "sp_weights", sp_weights)
  with _scoped(name):
    segment_ids = tf.cast(sp_ids.indices[:, 0], tf.int32)
    ids, idx = tf.unique(sp_ids.values)
    params = variable_lib.single_params(params)
    embeddings, wrapper = params.embedding_lookup(ids, name=name, max_norm=max_norm)
    if embeddings.dtype in (tf.float16, tf.bfloat16):
      embeddings = tf.cast(embeddings, tf.float32)
    if sp_weights is None:
      reduce = {
        "sum": tf.sparse.segment_sum,
        "mean": tf.sparse.segment_mean,
        "sqrtn": tf.sparse.segment_sqrt_n,
      }[combiner]
      combined = reduce(embeddings, idx, segment_ids)
    else:
      weights = tf.cast(sp_weights.values, embeddings.dtype)
      rows = tf.gather(embeddings, idx) * tf.expand_dims(weights, -1)
      combined = tf.math.segment_sum(rows, segment_ids)
      # TFRA divides by zero for a row with no ids below the largest row present (NaN rows);
      # TensorFlow's embedding_lookup_sparse, whose results TFRA documents, gives zeros.
      if combiner == "mean":
        total = tf.math.segment_sum(weights, segment_ids)
      elif combiner == "sqrtn":
        total = tf.sqrt(tf.math.segment_sum(weights**2, segment_ids))
      if combiner != "sum":
        combined = tf.math.divide_no_nan(combined, tf.expand_dims(total, -1))
  return (combined, wrapper) if return_trainable else combined


def safe_embedding_lookup_sparse(
  embedding_weights,
  sparse_ids,
  sparse_weights=None,
  combiner="mean",
  default_id=None,
  name="safe_embedding_lookup_sparse",
  partition_strategy=None,
  max_norm=None,
  return_trainable=False,
):
  """embedding_lookup_sparse for ids of any rank >= 2 ([d0, ..., dn] gives [d0, ..., dn-1, dim]):
  rows with no id give zeros, or the row of `default_id` when given."""
  del partition_strategy
  _check_sparse("sparse_ids", sparse_ids, "sparse_weights", sparse_weights)
  with _scoped(name):
    original_shape = sparse_ids.dense_shape
    original_rank = tf.size(original_shape)
    rows = tf.reduce_prod(original_shape[:-1])
    sparse_ids = tf.sparse.reshape(sparse_ids, tf.stack([rows, original_shape[-1]]))
    if sparse_weights is not None:
      sparse_weights = tf.SparseTensor(
        sparse_ids.indices, sparse_weights.values, sparse_ids.dense_shape
      )
    if combiner != "sum" and sparse_weights is not None:
      valid = tf.greater(sparse_weights.values, 0)
      sparse_ids = tf.sparse.retain(sparse_ids, valid)
      sparse_weights = tf.sparse.retain(sparse_weights, valid)
    sparse_ids, is_row_empty = tf.sparse.fill_empty_rows(
      sparse_ids, tf.cast(default_id or 0, sparse_ids.dtype)
    )
    if sparse_weights is not None:
      sparse_weights, _ = tf.sparse.fill_empty_rows(
        sparse_weights, tf.constant(1.0, sparse_weights.dtype)
      )
    result, wrapper = embedding_lookup_sparse(
      embedding_weights,
      sparse_ids,
      sparse_weights,
      combiner=combiner,
      name=f"{name}/embedding_lookup_sparse",  # TFRA's name
      max_norm=max_norm,
      return_trainable=True,
    )
    if default_id is None:
      result = tf.where(tf.expand_dims(is_row_empty, -1), tf.zeros_like(result), result)
    final = tf.reshape(
      result,
      tf.concat([tf.cast(original_shape[: original_rank - 1], tf.int32), tf.shape(result)[1:]], 0),
    )
    rank = original_shape.shape[0]  # the static rank of the ids, when known
    if rank is not None:
      final.set_shape(tf.TensorShape([None] * (rank - 1)).concatenate(result.shape[1:]))
  return (final, wrapper) if return_trainable else final


def trainable_wrapper_filter(iterable_object_in, test_unaggregated_function=None):
  """(others, wrappers): the items of `iterable_object_in` split by whether they are a
  TrainableWrapper (or ShadowVariable)."""
  test = test_unaggregated_function or (lambda x: isinstance(x, variable_lib.TrainableWrapper))
  dense, sparse = [], []
  for item in iterable_object_in:
    (sparse if test(item) else dense).append(item)
  return tuple(dense), tuple(sparse)

"""TFRA's `de.shadow_ops`: ShadowVariable, the trainable handle of a Variable in eager code,
tf.function and Keras layers, and the lookups through it."""

import tensorflow as tf

from tf_ext.dynamic_embedding.tfra import variable as variable_lib
from tf_ext.dynamic_embedding.tfra.variable import ShadowVariable

__all__ = [
  "DEResourceVariable",
  "HvdVariable",
  "ShadowVariable",
  "embedding_lookup",
  "embedding_lookup_unique",
  "embedding_lookup_unique_base",
]

# TFRA's name for the same role.
DEResourceVariable = ShadowVariable


class HvdVariable:
  """TFRA's lookups of `shadow` whose ids are exchanged among the Horovod ranks (each rank holding
  the keys its partitioner gives it). With one rank (`mpi_size=1`, or hvd.size() 1) there is no
  exchange: HvdVariable(...) is `shadow` itself, and every lookup takes it. Across ranks, tf_ext
  splits a table with `de.keras.layers.HvdAllToAllEmbedding` or
  `de.get_variable(..., distribution="alltoall")`; NotImplementedError says so."""

  def __new__(
    cls, name, shadow, embedding_size, with_unique=True, with_secondary_unique=True, mpi_size=None
  ):
    del name, embedding_size, with_unique, with_secondary_unique  # (TFRA reads none of them)
    if not isinstance(shadow, ShadowVariable):
      raise TypeError(f"shadow must be a ShadowVariable, got {type(shadow).__name__}")
    if mpi_size is None:
      try:
        import horovod.tensorflow as hvd

        mpi_size = hvd.size() if hvd.is_initialized() else 1
      except (ImportError, AttributeError):
        mpi_size = 1
    if int(mpi_size) != 1:
      raise NotImplementedError(
        f"tf_ext.tfra: HvdVariable over {mpi_size} ranks is not offered; split the table across "
        "the Horovod ranks with de.keras.layers.HvdAllToAllEmbedding or "
        "de.get_variable(..., distribution='alltoall')"
      )
    return shadow


def embedding_lookup(shadow, ids, partition_strategy=None, name=None, validate_indices=None):
  """The rows of `ids` through `shadow`: ids.shape + [dim]."""
  del partition_strategy, validate_indices
  if not isinstance(shadow, variable_lib.ShadowVariable):
    raise TypeError(f"shadow must be a ShadowVariable, got {type(shadow).__name__}")
  ids = tf.convert_to_tensor(ids)
  if ids.dtype != shadow.params.key_dtype:
    raise ValueError(
      f"{ids.dtype} ids is not matched with ShadowVariable with ids {shadow.params.key_dtype}"
    )
  with tf.name_scope(name or "shadow_embedding_lookup"):
    return shadow.lookup(ids)


def embedding_lookup_unique_base(ids, embedding_size, lookup_function, with_unique=True, name=None):
  """`lookup_function` over ids of any shape, or a RaggedTensor of them: shape(ids) +
  [embedding_size] (a RaggedTensor for ragged ids). `with_unique` looks each distinct id up once
  (the tables do that themselves too, so the rows are the same either way)."""
  ragged = isinstance(ids, tf.RaggedTensor)
  flat = ids.flat_values if ragged else tf.convert_to_tensor(ids)
  shape = tf.concat([tf.shape(flat), [embedding_size]], 0)
  with tf.name_scope(name or "EmbeddingWithUnique"):
    flat_ids = tf.reshape(flat, [-1])
    if with_unique:
      unique, positions = tf.unique(flat_ids)
      rows = tf.gather(lookup_function(unique), positions)
    else:
      rows = lookup_function(flat_ids)
    rows = tf.reshape(rows, shape)
  return tf.RaggedTensor.from_nested_row_splits(rows, ids.nested_row_splits) if ragged else rows


def embedding_lookup_unique(shadow, ids, dim=None, with_unique=True, name=None):
  """As embedding_lookup, for ids of any shape or ragged ids. `with_unique` matters only where
  the Variable's initial rows are drawn per lookup (a missing id reads the row at its position,
  as in TFRA): otherwise the table's lookup finds each distinct id once where the batch repeats
  ids (TF_EXT_FIND_DEDUP), and the optimizer sums a repeated id's gradients, so the rows and
  updates are those of TFRA's unique lookup either way, without the unique op."""
  if dim is not None and dim != shadow.params.dim:
    raise ValueError(f"dim {dim} differs from the Variable's dim {shadow.params.dim}")
  return embedding_lookup_unique_base(
    ids,
    shadow.params.dim,
    lambda x: embedding_lookup(shadow, x),
    with_unique=with_unique and shadow.params.reads_default_rows,
    name=name,
  )

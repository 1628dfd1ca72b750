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
]

# TFRA's names for the same role.
DEResourceVariable = ShadowVariable
HvdVariable = ShadowVariable


def embedding_lookup(shadow, ids, partition_strategy=None, name=None, validate_indices=None):
  """The rows of `ids` through `shadow`: ids.shape + [dim]."""
  del partition_strategy, validate_indices
  if not isinstance(shadow, variable_lib.ShadowVariable):
    raise TypeError(f"shadow must be a ShadowVariable, got {type(shadow).__name__}")
  with tf.name_scope(name or "shadow_embedding_lookup"):
    return shadow.lookup(ids)


def embedding_lookup_unique(shadow, ids, dim=None, with_unique=True, name=None):
  """As embedding_lookup. `with_unique` changes nothing here: the table's lookup finds each
  distinct id once where the batch repeats ids (TF_EXT_FIND_DEDUP), and the optimizer sums a
  repeated id's gradients, so the rows and updates are those of TFRA's unique lookup."""
  del with_unique
  if dim is not None and dim != shadow.params.dim:
    raise ValueError(f"dim {dim} differs from the Variable's dim {shadow.params.dim}")
  return embedding_lookup(shadow, ids, name=name)

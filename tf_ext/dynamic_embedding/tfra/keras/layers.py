"""TFRA's Keras layers (`de.keras.layers`) over tf_ext.tfra Variables.

Each layer holds its Variable as `params` (named `<layer name>-parameter`) and trains it through
`shadow`, the layer's one trainable weight. HvdAllToAllEmbedding splits its table across the Horovod
ranks with tf_ext's all-to-all tables (tf_ext/dynamic_embedding/alltoall.py): `shadow` is then that
table's gradient anchor.
"""

import tensorflow as tf

from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding.tfra import shadow_ops
from tf_ext.dynamic_embedding.tfra import variable as variable_lib

__all__ = [
  "BasicEmbedding",
  "Embedding",
  "FieldWiseEmbedding",
  "HvdAllToAllEmbedding",
  "SquashedEmbedding",
]

# Layer arguments TFRA takes in **kwargs, with their defaults.
_VARIABLE_KWARGS = {
  "bp_v2": False,
  "restrict_policy": None,
  "init_capacity": 0,
  "partitioner": variable_lib.default_partition_fn,
  "kv_creator": None,
  "checkpoint": True,
}
_IGNORED_KWARGS = ("distribute_strategy", "keep_distribution")


def _reduce_method(combiner, segmented=False):
  """tf.math.reduce_<combiner> (or tf.math.segment_/unsorted_segment_<combiner>), as TFRA picks."""
  name = ("unsorted_segment_" if segmented else "reduce_") + combiner
  method = getattr(tf.math, name, None)
  if not callable(method):
    raise ValueError(f"combiner {combiner!r}: tf.math has no {name}")
  return method


def reduce_pooling(x, combiner="sum"):
  """Rows [batch, s1, ..., sn, dim] reduced to [batch, dim] (rank 2: over the ids, to [dim])."""
  ndims = x.shape.ndims
  reduce = _reduce_method(combiner)
  if ndims == 1:
    raise ValueError("reduce_pooling need at least dim-2 input.")
  if ndims == 2:
    return reduce(x, 0)
  for _ in range(ndims - 2):
    x = reduce(x, 1)
  return x


class Embedding(tf.keras.layers.Layer):
  """Rows of ids of any shape: shape(ids) + [embedding_size], with no vocabulary to size."""

  _distribution = None

  def __init__(
    self,
    embedding_size,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    combiner="sum",
    initializer=None,
    devices=None,
    name="DynamicEmbeddingLayer",
    with_unique=True,
    **kwargs,
  ):
    try:
      embedding_size = int(embedding_size)
    except (TypeError, ValueError):
      raise TypeError(
        f"embeddnig size must be convertible to integer, but get {type(embedding_size)}"
      ) from None
    trainable = kwargs.pop("trainable", True)
    self.max_norm = kwargs.pop("max_norm", None)
    variable_kwargs = {k: kwargs.pop(k, default) for k, default in _VARIABLE_KWARGS.items()}
    for ignored in _IGNORED_KWARGS:
      kwargs.pop(ignored, None)
    super().__init__(name=name, trainable=trainable, dtype=value_dtype, **kwargs)
    self.embedding_size = embedding_size
    self.combiner = combiner
    self.with_unique = with_unique
    if initializer is None:
      initializer = tf.keras.initializers.RandomNormal()
    self.params = variable_lib.get_variable(
      (name + "-parameter") if name else "EmbeddingParameter",
      key_dtype=key_dtype,
      value_dtype=value_dtype,
      dim=embedding_size,
      devices=devices,
      partitioner=variable_kwargs["partitioner"],
      shared_name="layer_embedding_variable",
      initializer=initializer,
      trainable=trainable,
      checkpoint=variable_kwargs["checkpoint"],
      init_size=variable_kwargs["init_capacity"],
      kv_creator=variable_kwargs["kv_creator"],
      restrict_policy=variable_kwargs["restrict_policy"],
      bp_v2=variable_kwargs["bp_v2"],
      distribution=self._distribution,
    )
    self.params._created_in_class = self  # noqa: SLF001 (TFRA's back-reference)
    self.shadow = self._make_shadow(name, trainable)

  def _make_shadow(self, name, trainable):
    return shadow_ops.ShadowVariable(
      self.params,
      name=(name + "-shadow") if name else "ShadowVariable",
      max_norm=self.max_norm,
      trainable=trainable,
    )

  def call(self, ids):
    return shadow_ops.embedding_lookup_unique(
      self.shadow, ids, self.embedding_size, self.with_unique, self.name
    )

  def get_config(self):
    initializer = self.params.initializer
    if initializer is None:
      initializer = tf.keras.initializers.Zeros()
    config = {
      "embedding_size": self.embedding_size,
      "key_dtype": self.params.key_dtype.name,
      "value_dtype": self.params.value_dtype.name,
      "combiner": self.combiner,
      "initializer": tf.keras.initializers.serialize(tf.keras.initializers.get(initializer))
      if not isinstance(initializer, (int, float))
      else initializer,
      "devices": None,
      "name": self.name,
      "trainable": self.trainable,
      "bp_v2": self.params.bp_v2,
      "init_capacity": self.params.init_size,
      "max_norm": self.max_norm,
      "with_unique": self.with_unique,
    }
    return config


# TFRA's other name for the same layer.
BasicEmbedding = Embedding


class SquashedEmbedding(Embedding):
  """Embedding whose rows are reduced by `combiner` to (batch_size, embedding_size)."""

  def call(self, ids):
    return reduce_pooling(super().call(ids), combiner=self.combiner)


class FieldWiseEmbedding(Embedding):
  """Rows of [batch, n] ids reduced per field: (batch_size, nslots, embedding_size), an id's field
  being `slot_map_fn(id)` in [0, nslots)."""

  def __init__(
    self,
    embedding_size,
    nslots,
    slot_map_fn=None,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    combiner="sum",
    initializer=None,
    devices=None,
    name="SlotDynamicEmbeddingLayer",
    with_unique=True,
    **kwargs,
  ):
    if not callable(slot_map_fn):
      raise ValueError("slot_map_fn is not callable.")
    try:
      nslots = int(nslots)
    except (TypeError, ValueError):
      raise TypeError(f"nslots should be convertible to int, but get {type(nslots)}") from None
    self.slot_map_fn = slot_map_fn
    self.nslots = nslots
    super().__init__(
      embedding_size,
      key_dtype=key_dtype,
      value_dtype=value_dtype,
      combiner=combiner,
      initializer=initializer,
      devices=devices,
      name=name,
      with_unique=with_unique,
      **kwargs,
    )

  def call(self, ids):
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank > 2:
      raise NotImplementedError("Input dimension higher than 2 is not implemented yet.")
    rows = super().call(tf.reshape(ids, (-1,)))
    batch_size = tf.shape(ids)[0]
    per_sample = tf.shape(ids)[1]
    slots = self.slot_map_fn(ids)
    bias = tf.tile(
      tf.reshape(tf.range(batch_size, dtype=slots.dtype) * self.nslots, (batch_size, 1)),
      (1, per_sample),
    )
    segment_ids = tf.reshape(slots + bias, (-1,))
    reduce = _reduce_method(self.combiner, segmented=True)
    pooled = reduce(rows, segment_ids, num_segments=self.nslots * batch_size)
    return tf.reshape(pooled, (batch_size, self.nslots, self.embedding_size))

  def get_config(self):
    return {**super().get_config(), "nslots": self.nslots, "slot_map_fn": self.slot_map_fn}


class HvdAllToAllEmbedding(BasicEmbedding):
  """An Embedding whose table is split across the Horovod ranks (after hvd.init(); horovod or
  tf_ext.lightcc): each rank holds the ids it owns, looked up and trained through all-to-all
  exchanges. Every rank calls it in the same order, as TFRA's."""

  _distribution = alltoall.ALLTOALL

  def __init__(
    self,
    with_unique=True,
    with_secondary_unique=True,
    mpi_size=None,
    batch_size=None,
    *args,
    **kwargs,
  ):
    del with_secondary_unique, batch_size  # the all-to-all tables deduplicate in one op
    self._mpi_size = mpi_size
    super().__init__(*args, with_unique=with_unique, **kwargs)
    ranks = self.params.tables[0].ranks
    if mpi_size is not None and mpi_size != ranks:
      raise ValueError(f"HvdAllToAllEmbedding: mpi_size={mpi_size}, but Horovod has {ranks} ranks")

  def _make_shadow(self, name, trainable):
    del name, trainable
    return self.params.tables[0].gradient_anchor

  def call(self, ids):
    return self.params.read_rows(ids)

  def get_config(self):
    return {**super().get_config(), "mpi_size": self._mpi_size}

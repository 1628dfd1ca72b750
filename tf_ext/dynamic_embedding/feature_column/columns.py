"""Feature columns whose embeddings live in dynamic embedding tables.

Both columns implement the v2 feature column interface (`DenseFeatures`) and the v1 one
(`tf.compat.v1.feature_column.input_layer`, so Estimator `model_fn`s), as TensorFlow's own
`embedding_column` does.
"""

import collections
import dataclasses

import tensorflow as tf
from tensorflow.python.feature_column import feature_column as fc_old
from tensorflow.python.feature_column import feature_column_v2 as fc
from tensorflow.python.feature_column import serialization

from tf_ext.dynamic_embedding import alltoall, get_or_create, initializers, lifecycle
from tf_ext.dynamic_embedding import lookup as lookup_lib
from tf_ext.dynamic_embedding import sharded as sharded_lib
from tf_ext.dynamic_embedding import variable as variable_lib

_KEY_DTYPES = (tf.int64, tf.string)


@serialization.register_feature_column
class DynamicVocabularyColumn(
  fc.CategoricalColumn,
  fc_old._CategoricalColumn,  # pylint: disable=protected-access
  collections.namedtuple("DynamicVocabularyColumn", ("key", "dtype")),
):
  """See `categorical_column_with_dynamic_vocabulary`."""

  @property
  def _is_v2_column(self):
    return True

  @property
  def name(self):
    return self.key

  @property
  def parse_example_spec(self):
    return {self.key: tf.io.VarLenFeature(self.dtype)}

  @property
  def _parse_example_spec(self):
    return self.parse_example_spec

  def _ids(self, input_tensor):
    sparse = fc._to_sparse_input_and_drop_ignore_values(input_tensor)  # pylint: disable=protected-access
    if self.dtype == tf.string:
      if sparse.dtype != tf.string:
        raise ValueError(f"column '{self.key}': string ids expected, got {sparse.dtype.name}")
      return sparse
    if not sparse.dtype.is_integer:
      raise ValueError(f"column '{self.key}': integer ids expected, got {sparse.dtype.name}")
    return tf.SparseTensor(sparse.indices, tf.cast(sparse.values, tf.int64), sparse.dense_shape)

  def transform_feature(self, transformation_cache, state_manager):
    return self._ids(transformation_cache.get(self.key, state_manager))

  def _transform_feature(self, inputs):
    return self._ids(inputs.get(self.key))

  @property
  def num_buckets(self):
    raise ValueError(
      f"column '{self.key}' has no bucket count (its ids are used as they are): embed it with "
      "tf_ext.feature_column.dynamic_embedding_column"
    )

  @property
  def _num_buckets(self):
    return self.num_buckets

  def get_sparse_tensors(self, transformation_cache, state_manager):
    return fc.CategoricalColumn.IdWeightPair(transformation_cache.get(self, state_manager), None)

  def _get_sparse_tensors(self, inputs, weight_collections=None, trainable=None):
    del weight_collections, trainable
    return fc.CategoricalColumn.IdWeightPair(inputs.get(self), None)

  @property
  def parents(self):
    return [self.key]

  def get_config(self):
    return {"key": self.key, "dtype": tf.as_dtype(self.dtype).name}

  @classmethod
  def from_config(cls, config, custom_objects=None, columns_by_name=None):
    del custom_objects, columns_by_name
    return cls(config["key"], tf.as_dtype(config["dtype"]))


def categorical_column_with_dynamic_vocabulary(key, dtype=tf.int64):
  """A categorical column of ids used as they are: int64 or string, any value, no bucket count.

  Unlike hash-bucket columns, distinct ids never collide; unlike identity and vocabulary columns,
  nothing needs to be known about the ids in advance. Embed it with `dynamic_embedding_column`.
  As with TensorFlow's columns, a dense input marks missing values with -1 (int64) or ""
  (string); in a SparseTensor every value is an id.
  """
  if not isinstance(key, str) or not key:
    raise ValueError(
      f"categorical_column_with_dynamic_vocabulary: key must be a string, got {key!r}"
    )
  try:
    dtype = tf.as_dtype(dtype)
  except TypeError:
    dtype = None
  if dtype not in _KEY_DTYPES:
    raise ValueError(
      f"categorical_column_with_dynamic_vocabulary '{key}': dtype must be tf.int64 or "
      f"tf.string, got {dtype!r}"
    )
  return DynamicVocabularyColumn(key, dtype)


@serialization.register_feature_column
class DynamicEmbeddingColumn(
  fc.DenseColumn,
  fc_old._DenseColumn,  # pylint: disable=protected-access
  collections.namedtuple(
    "DynamicEmbeddingColumn",
    (
      "categorical_column",
      "dimension",
      "combiner",
      "initializer",
      "admission",
      "eviction",
      "num_shards",
      "distribution",
    ),
    defaults=(None, None),
  ),
):
  """See `dynamic_embedding_column`."""

  @property
  def _is_v2_column(self):
    return getattr(self.categorical_column, "_is_v2_column", False)

  @property
  def name(self):
    return f"{self.categorical_column.name}_dynamic_embedding"

  @property
  def key_dtype(self):
    column = self.categorical_column
    return column.dtype if isinstance(column, DynamicVocabularyColumn) else tf.int64

  @property
  def parse_example_spec(self):
    return self.categorical_column.parse_example_spec

  @property
  def _parse_example_spec(self):
    return self.categorical_column._parse_example_spec  # pylint: disable=protected-access

  def transform_feature(self, transformation_cache, state_manager):
    return transformation_cache.get(self.categorical_column, state_manager)

  def _transform_feature(self, inputs):
    return inputs.get(self.categorical_column)

  @property
  def variable_shape(self):
    return tf.TensorShape([self.dimension])

  @property
  def _variable_shape(self):
    return self.variable_shape

  def _table(self, create, **kwargs):
    return create(
      self.name,
      self.dimension,
      key_dtype=self.key_dtype,
      initializer=self.initializer,
      admission=self.admission,
      eviction=self.eviction,
      **kwargs,
    )

  def create_state(self, state_manager):
    """DenseFeatures: a table of the layer's own (as embedding_column's variable is), and its
    gradient anchor as one of the layer's weights (so the optimizer sees it); one per shard."""
    names = ["gradient_anchor"]
    if self.num_shards is not None:
      names = [f"gradient_anchor_{i}" for i in range(self.num_shards)]
    anchors = [
      state_manager.create_variable(
        self, name, shape=(), dtype=tf.float32, initializer=tf.zeros_initializer()
      )
      for name in names
    ]
    if self.distribution == alltoall.ALLTOALL:
      table = self._table(alltoall.AllToAllDynamicEmbeddingVariable, gradient_anchor=anchors[0])
    elif self.num_shards is None:
      table = self._table(variable_lib.DynamicEmbeddingVariable, gradient_anchor=anchors[0])
    else:
      table = self._table(
        sharded_lib.ShardedDynamicEmbeddingVariable,
        num_shards=self.num_shards,
        gradient_anchors=anchors,
      )
    state_manager.add_resource(self, "table", table)

  def _embed(self, table, sparse_tensors):
    ids, weights = sparse_tensors.id_tensor, sparse_tensors.weight_tensor
    if weights is not None:
      raise ValueError(
        f"{self.name}: weighted categorical columns are not supported; embed the ids unweighted"
      )
    if not isinstance(self.categorical_column, DynamicVocabularyColumn):
      # Identity, vocabulary and hash-bucket columns mark unknown ids with negative values, which
      # TensorFlow's embedding lookups drop; so does this one (it would serve them a row).
      ids = tf.sparse.retain(ids, ids.values >= 0)
    if ids.shape.rank != 2:  # [batch, ...] ids: every id of an example in one row
      ids = tf.sparse.reshape(ids, tf.stack([ids.dense_shape[0], -1]))
    return lookup_lib.embedding_lookup(table, ids, combiner=self.combiner)

  def get_dense_tensor(self, transformation_cache, state_manager):
    sparse_tensors = self.categorical_column.get_sparse_tensors(transformation_cache, state_manager)
    return self._embed(state_manager.get_resource(self, "table"), sparse_tensors)

  def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
    del weight_collections, trainable
    sparse_tensors = self.categorical_column._get_sparse_tensors(inputs)  # pylint: disable=protected-access
    # input_layer: get-or-create by name in the enclosing variable scope, as for variables.
    table = self._table(
      get_or_create.get_dynamic_embedding_variable,
      num_shards=self.num_shards,
      distribution=self.distribution,
    )
    return self._embed(table, sparse_tensors)

  @property
  def parents(self):
    return [self.categorical_column]

  def get_config(self):
    """For Keras model saving (DenseFeatures): plain values only; the initializer as its spec."""
    return {
      "categorical_column": serialization.serialize_feature_column(self.categorical_column),
      "dimension": self.dimension,
      "combiner": self.combiner,
      "initializer": dict(self.initializer._asdict()),
      "admission": dataclasses.asdict(self.admission) if self.admission else None,
      "eviction": dataclasses.asdict(self.eviction) if self.eviction else None,
      "num_shards": self.num_shards,
      "distribution": self.distribution,
    }

  @classmethod
  def from_config(cls, config, custom_objects=None, columns_by_name=None):
    admission, eviction = config.get("admission"), config.get("eviction")
    return cls(
      serialization.deserialize_feature_column(
        config["categorical_column"], custom_objects, columns_by_name
      ),
      config["dimension"],
      config["combiner"],
      initializers.InitializerSpec(**config["initializer"]),
      lifecycle.FrequencyAdmission(**admission) if admission else None,
      lifecycle.EvictionPolicy(**eviction) if eviction else None,
      config.get("num_shards"),
      config.get("distribution"),
    )


def dynamic_embedding_column(
  categorical_column,
  dimension,
  combiner="mean",
  initializer=None,
  admission=None,
  eviction=None,
  num_shards=None,
  distribution=None,
):
  """The embedding of a categorical column in a dynamic embedding table.

  The table is named `<column>_dynamic_embedding` (in the enclosing variable scope, for
  input_layer).

  `categorical_column`: `categorical_column_with_dynamic_vocabulary` (int64 or string ids, no
  collisions); or TensorFlow's identity column (its ids are used as they are, never taken modulo
  `num_buckets`), vocabulary columns (the vocabulary index) or hash-bucket columns (whose ids
  collide: distinct ids with the same hash share a row). `combiner` ("mean", "sum", "sqrtn")
  combines an example's ids. `initializer`, `admission`, `eviction`: as for
  `tf_ext.get_dynamic_embedding_variable`. `num_shards`: None for one table, else the table is
  split by id into that many shards (tf_ext.ShardedDynamicEmbeddingVariable), each placed by the
  active device function (e.g. replica_device_setter). `distribution="alltoall"`: the table is
  split across the Horovod ranks instead (see get_dynamic_embedding_variable). Train with
  tf_ext.DynamicEmbeddingOptimizer.
  """
  owner = "dynamic_embedding_column"
  if not isinstance(categorical_column, (fc.CategoricalColumn, fc_old._CategoricalColumn)):  # pylint: disable=protected-access
    raise ValueError(
      f"{owner}: categorical_column must be a categorical column (categorical_column_with_*), "
      f"got {type(categorical_column).__name__}: {categorical_column!r}"
    )
  if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
    raise ValueError(
      f"{owner} '{categorical_column.name}': dimension must be a positive int, got {dimension!r}"
    )
  if combiner not in lookup_lib.COMBINERS:
    raise ValueError(
      f"{owner} '{categorical_column.name}': combiner must be one of {lookup_lib.COMBINERS}, "
      f"got {combiner!r}"
    )
  name = f"{categorical_column.name}_dynamic_embedding"
  spec = initializers.spec_from(initializer, dimension, name)  # checked now, and serializable
  alltoall.check_distribution(name, distribution, num_shards)
  if num_shards is not None:
    sharded_lib.check_num_shards(name, num_shards)
  if distribution is not None:
    alltoall.horovod_of(name)  # fail now, not when the column's table is created
  return DynamicEmbeddingColumn(
    categorical_column, dimension, combiner, spec, admission, eviction, num_shards, distribution
  )

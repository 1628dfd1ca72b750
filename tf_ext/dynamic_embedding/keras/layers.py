"""Keras layers of tf_ext."""

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding import alltoall, initializers, lifecycle
from tf_ext.dynamic_embedding import lookup as lookup_lib
from tf_ext.dynamic_embedding import sharded as sharded_lib
from tf_ext.dynamic_embedding import variable as variable_lib

__all__ = [
  "DynamicEmbedding",
]


@tf.keras.utils.register_keras_serializable(package="tf_ext")
class DynamicEmbedding(tf.keras.layers.Layer):
  """An embedding layer over a dynamic embedding table.

  Ids of any shape S give S + [dim]; SparseTensor / RaggedTensor ids (or dense ids with a
  `combiner`) are combined per row into [batch, dim]. Train with an optimizer wrapped by
  `tf_ext.DynamicEmbeddingOptimizer`. `admission` (tf_ext.FrequencyAdmission) and `eviction`
  (tf_ext.EvictionPolicy) set the table's lifecycle; tf_ext.keras.callbacks.TableEviction runs
  the eviction during `fit`. `num_shards` splits the table by id into that many shards
  (tf_ext.ShardedDynamicEmbeddingVariable), each placed with its gradient anchor weight by the
  active device function (e.g. replica_device_setter over parameter servers).
  `distribution="alltoall"` splits the table across the Horovod ranks instead
  (tf_ext/dynamic_embedding/alltoall.py; after hvd.init()).
  """

  def __init__(
    self,
    dim,
    key_dtype=tf.int64,
    initializer=None,
    combiner=None,
    admission=None,
    eviction=None,
    num_shards=None,
    distribution=None,
    **kwargs,
  ):
    # Rows and gradient anchors are float32 under any Keras mixed-precision policy (the layers
    # after it cast its output to their compute dtype).
    kwargs.setdefault("dtype", "float32")
    super().__init__(**kwargs)
    if self.dtype_policy.compute_dtype != "float32":
      raise ValueError(
        f"DynamicEmbedding {self.name!r}: dtype must be float32 (tables hold float32 rows), got "
        f"{self.dtype_policy.name!r}"
      )
    alltoall.check_distribution(self.name, distribution, num_shards)
    if num_shards is not None:
      sharded_lib.check_num_shards(self.name, num_shards)
    if distribution is not None:
      alltoall.horovod_of(self.name)  # fail now, not when the layer is built
    self.num_shards = num_shards
    self.distribution = distribution
    self.dim = dim
    self.key_dtype = tf.as_dtype(key_dtype)
    self._initializer_spec = initializers.spec_from(initializer, dim, self.name)
    self.combiner = combiner
    self.admission = lifecycle.from_config(lifecycle.FrequencyAdmission, admission)
    self.eviction = lifecycle.from_config(lifecycle.EvictionPolicy, eviction)
    lifecycle.check_policies(self.name, self.trainable, self.admission, self.eviction)
    self.table = None

  def build(self, input_shape):
    # The anchors first: the active device function places each, and its table follows it.
    names = ["gradient_anchor"]
    if self.num_shards is not None:
      names = [f"gradient_anchor_{i}" for i in range(self.num_shards)]
    anchors = [
      self.add_weight(name=name, shape=(), initializer="zeros", trainable=self.trainable)
      for name in names
    ]
    options = {
      "key_dtype": self.key_dtype,
      "initializer": self._initializer_spec,
      "trainable": self.trainable,
      "admission": self.admission,
      "eviction": self.eviction,
    }
    if self.distribution == alltoall.ALLTOALL:
      self.table = alltoall.AllToAllDynamicEmbeddingVariable(
        self.name, self.dim, gradient_anchor=anchors[0], **options
      )
    elif self.num_shards is None:
      self.table = variable_lib.DynamicEmbeddingVariable(
        self.name, self.dim, gradient_anchor=anchors[0], **options
      )
    else:
      self.table = sharded_lib.ShardedDynamicEmbeddingVariable(
        self.name, self.dim, self.num_shards, gradient_anchors=anchors, **options
      )
    super().build(input_shape)

  def call(self, ids):
    return lookup_lib.embedding_lookup(self.table, ids, combiner=self.combiner)

  # The `.keras` format stores a layer's state as named arrays: the gradient anchor as Keras
  # would, plus the table's content (string keys as one byte buffer and their lengths). The
  # arrays are TfExtTableExport's outputs after the keys, in order (tests/dynamic_embedding/
  # test_op_facts.py); their names are a file format, so they are spelled out here.
  _TABLE_ARRAYS = ("values", "slots", "update_counts", "last_steps", "slot_initial_values")

  def save_own_variables(self, store):
    super().save_own_variables(store)
    keys, *arrays = (t.numpy() for t in self.table.export_with_slots())
    if self.key_dtype == tf.string:
      store["table_key_bytes"] = np.frombuffer(b"".join(keys), np.uint8)
      store["table_key_lengths"] = np.array([len(k) for k in keys], np.int64)
    else:
      store["table_keys"] = keys
    for name, array in zip(self._TABLE_ARRAYS, arrays):
      store[f"table_{name}"] = array

  def load_own_variables(self, store):
    table_entries = [k for k in store.keys() if k.startswith("table_")]
    weights = {k: store[k] for k in store.keys() if k not in table_entries}
    # The weights are the gradient anchors, always 0, one per shard: a file saved with another
    # number of shards loads without them (its rows go to their shards by id).
    if len(weights) == len(self.weights):
      super().load_own_variables(weights)
    if not table_entries:
      return
    if self.key_dtype == tf.string:
      buffer = np.asarray(store["table_key_bytes"]).tobytes()
      ends = np.cumsum(np.asarray(store["table_key_lengths"]))
      keys = np.array(
        [buffer[e - n : e] for e, n in zip(ends, np.asarray(store["table_key_lengths"]))], object
      )
    else:
      keys = np.asarray(store["table_keys"])
    self.table.import_with_slots(
      keys, *(np.asarray(store[f"table_{name}"]) for name in self._TABLE_ARRAYS)
    )

  def get_config(self):
    return {
      **super().get_config(),
      "dim": self.dim,
      "key_dtype": self.key_dtype.name,
      "initializer": initializers.to_config(self._initializer_spec),
      "combiner": self.combiner,
      "admission": self.admission.get_config() if self.admission else None,
      "eviction": self.eviction.get_config() if self.eviction else None,
      "num_shards": self.num_shards,
      "distribution": self.distribution,
    }

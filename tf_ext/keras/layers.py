"""Keras layers of tf_ext."""

import numpy as np
import tensorflow as tf

from tf_ext.dynamic_embedding import initializers, lifecycle
from tf_ext.dynamic_embedding import lookup as lookup_lib
from tf_ext.dynamic_embedding import variable as variable_lib


@tf.keras.utils.register_keras_serializable(package="tf_ext")
class DynamicEmbedding(tf.keras.layers.Layer):
  """An embedding layer over a dynamic embedding table.

  Ids of any shape S give S + [dim]; SparseTensor / RaggedTensor ids (or dense ids with a
  `combiner`) are combined per row into [batch, dim]. Train with an optimizer wrapped by
  `tf_ext.DynamicEmbeddingOptimizer`. `admission` (tf_ext.FrequencyAdmission) and `eviction`
  (tf_ext.EvictionPolicy) set the table's lifecycle; tf_ext.keras.callbacks.TableEviction runs
  the eviction during `fit`.
  """

  def __init__(
    self,
    dim,
    key_dtype=tf.int64,
    initializer=None,
    combiner=None,
    admission=None,
    eviction=None,
    **kwargs,
  ):
    super().__init__(**kwargs)
    self.dim = dim
    self.key_dtype = tf.as_dtype(key_dtype)
    self._initializer_spec = initializers.spec_from(initializer, dim, self.name)
    self.combiner = combiner
    self.admission = lifecycle.from_config(lifecycle.FrequencyAdmission, admission)
    self.eviction = lifecycle.from_config(lifecycle.EvictionPolicy, eviction)
    lifecycle.check_policies(self.name, self.trainable, self.admission, self.eviction)
    self.table = None

  def build(self, input_shape):
    anchor = self.add_weight(
      name="gradient_anchor", shape=(), initializer="zeros", trainable=self.trainable
    )
    self.table = variable_lib.DynamicEmbeddingVariable(
      self.name,
      self.dim,
      key_dtype=self.key_dtype,
      initializer=self._initializer_spec,
      trainable=self.trainable,
      gradient_anchor=anchor,
      admission=self.admission,
      eviction=self.eviction,
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
    super().load_own_variables({k: store[k] for k in store.keys() if k not in table_entries})
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
    }

"""Keras layers of tf_ext."""
import tensorflow as tf

from tf_ext.dynamic_embedding import initializers
from tf_ext.dynamic_embedding import lookup as lookup_lib
from tf_ext.dynamic_embedding import variable as variable_lib


@tf.keras.utils.register_keras_serializable(package="tf_ext")
class DynamicEmbedding(tf.keras.layers.Layer):
  """An embedding layer over a dynamic embedding table.

  Ids of any shape S give S + [dim]; SparseTensor / RaggedTensor ids (or dense ids with a
  `combiner`) are combined per row into [batch, dim]. Train with an optimizer wrapped by
  `tf_ext.DynamicEmbeddingOptimizer`.
  """

  def __init__(self, dim, key_dtype=tf.int64, initializer=None, combiner=None, **kwargs):
    super().__init__(**kwargs)
    self.dim = dim
    self.key_dtype = tf.as_dtype(key_dtype)
    self._initializer_spec = initializers.spec_from(initializer, dim, self.name)
    self.combiner = combiner
    self.table = None

  def build(self, input_shape):
    anchor = self.add_weight(name="gradient_anchor", shape=(), initializer="zeros",
                             trainable=self.trainable)
    self.table = variable_lib.DynamicEmbeddingVariable(
        self.name, self.dim, key_dtype=self.key_dtype, initializer=self._initializer_spec,
        trainable=self.trainable, gradient_anchor=anchor)
    super().build(input_shape)

  def call(self, ids):
    return lookup_lib.embedding_lookup(self.table, ids, combiner=self.combiner)

  def get_config(self):
    return {**super().get_config(), "dim": self.dim, "key_dtype": self.key_dtype.name,
            "initializer": initializers.to_config(self._initializer_spec),
            "combiner": self.combiner}

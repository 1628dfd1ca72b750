"""Feature columns over dynamic embedding tables, for `tf.compat.v1.feature_column.input_layer`
and `tf.keras.layers.DenseFeatures`.

- `categorical_column_with_dynamic_vocabulary(key, dtype)`: ids (int64 or string) used as they
  are, with no bucket count and no collisions.
- `dynamic_embedding_column(categorical_column, dimension, combiner="mean", ...)`: the embedding
  of any categorical column in a dynamic embedding table.
"""

from tf_ext.dynamic_embedding.feature_column.columns import (
  DynamicEmbeddingColumn,
  DynamicVocabularyColumn,
  categorical_column_with_dynamic_vocabulary,
  dynamic_embedding_column,
)

__all__ = [
  "DynamicEmbeddingColumn",
  "DynamicVocabularyColumn",
  "categorical_column_with_dynamic_vocabulary",
  "dynamic_embedding_column",
]

"""`import tf_ext.deeprec as deeprec`: Alibaba DeepRec's EmbeddingVariable API over tf_ext tables.

DeepRec programs (a TF 1.15 fork) write `tf.get_embedding_variable(...)`,
`tf.EmbeddingVariableOption(...)` and `tf.nn.embedding_lookup(ev, ids)`; with tf_ext they write
`deeprec.get_embedding_variable(...)`, `deeprec.EmbeddingVariableOption(...)` and
`deeprec.embedding_lookup(ev, ids)`, with the same arguments and defaults. An EmbeddingVariable
is a tf_ext table: train it with `tf_ext.DynamicEmbeddingOptimizer(optimizer)`, save it with
`tf.compat.v1.train.Saver` (or `deeprec.Saver`, which evicts first, as DeepRec does at every
save). Options tf_ext cannot honour raise, naming the argument and what to use instead;
docs/deeprec_mapping.md maps every name.
"""

from tf_ext.dynamic_embedding.deeprec.embedding_ops import (
  embedding_lookup,
  embedding_lookup_sparse,
  safe_embedding_lookup_sparse,
)
from tf_ext.dynamic_embedding.deeprec.options import (
  CacheStrategy,
  CBFFilter,
  CheckpointOption,
  CounterFilter,
  EmbeddingVariableOption,
  GlobalStepEvict,
  InitializerOption,
  L2WeightEvict,
  StorageOption,
  StorageType,
)
from tf_ext.dynamic_embedding.deeprec.variable import (
  Saver,
  evict,
  export,
  get_embedding_variable,
  total_count,
)
from tf_ext.dynamic_embedding.train import EvictionHook

__all__ = [
  "CBFFilter",
  "CacheStrategy",
  "CheckpointOption",
  "CounterFilter",
  "EmbeddingVariableOption",
  "EvictionHook",
  "GlobalStepEvict",
  "InitializerOption",
  "L2WeightEvict",
  "Saver",
  "StorageOption",
  "StorageType",
  "embedding_lookup",
  "embedding_lookup_sparse",
  "evict",
  "export",
  "get_embedding_variable",
  "safe_embedding_lookup_sparse",
  "total_count",
]

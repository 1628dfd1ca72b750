"""tf_ext: TensorFlow extensions for large recommendation and ads models.

The op library is loaded once (tf_ext._ops_loader). Importing tf_ext tries it, because a SavedModel
that uses tf_ext ops can only be loaded once they are registered; if that fails, `import tf_ext`
still works and the reason (missing library, TensorFlow version or ABI mismatch) is raised at the
first use of an op.
"""

from tf_ext import (
  _ops_loader,
  feature_column,
  graph,
  graph_optimizations,
  jit,
  keras,
  mixed_precision,
  saved_model,
  train,
)
from tf_ext.dynamic_embedding import (
  DeltaCheckpointManager,
  DynamicEmbeddingOptimizer,
  DynamicEmbeddingVariable,
  EvictionPolicy,
  FrequencyAdmission,
  InitializerSpec,
  dynamic_embedding,
  embedding_lookup,
  get_dynamic_embedding_variable,
)
from tf_ext.dynamic_embedding.cluster import wait_for_cluster
from tf_ext.dynamic_embedding.sharded import ShardedDynamicEmbeddingVariable

__all__ = [
  # Dynamic embedding, at the top level.
  "DeltaCheckpointManager",
  "DynamicEmbeddingOptimizer",
  "DynamicEmbeddingVariable",
  "EvictionPolicy",
  "FrequencyAdmission",
  "InitializerSpec",
  "ShardedDynamicEmbeddingVariable",
  "dynamic_embedding",
  "embedding_lookup",
  "get_dynamic_embedding_variable",
  "wait_for_cluster",
  # The subpackages that `import tf_ext` loads (tf_ext.lightcc and tf_ext.harp are imported on
  # their own: lightcc imports Horovod).
  "feature_column",
  "graph",
  "graph_optimizations",
  "jit",
  "keras",
  "mixed_precision",
  "saved_model",
  "train",
]

__version__ = "0.1.0"

_ops_loader.try_load()

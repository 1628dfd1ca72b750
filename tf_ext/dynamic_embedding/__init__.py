"""Dynamic embedding: hashtable-backed embeddings that grow and shrink while training."""

from tf_ext.dynamic_embedding.delta_checkpoint import DeltaCheckpointManager
from tf_ext.dynamic_embedding.get_or_create import get_dynamic_embedding_variable
from tf_ext.dynamic_embedding.initializers import InitializerSpec
from tf_ext.dynamic_embedding.lifecycle import EvictionPolicy, FrequencyAdmission
from tf_ext.dynamic_embedding.live_tables import tables
from tf_ext.dynamic_embedding.lookup import dynamic_embedding, embedding_lookup
from tf_ext.dynamic_embedding.optimizer import DynamicEmbeddingOptimizer
from tf_ext.dynamic_embedding.variable import DynamicEmbeddingVariable

__all__ = [
  "DeltaCheckpointManager",
  "DynamicEmbeddingOptimizer",
  "DynamicEmbeddingVariable",
  "EvictionPolicy",
  "FrequencyAdmission",
  "InitializerSpec",
  "dynamic_embedding",
  "embedding_lookup",
  "get_dynamic_embedding_variable",
  "tables",
]

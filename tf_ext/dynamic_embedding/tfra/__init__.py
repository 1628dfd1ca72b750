"""`import tf_ext.tfra as de`: TFRA 0.7.2's `dynamic_embedding` API over tf_ext tables.

Programs written for `from tensorflow_recommenders_addons import dynamic_embedding as de` run with
the import changed: the same names, arguments, defaults, shapes and errors, with tf_ext's tables,
optimizer updates, checkpoints and all-to-all tables underneath. Importing it patches nothing in
TensorFlow (TFRA's import does). docs/migration.md lists every name and what differs.
"""

from tf_ext.dynamic_embedding.tfra import keras, ops, shadow_ops, train
from tf_ext.dynamic_embedding.tfra.checkpoints import restore_from_tfra
from tf_ext.dynamic_embedding.tfra.creators import (
  CuckooHashTableConfig,
  CuckooHashTableCreator,
  FileSystemSaver,
  HkvEvictStrategy,
  HkvHashTableConfig,
  HkvHashTableCreator,
  KVCreator,
  RedisTableConfig,
  RedisTableCreator,
)
from tf_ext.dynamic_embedding.tfra.embedding_ops import (
  embedding_lookup,
  embedding_lookup_sparse,
  embedding_lookup_unique,
  safe_embedding_lookup_sparse,
  trainable_wrapper_filter,
)
from tf_ext.dynamic_embedding.tfra.ops import data_flow_ops as data_flow
from tf_ext.dynamic_embedding.tfra.ops import math_ops as math
from tf_ext.dynamic_embedding.tfra.optimizer import DynamicEmbeddingOptimizer, create_slots
from tf_ext.dynamic_embedding.tfra.restrict_policies import (
  FrequencyRestrictPolicy,
  RestrictPolicy,
  TimestampRestrictPolicy,
)
from tf_ext.dynamic_embedding.tfra.shadow_ops import DEResourceVariable
from tf_ext.dynamic_embedding.tfra.variable import (
  GraphKeys,
  ModelMode,
  TrainableWrapper,
  Variable,
  enable_inference_mode,
  enable_train_mode,
  get_model_mode,
  get_variable,
)
from tf_ext.dynamic_embedding.tfra.warm_start import WarmStartHook, warm_start

__all__ = [
  "CuckooHashTableConfig",
  "CuckooHashTableCreator",
  "DEResourceVariable",
  "DynamicEmbeddingOptimizer",
  "create_slots",
  "FileSystemSaver",
  "FrequencyRestrictPolicy",
  "GraphKeys",
  "HkvEvictStrategy",
  "HkvHashTableConfig",
  "HkvHashTableCreator",
  "KVCreator",
  "ModelMode",
  "RedisTableConfig",
  "RedisTableCreator",
  "RestrictPolicy",
  "TimestampRestrictPolicy",
  "TrainableWrapper",
  "WarmStartHook",
  "Variable",
  "embedding_lookup",
  "embedding_lookup_sparse",
  "embedding_lookup_unique",
  "enable_inference_mode",
  "enable_train_mode",
  "get_model_mode",
  "get_variable",
  "data_flow",
  "keras",
  "math",
  "ops",
  "restore_from_tfra",
  "safe_embedding_lookup_sparse",
  "shadow_ops",
  "train",
  "trainable_wrapper_filter",
  "warm_start",
]

"""Import paths that users have, kept after the code moved to its capability: each old path gives
the same object as its new home (tf_ext/_public_paths.py)."""

import importlib
import subprocess
import sys

import pytest

# (old path, new home): modules, or module:attribute.
MOVED = [
  ("tf_ext.tfra", "tf_ext.dynamic_embedding.tfra"),
  ("tf_ext.deeprec", "tf_ext.dynamic_embedding.deeprec"),
  ("tf_ext.tfra.keras.layers", "tf_ext.dynamic_embedding.tfra.keras.layers"),
  ("tf_ext.tfra:Variable", "tf_ext.dynamic_embedding.tfra.variable:Variable"),
  ("tf_ext.keras", "tf_ext.dynamic_embedding.keras"),
  ("tf_ext.keras.layers", "tf_ext.dynamic_embedding.keras.layers"),
  (
    "tf_ext.keras.layers:DynamicEmbedding",
    "tf_ext.dynamic_embedding.keras.layers:DynamicEmbedding",
  ),
  ("tf_ext.keras.callbacks", "tf_ext.dynamic_embedding.keras.callbacks"),
  (
    "tf_ext.keras.callbacks:DeltaCheckpoint",
    "tf_ext.dynamic_embedding.keras.checkpoint_callbacks:DeltaCheckpoint",
  ),
  (
    "tf_ext.keras.callbacks:TableEviction",
    "tf_ext.dynamic_embedding.keras.lifecycle_callbacks:TableEviction",
  ),
  (
    "tf_ext.keras.callbacks:TableStatistics",
    "tf_ext.dynamic_embedding.keras.lifecycle_callbacks:TableStatistics",
  ),
  (
    "tf_ext.keras.lifecycle_callbacks:model_tables",
    "tf_ext.dynamic_embedding.keras.lifecycle_callbacks:model_tables",
  ),
  ("tf_ext.keras.checkpoint_callbacks", "tf_ext.dynamic_embedding.keras.checkpoint_callbacks"),
  ("tf_ext.train", "tf_ext.dynamic_embedding.train"),
  ("tf_ext.train:EvictionHook", "tf_ext.dynamic_embedding.train:EvictionHook"),
  ("tf_ext.train:TableStatisticsHook", "tf_ext.dynamic_embedding.train:TableStatisticsHook"),
  ("tf_ext.train:DeltaCheckpointHook", "tf_ext.dynamic_embedding.train:DeltaCheckpointHook"),
  ("tf_ext.train.lifecycle_hooks", "tf_ext.dynamic_embedding.train.lifecycle_hooks"),
  ("tf_ext.train.checkpoint_hooks", "tf_ext.dynamic_embedding.train.checkpoint_hooks"),
  ("tf_ext.saved_model", "tf_ext.dynamic_embedding.saved_model"),
  ("tf_ext.saved_model.serving", "tf_ext.dynamic_embedding.saved_model.serving"),
  (
    "tf_ext.saved_model:export_for_serving",
    "tf_ext.dynamic_embedding.saved_model:export_for_serving",
  ),
  (
    "tf_ext.saved_model:export_estimator_for_serving",
    "tf_ext.dynamic_embedding.saved_model:export_estimator_for_serving",
  ),
  ("tf_ext.feature_column", "tf_ext.dynamic_embedding.feature_column"),
  ("tf_ext.feature_column.columns", "tf_ext.dynamic_embedding.feature_column.columns"),
  (
    "tf_ext.feature_column:dynamic_embedding_column",
    "tf_ext.dynamic_embedding.feature_column:dynamic_embedding_column",
  ),
  (
    "tf_ext.feature_column:categorical_column_with_dynamic_vocabulary",
    "tf_ext.dynamic_embedding.feature_column:categorical_column_with_dynamic_vocabulary",
  ),
  ("tf_ext.graph_optimizations", "tf_ext.graph"),
  ("tf_ext.graph_optimizations:enable", "tf_ext.graph:enable"),
  ("tf_ext.graph_optimizations:config_proto", "tf_ext.graph:config_proto"),
  ("tf_ext.jit:size", "tf_ext.padding:size"),
  ("tf_ext.jit:mask", "tf_ext.padding:mask"),
  ("tf_ext.jit:masked_sum", "tf_ext.padding:masked_sum"),
  ("tf_ext.jit:masked_mean", "tf_ext.padding:masked_mean"),
  ("tf_ext.jit.function:padded_extent", "tf_ext.padding:padded_extent"),
  ("tf_ext.dynamic_embedding.variable:tables", "tf_ext.dynamic_embedding.live_tables:tables"),
  (
    "tf_ext:get_dynamic_embedding_variable",
    "tf_ext.dynamic_embedding.get_or_create:get_dynamic_embedding_variable",
  ),
]


def resolve(path):
  module, _, attribute = path.partition(":")
  found = importlib.import_module(module)
  return getattr(found, attribute) if attribute else found


@pytest.mark.parametrize("old,home", MOVED)
def test_an_old_path_gives_the_object_of_its_new_home(old, home):
  assert resolve(old) is resolve(home)


def test_the_old_paths_import_first_in_a_fresh_process():
  program = (
    "import tf_ext.keras.layers, tf_ext.train.lifecycle_hooks, tf_ext.saved_model.serving\n"
    "from tf_ext.feature_column.columns import DynamicEmbeddingColumn\n"
    "from tf_ext.graph_optimizations import enable\n"
    "import tf_ext\n"
    "assert tf_ext.keras.layers.DynamicEmbedding.__module__ == "
    "'tf_ext.dynamic_embedding.keras.layers'\n"
    "assert tf_ext.graph_optimizations is tf_ext.graph\n"
  )
  proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]

"""Dynamic embedding tables split across real ranks (distribution="alltoall"): training equals one
process on the global batch; bad arguments and mismatched ranks give clear errors."""

import re

import pytest
import tensorflow as tf
from _launch import assert_ok, horovodrun

import tf_ext


def _run(mode, ranks=2, **env):
  proc = horovodrun("_worker_alltoall.py", ranks=ranks, timeout=300, MODE=mode, **env)
  assert_ok(proc)
  summaries = re.findall(r"rank \d+: (\d+) cases, 0 failures", proc.stdout)
  assert len(summaries) == ranks and all(int(n) > 0 for n in summaries), proc.stdout
  return proc


def test_tape_training_on_two_ranks_equals_one_process_for_every_optimizer_and_string_keys():
  _run("tape")


def test_tape_training_on_four_ranks_equals_one_process():
  _run("tape4", ranks=4)


def test_keras_fit_on_two_ranks_equals_one_process_for_every_optimizer():
  _run("keras")


def test_tf1_session_training_with_horovods_v1_optimizer_in_either_order_equals_one_process(
  tmp_path,
):
  _run("tf1", CHECKPOINT_DIR=tmp_path)


def test_lightcc_reduce_stage_leaves_the_table_gradients_to_the_all_to_all():
  _run("lightcc")


def test_checkpoints_of_two_ranks_restore_into_two_four_and_one_process(tmp_path):
  _run("checkpoint", CHECKPOINT_DIR=tmp_path)
  _run("reshard", ranks=4, CHECKPOINT_DIR=tmp_path)


def test_ranks_that_create_the_table_with_different_dims_get_an_error_naming_them():
  proc = _run("mismatch")
  assert "every rank must build the same table" in proc.stdout


def test_alltoall_with_num_shards_is_a_value_error():
  with pytest.raises(ValueError, match="cannot be combined with num_shards"):
    tf_ext.get_dynamic_embedding_variable("both", 4, num_shards=2, distribution="alltoall")
  with pytest.raises(ValueError, match="cannot be combined with num_shards"):
    tf_ext.keras.layers.DynamicEmbedding(4, num_shards=2, distribution="alltoall")
  column = tf.feature_column.categorical_column_with_identity("id", 10)
  with pytest.raises(ValueError, match="cannot be combined with num_shards"):
    tf_ext.feature_column.dynamic_embedding_column(column, 4, num_shards=2, distribution="alltoall")


def test_an_unknown_distribution_is_a_value_error():
  with pytest.raises(ValueError, match="distribution must be None or 'alltoall'"):
    tf_ext.get_dynamic_embedding_variable("unknown", 4, distribution="allgather")


def test_alltoall_before_hvd_init_is_a_clear_error():
  with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
    tf_ext.get_dynamic_embedding_variable("early", 4, distribution="alltoall")
  with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
    tf_ext.dynamic_embedding([1, 2], 4, "early_functional", distribution="alltoall")
  with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
    tf_ext.keras.layers.DynamicEmbedding(4, distribution="alltoall")
  column = tf.feature_column.categorical_column_with_identity("id", 10)
  with pytest.raises(RuntimeError, match=r"call hvd.init\(\)"):
    tf_ext.feature_column.dynamic_embedding_column(column, 4, distribution="alltoall")


def test_the_keras_layer_and_the_column_keep_their_distribution_in_their_configs():
  layer = tf_ext.keras.layers.DynamicEmbedding(4)
  assert layer.get_config()["distribution"] is None
  config = dict(layer.get_config(), distribution="alltoall")
  # A config that asks for it (Keras wraps the layer's error in its own).
  with pytest.raises(Exception, match=r"call hvd.init\(\)"):
    tf_ext.keras.layers.DynamicEmbedding.from_config(config)
  column = tf_ext.feature_column.dynamic_embedding_column(
    tf.feature_column.categorical_column_with_identity("id", 10), 4
  )
  assert column.get_config()["distribution"] is None


def test_admission_eviction_and_loss_aware_precision_on_split_tables_equal_one_process():
  proc = _run("policies")
  # Ranks that train the table with different optimizers get an error naming them.
  assert "every rank must build the same table with the same optimizer" in proc.stdout


def test_a_serving_export_by_every_rank_or_by_one_process_holds_every_ranks_rows(tmp_path):
  _run("serving", CHECKPOINT_DIR=tmp_path)
  _run("serving_one", ranks=1, CHECKPOINT_DIR=tmp_path)


def test_a_rank_that_dies_mid_step_fails_the_survivor_and_the_checkpoint_restores(tmp_path):
  # Rank 1 exits inside a step; rank 0, waiting in the step's all-to-all (and ignoring the
  # launcher's SIGTERM), gets Horovod's error from the step instead of a hang (the launch's
  # timeout would catch one).
  proc = horovodrun(
    "_worker_alltoall.py", ranks=2, timeout=240, MODE="die", CHECKPOINT_DIR=tmp_path
  )
  assert proc.returncode != 0
  assert "rank 0: saved" in proc.stdout and "rank 1: saved" in proc.stdout, proc.stdout
  assert re.search(
    r"rank 0: the step failed after [\d.]+ s: .*Horovod has been shut down", proc.stdout
  ), proc.stdout[-4000:]
  # The survivor and a replacement restore the checkpoint saved before the death.
  _run("replaced", CHECKPOINT_DIR=tmp_path)


def test_an_estimator_with_a_split_table_trains_saves_and_predicts_as_one_process(tmp_path):
  _run("estimator", CHECKPOINT_DIR=tmp_path)


def test_delta_checkpoints_of_two_ranks_restore_into_two_one_and_four_and_from_one_process(
  tmp_path,
):
  _run("delta", CHECKPOINT_DIR=tmp_path)
  _run("delta_reshard", ranks=1, CHECKPOINT_DIR=tmp_path)  # also saves one process's
  _run("delta_reshard", ranks=4, CHECKPOINT_DIR=tmp_path)

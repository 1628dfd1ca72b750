"""Dynamic embedding tables split across real ranks (distribution="alltoall"): training equals one
process on the global batch; bad arguments and mismatched ranks give clear errors."""

import re

import pytest
import tensorflow as tf
from _launch import Case, assert_ok, horovodrun, selected_tests, shared_run

import tf_ext

T_CHECKPOINTS = "test_checkpoints_of_two_ranks_restore_into_two_four_and_one_process"
T_SERVING = "test_a_serving_export_by_every_rank_or_by_one_process_holds_every_ranks_rows"
T_DIE = "test_a_rank_that_dies_mid_step_fails_the_survivor_and_the_checkpoint_restores"
T_DELTA = "test_delta_checkpoints_of_two_ranks_restore_into_two_one_and_four_and_from_one_process"


class Runs:
  """The file's rank programs: one horovodrun per number of ranks (2, then 1, then 4: the later
  ones read the checkpoints the 2 ranks wrote), after the run in which a rank dies (its own)."""

  def __init__(self, request, tmp_path_factory):
    self.dirs = {
      name: tmp_path_factory.mktemp(name)
      for name in ("tf1", "checkpoint", "serving", "die", "estimator", "delta")
    }
    self.died = None

    def case(mode, tests, directory=None):
      config = {"mode": mode}
      if directory:
        config["checkpoint_dir"] = str(self.dirs[directory])
      return Case(mode, "_worker_alltoall.py", config, tests=tests, timeout=300)

    two = [
      case(
        "tape",
        "test_tape_training_on_two_ranks_equals_one_process_for_every_optimizer_and_string_keys",
      ),
      case("keras", "test_keras_fit_on_two_ranks_equals_one_process_for_every_optimizer"),
      case("lightcc", "test_lightcc_reduce_stage_leaves_the_table_gradients_to_the_all_to_all"),
      case("checkpoint", T_CHECKPOINTS, "checkpoint"),
      case(
        "mismatch", "test_ranks_that_create_the_table_with_different_dims_get_an_error_naming_them"
      ),
      case(
        "policies",
        "test_admission_eviction_and_loss_aware_precision_on_split_tables_equal_one_process",
      ),
      case("serving", T_SERVING, "serving"),
      case(
        "estimator",
        "test_an_estimator_with_a_split_table_trains_saves_and_predicts_as_one_process",
        "estimator",
      ),
      case("delta", T_DELTA, "delta"),
      case("replaced", T_DIE, "die"),  # restores what MODE=die saved
      # Disables eager execution: the last case of its processes.
      case(
        "tf1",
        "test_tf1_session_training_with_horovods_v1_optimizer_in_either_order_equals_one_process",
        "tf1",
      ),
    ]
    one = [
      case("serving_one", T_SERVING, "serving"),
      case("delta_reshard", T_DELTA, "delta"),  # also saves one process's
    ]
    four = [
      case("tape4", "test_tape_training_on_four_ranks_equals_one_process"),
      case("reshard", T_CHECKPOINTS, "checkpoint"),
      case("delta_reshard", T_DELTA, "delta"),
    ]
    after_die = [self.die] if T_DIE in selected_tests(request) else []
    self.two = shared_run(request, tmp_path_factory, two, ranks=2, after=after_die)
    self.one = shared_run(request, tmp_path_factory, one, ranks=1, after=[self.two])
    self.four = shared_run(request, tmp_path_factory, four, ranks=4, after=[self.two, self.one])
    self.by_ranks = {1: self.one, 2: self.two, 4: self.four}

  def die(self):
    """Rank 1 exits inside a step (a run of its own: the rank's death ends it)."""
    if self.died is None:
      self.died = horovodrun(
        "_worker_alltoall.py", ranks=2, timeout=240, MODE="die", CHECKPOINT_DIR=self.dirs["die"]
      )
    return self.died


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
  return Runs(request, tmp_path_factory)


def _run(runs, mode, ranks=2):
  proc = runs.by_ranks[ranks].result(mode)
  assert_ok(proc)
  summaries = re.findall(r"rank \d+: (\d+) cases, 0 failures", proc.stdout)
  assert len(summaries) == ranks and all(int(n) > 0 for n in summaries), proc.stdout
  return proc


def test_tape_training_on_two_ranks_equals_one_process_for_every_optimizer_and_string_keys(runs):
  _run(runs, "tape")


def test_tape_training_on_four_ranks_equals_one_process(runs):
  _run(runs, "tape4", ranks=4)


def test_keras_fit_on_two_ranks_equals_one_process_for_every_optimizer(runs):
  _run(runs, "keras")


def test_tf1_session_training_with_horovods_v1_optimizer_in_either_order_equals_one_process(runs):
  _run(runs, "tf1")


def test_lightcc_reduce_stage_leaves_the_table_gradients_to_the_all_to_all(runs):
  _run(runs, "lightcc")


def test_checkpoints_of_two_ranks_restore_into_two_four_and_one_process(runs):
  _run(runs, "checkpoint")
  _run(runs, "reshard", ranks=4)


def test_ranks_that_create_the_table_with_different_dims_get_an_error_naming_them(runs):
  proc = _run(runs, "mismatch")
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


def test_admission_eviction_and_loss_aware_precision_on_split_tables_equal_one_process(runs):
  proc = _run(runs, "policies")
  # Ranks that train the table with different optimizers get an error naming them.
  assert "every rank must build the same table with the same optimizer" in proc.stdout


def test_a_serving_export_by_every_rank_or_by_one_process_holds_every_ranks_rows(runs):
  _run(runs, "serving")
  _run(runs, "serving_one", ranks=1)


def test_a_rank_that_dies_mid_step_fails_the_survivor_and_the_checkpoint_restores(runs):
  # Rank 1 exits inside a step; rank 0, waiting in the step's all-to-all (and ignoring the
  # launcher's SIGTERM), gets Horovod's error from the step instead of a hang (the launch's
  # timeout would catch one).
  proc = runs.die()
  assert proc.returncode != 0
  assert "rank 0: saved" in proc.stdout and "rank 1: saved" in proc.stdout, proc.stdout
  assert re.search(
    r"rank 0: the step failed after [\d.]+ s: .*Horovod has been shut down", proc.stdout
  ), proc.stdout[-4000:]
  # The survivor and a replacement restore the checkpoint saved before the death.
  _run(runs, "replaced")


def test_an_estimator_with_a_split_table_trains_saves_and_predicts_as_one_process(runs):
  _run(runs, "estimator")


def test_delta_checkpoints_of_two_ranks_restore_into_two_one_and_four_and_from_one_process(
  runs,
):
  _run(runs, "delta")
  _run(runs, "delta_reshard", ranks=1)  # also saves one process's
  _run(runs, "delta_reshard", ranks=4)

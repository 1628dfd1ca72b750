"""Admission, eviction and statistics of dynamic embedding tables, in every training mode.

Eager and tf.function (GradientTape, Keras fit with callbacks), TF1 Session,
MonitoredTrainingSession and Estimator (with tf_ext.train hooks).
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext.dynamic_embedding import lifecycle


def _train_steps(table, batches, optimizer=None, use_function=False):
  """One optimizer step per batch of ids, loss = sum of the looked-up rows."""
  optimizer = optimizer or tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))

  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(table.lookup(ids))
    grads = tape.gradient(loss, [table.gradient_anchor])
    optimizer.apply_gradients(zip(grads, [table.gradient_anchor]))

  run = tf.function(step) if use_function else step
  for ids in batches:
    run(tf.constant(ids, tf.int64))
  return optimizer


def _stats(table):
  return {k: v.numpy().item() for k, v in table.statistics().items()}


def _keys(table):
  return sorted(table.export()[0].numpy().tolist())


# ---- admission --------------------------------------------------------------------------------


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("use_function", [False, True])
def test_an_id_gets_a_row_at_its_min_count_th_update(exact, use_function):
  admission = tf_ext.FrequencyAdmission(3, exact=exact)
  table = tf_ext.get_dynamic_embedding_variable(
    f"admit_{exact}_{use_function}", 4, initializer=0.5, admission=admission
  )
  before = table.lookup([7]).numpy()
  _train_steps(table, [[7, 8], [7]], use_function=use_function)
  # Two updates of 7, one of 8: no rows yet, the gradients were dropped, rows read initial values.
  assert int(table.size()) == 0
  np.testing.assert_array_equal(table.lookup([7]).numpy(), before)
  _train_steps(table, [[7, 8]], use_function=use_function)
  assert _keys(table) == [7]  # its third update: admitted and trained (0.5 - 0.1)
  np.testing.assert_allclose(table.lookup([7]).numpy(), [[0.4] * 4], rtol=1e-6)
  np.testing.assert_array_equal(table.lookup([8]).numpy(), [[0.5] * 4])
  stats = _stats(table)
  assert (stats["admitted"], stats["rejected"], stats["size"]) == (1, 4, 1)


@pytest.mark.parametrize(
  "make_optimizer",
  [
    lambda: tf.keras.optimizers.SGD(0.1),
    lambda: tf.keras.optimizers.Adagrad(0.1),
    lambda: tf.keras.optimizers.Adam(0.1),
    lambda: tf.keras.optimizers.legacy.Adam(0.1),
  ],
)
def test_admission_works_with_each_optimizer(make_optimizer):
  table = tf_ext.get_dynamic_embedding_variable(
    "admit_opt", 4, initializer="zeros", admission=tf_ext.FrequencyAdmission(2)
  )
  optimizer = tf_ext.DynamicEmbeddingOptimizer(make_optimizer())
  _train_steps(table, [[1, 2], [1]], optimizer)
  assert _keys(table) == [1]
  # The row was created at its second update and moved by exactly that one update.
  slots = table.export_with_slots()[2].numpy()
  assert table.export_with_slots()[3].numpy().tolist() == [1]  # one update counted
  assert np.all(table.lookup([1]).numpy() < 0)
  assert slots.shape[0] == 1


def test_admission_in_a_monitored_training_session():
  with tf.Graph().as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    table = tf_ext.get_dynamic_embedding_variable(
      "admit_graph", 2, initializer="zeros", admission=tf_ext.FrequencyAdmission(2)
    )
    loss = tf.reduce_sum(table.lookup(ids))
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf_ext.DynamicEmbeddingOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(1.0)
    ).minimize(loss, global_step=step)
    size = table.size()
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
      sess.run(train, {ids: [1, 2, 3]})
      assert sess.run(size) == 0
      sess.run(train, {ids: [1, 3]})
      assert sess.run(size) == 2


def test_sketch_never_admits_late_and_rarely_early_on_a_zipf_stream():
  rng = np.random.default_rng(0)
  stream = rng.zipf(1.3, 60_000) % 5_000
  sketch = tf_ext.get_dynamic_embedding_variable(
    "zipf_sketch",
    1,
    admission=tf_ext.FrequencyAdmission(5, sketch_bytes=4096 * 4 * 4),
  )
  exact = tf_ext.get_dynamic_embedding_variable(
    "zipf_exact", 1, admission=tf_ext.FrequencyAdmission(5, exact=True)
  )
  for batch in np.split(stream, 60):
    unique = np.unique(batch)  # one update per distinct id per step, as the optimizer sends
    _train_steps(sketch, [unique])
    _train_steps(exact, [unique])
  admitted_by_sketch, admitted_exactly = set(_keys(sketch)), set(_keys(exact))
  assert admitted_exactly <= admitted_by_sketch  # never late
  assert len(admitted_by_sketch - admitted_exactly) <= 0.05 * len(admitted_exactly)


# ---- eviction ---------------------------------------------------------------------------------


def _trained_table(name, policy, **kwargs):
  """Rows 1..6 at Keras optimizer steps 0..5: row 1 updated once (step 0), row k twice (last at
  step k - 1)."""
  table = tf_ext.get_dynamic_embedding_variable(name, 2, initializer=1.0, eviction=policy, **kwargs)
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01))
  _train_steps(table, [[1, 2, 3, 4, 5, 6]] + [[k] for k in range(2, 7)], optimizer)
  return table, optimizer


def test_ttl_evicts_rows_not_updated_for_ttl_steps():
  table, _ = _trained_table("ttl", tf_ext.EvictionPolicy(ttl_steps=3))
  # The optimizer's steps are 0..5: row 1 last at 0, row k at k - 1. Now = 5 (the latest step).
  assert int(table.evict()) == 3  # idle >= 3: rows 1 (5), 2 (4), 3 (3)
  assert _keys(table) == [4, 5, 6]
  assert int(table.evict(step=6)) == 1  # row 4 (idle 3); row 5 (idle 2) stays
  assert _stats(table)["evicted"] == 4


def test_min_frequency_judges_rows_once_their_window_passed():
  policy = tf_ext.EvictionPolicy(min_frequency=2, frequency_window_steps=2)
  table, _ = _trained_table("freq", policy)
  # Row 1 has 1 update; rows 2..6 have 2. Row 1 is judged (idle 5 >= 2) and goes.
  assert int(table.evict()) == 1
  assert _keys(table) == [2, 3, 4, 5, 6]


def test_min_l2_norm_evicts_small_rows_with_their_slots():
  table = tf_ext.get_dynamic_embedding_variable(
    "norm", 2, initializer="zeros", eviction=tf_ext.EvictionPolicy(min_l2_norm=0.5)
  )
  table.insert([1, 2, 3], [[0.1, 0.1], [3.0, 4.0], [0.3, 0.3]])
  _train_steps(table, [[2]], tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)))
  assert int(table.evict()) == 2
  assert _keys(table) == [2]
  keys, _, slots, counts, _, _ = table.export_with_slots()
  assert slots.shape == (1, 4) and counts.numpy().tolist() == [1]
  # A re-created row starts afresh: no slots carried over from the evicted row.
  table.insert([1], [[5.0, 5.0]])
  exported = dict(zip(table.export_with_slots()[0].numpy(), table.export_with_slots()[2].numpy()))
  np.testing.assert_array_equal(exported[1], np.zeros(4))


def test_max_size_evicts_the_least_recently_updated():
  table, _ = _trained_table("lru", tf_ext.EvictionPolicy(max_size=4))
  assert int(table.evict()) == 2
  assert _keys(table) == [3, 4, 5, 6]
  assert int(table.evict()) == 0


def test_eviction_hook_in_monitored_training_session_and_estimator(tmp_path):
  with tf.Graph().as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    table = tf_ext.get_dynamic_embedding_variable(
      "hook_table", 2, eviction=tf_ext.EvictionPolicy(ttl_steps=2)
    )
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
      tf.reduce_sum(table.lookup(ids)), global_step=step
    )
    size = table.size()
    hook = tf_ext.train.EvictionHook(every_n_steps=2)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      sess.run(train, {ids: [1, 2, 3]})  # step 0
      for _ in range(4):
        sess.run(train, {ids: [3]})  # steps 1..4
      assert hook.total_evicted == {"hook_table": 2}
      assert sess.run(size) == 1

  def input_fn():
    first = tf.data.Dataset.from_tensors({"ids": tf.constant([1, 2, 3], tf.int64)})
    rest = tf.data.Dataset.from_tensors({"ids": tf.constant([3], tf.int64)}).repeat(5)
    return first.concatenate(rest).map(lambda f: (f, tf.zeros([tf.size(f["ids"])])))

  def model_fn(features, labels, mode):
    del labels
    emb = tf_ext.dynamic_embedding(
      features["ids"], 2, name="est_evict", eviction=tf_ext.EvictionPolicy(ttl_steps=2)
    )
    loss = tf.reduce_sum(emb)
    train_op = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  estimator_hook = tf_ext.train.EvictionHook(every_n_steps=3)
  tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "est")).train(
    input_fn, hooks=[estimator_hook]
  )
  assert estimator_hook.total_evicted == {"est_evict": 2}


def _keras_model(name, **policies):
  ids = tf.keras.Input(shape=(), dtype=tf.int64)
  emb = tf_ext.keras.layers.DynamicEmbedding(4, name=name, **policies)(ids)
  model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(emb))
  model.compile(tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)), "mse")
  return model


def test_keras_callbacks_evict_and_write_statistics(tmp_path):
  model = _keras_model(
    "keras_lifecycle",
    admission=tf_ext.FrequencyAdmission(2, exact=True),
    eviction=tf_ext.EvictionPolicy(ttl_steps=4),
  )
  ids = np.array([1, 2, 3, 4] + [5] * 12, np.int64)
  eviction = tf_ext.keras.callbacks.TableEviction(every_n_steps=4)
  statistics = tf_ext.keras.callbacks.TableStatistics(str(tmp_path), every_n_steps=2)
  model.fit(
    ids,
    np.zeros(16),
    batch_size=2,
    epochs=2,
    shuffle=False,
    verbose=0,
    callbacks=[eviction, statistics],
  )
  table = model.get_layer("keras_lifecycle").table
  # Ids 1..4 appear once per epoch (twice in all): admitted in epoch 2, then idle and evicted.
  assert _keys(table) == [5]
  stats = statistics.last_statistics["keras_lifecycle"]
  assert stats["evicted"] == 4 and stats["admitted"] == 5 and stats["rejected"] == 5
  assert stats["lookups"] >= 32
  tags = set()
  for path in glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  assert {"keras_lifecycle/size", "keras_lifecycle/lookup_hit_rate"} <= tags
  config = model.get_layer("keras_lifecycle").get_config()
  rebuilt = tf_ext.keras.layers.DynamicEmbedding.from_config(config)
  assert rebuilt.admission == tf_ext.FrequencyAdmission(2, exact=True)
  assert rebuilt.eviction == tf_ext.EvictionPolicy(ttl_steps=4)


def test_keras_eviction_takes_the_step_after_the_batch_as_now_as_the_session_hook_does():
  model = _keras_model("keras_evict_now", eviction=tf_ext.EvictionPolicy(ttl_steps=2))
  table = model.get_layer("keras_evict_now").table
  eviction = tf_ext.keras.callbacks.TableEviction(every_n_steps=2, tables=[table])
  # Ids 1 and 2 are updated at step 0, id 3 at step 1; after the second batch the step is 2, so
  # 1 and 2 have been idle for 2 steps (EvictionHook's "now" is that global step too).
  model.fit(
    np.array([1, 2, 3, 3], np.int64), np.zeros(4), batch_size=2, shuffle=False, verbose=0,
    callbacks=[eviction],
  )  # fmt: skip
  assert eviction.last_evicted == {"keras_evict_now": 2}
  assert _keys(table) == [3]


def test_statistics_hook_writes_summaries_in_a_session(tmp_path):
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable("stats_graph", 2)
    lookup = table.lookup(tf.constant([1, 2], tf.int64))
    insert = table.insert(tf.constant([1], tf.int64), tf.ones([1, 2]))
    tf.compat.v1.train.get_or_create_global_step()
    increment = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
    hook = tf_ext.train.TableStatisticsHook(str(tmp_path), every_n_steps=1)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      sess.run(insert)
      sess.run([lookup, increment])
      sess.run(increment)  # the hook runs after a step that moved the global step
    stats = hook.last_statistics["stats_graph"]
    assert (stats["size"], stats["lookups"], stats["lookup_hits"]) == (1, 2, 1)
    assert stats["lookup_hit_rate"] == pytest.approx(0.5)
    assert stats["bytes"] > 0
  (events,) = glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*"))
  values = {
    v.tag: v.simple_value
    for e in tf.compat.v1.train.summary_iterator(events)
    for v in e.summary.value
  }
  assert values["stats_graph/lookup_hit_rate"] == pytest.approx(0.5)


class _IncrementAfterRun(tf.compat.v1.train.SessionRunHook):
  """Moves the global step after each run, before the later hooks' after_run: the step they
  fetched with the run is one behind, as when the read races ahead of a training op's increment."""

  def __init__(self, increment):
    self._increment = increment

  def after_run(self, run_context, run_values):
    del run_values
    run_context.session.run(self._increment)


class _RecordingEvictionHook(tf_ext.train.EvictionHook):
  def __init__(self, every_n_steps):
    super().__init__(every_n_steps)
    self.steps, self.evicted = [], []

  def _handle(self, step, results):
    self.steps.append(step)
    super()._handle(step, results)
    self.evicted.append(sum(self.last_evicted.values()))


def test_table_hooks_run_at_the_global_step_the_run_left_not_the_one_fetched_with_it(tmp_path):
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable(
      "stale_step_table", 2, eviction=tf_ext.EvictionPolicy(ttl_steps=100)
    )
    lookup = table.lookup(tf.constant([1, 2], tf.int64))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    increment = tf.compat.v1.assign_add(global_step, 1)
    eviction = _RecordingEvictionHook(every_n_steps=2)
    statistics = tf_ext.train.TableStatisticsHook(str(tmp_path), every_n_steps=2)
    hooks = [_IncrementAfterRun(increment), eviction, statistics]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
      for _ in range(6):
        sess.run(lookup)  # the global step after the runs: 1, 2, ..., 6
  # Every 2 global steps from the session's start, each read after its run: 2, 4, 6 (the steps
  # fetched with the runs are one behind).
  assert eviction.steps == [2, 4, 6]
  (events,) = glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*"))
  written = {e.step for e in tf.compat.v1.train.summary_iterator(events) if e.summary.value}
  assert written == {2, 4, 6}


class _DeltaCheckpointAt(tf_ext.train.DeltaCheckpointHook):
  """Records the steps the delta-checkpoint hook saves at, without the extra save at the end."""

  def __init__(self, directory, every_n_steps):
    super().__init__(directory, every_n_steps=every_n_steps, dense=False)
    self.steps = []

  def end(self, session):
    self.steps = [s["step"] for s in self.saved]
    super().end(session)


def test_table_hooks_run_where_the_delta_checkpoint_hook_saves_at_the_step_they_read(tmp_path):
  with tf.Graph().as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    table = tf_ext.get_dynamic_embedding_variable(
      "scheduled_table", 2, eviction=tf_ext.EvictionPolicy(ttl_steps=3)
    )
    # The session starts at global step 5 (as after a restore): periods count from there.
    step = tf.compat.v1.get_variable(
      "global_step",
      [],
      tf.int64,
      tf.compat.v1.constant_initializer(5),
      trainable=False,
      collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.GLOBAL_STEP],
    )
    train = tf_ext.DynamicEmbeddingOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1)
    ).minimize(tf.reduce_sum(table.lookup(ids)), global_step=step)
    checkpoints = _DeltaCheckpointAt(tmp_path / "chain", every_n_steps=3)
    eviction = _RecordingEvictionHook(every_n_steps=3)
    statistics = tf_ext.train.TableStatisticsHook(str(tmp_path), every_n_steps=3)
    hooks = [checkpoints, eviction, statistics]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
      sess.run(train, {ids: [1, 2]})  # rows 1 and 2 record step 5; the global step becomes 6
      for _ in range(6):
        sess.run(train, {ids: [2]})  # steps 6..11: the global step becomes 7..12
  assert checkpoints.steps == [8, 11]
  # Row 1, last updated at step 5, is exactly ttl_steps old at step 8: evicted then. (The table's
  # latest update, step 7, would keep it one period longer.)
  assert list(zip(eviction.steps, eviction.evicted)) == [(8, 1), (11, 0)]
  (events,) = glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*"))
  lookups = {
    e.step: v.simple_value
    for e in tf.compat.v1.train.summary_iterator(events)
    for v in e.summary.value
    if v.tag == "scheduled_table/lookups"
  }
  assert lookups == {8: 4, 11: 7}  # ids looked up by the steps before: 2, then 1 a step


def test_eviction_hook_ages_the_rows_of_a_table_that_steps_do_not_train():
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable(
      "idle_table", 2, eviction=tf_ext.EvictionPolicy(ttl_steps=2)
    )
    step = tf.compat.v1.train.get_or_create_global_step()
    train = tf_ext.DynamicEmbeddingOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1)
    ).minimize(tf.reduce_sum(table.lookup(tf.constant([1], tf.int64))), global_step=step)
    other_step = tf.compat.v1.assign_add(step, 1)  # a step that trains other variables only
    hook = tf_ext.train.EvictionHook(every_n_steps=2)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      sess.run(train)  # row 1 records step 0
      for _ in range(3):
        sess.run(other_step)
  # At global step 2 row 1 is 2 steps old, although the table's latest update is still step 0.
  assert hook.total_evicted == {"idle_table": 1}


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "kwargs, parameter",
  [
    ({"admission": tf_ext.FrequencyAdmission(0)}, "min_count"),
    ({"admission": tf_ext.FrequencyAdmission(-2)}, "min_count"),
    ({"admission": tf_ext.FrequencyAdmission(2, sketch_bytes=100)}, "sketch_bytes"),
    ({"admission": tf_ext.FrequencyAdmission(2, sketch_depth=0)}, "sketch_depth"),
    ({"eviction": tf_ext.EvictionPolicy(ttl_steps=0)}, "ttl_steps"),
    ({"eviction": tf_ext.EvictionPolicy(ttl_steps=-5)}, "ttl_steps"),
    ({"eviction": tf_ext.EvictionPolicy(max_size=0)}, "max_size"),
    ({"eviction": tf_ext.EvictionPolicy(min_frequency=1.5)}, "min_frequency"),
    ({"eviction": tf_ext.EvictionPolicy(min_l2_norm=-1.0)}, "min_l2_norm"),
    ({"eviction": tf_ext.EvictionPolicy()}, "at least one"),
    ({"eviction": {"ttl_steps": 3}}, "tf_ext.EvictionPolicy"),
    ({"admission": tf_ext.FrequencyAdmission(2), "trainable": False}, "not trainable"),
    ({"eviction": tf_ext.EvictionPolicy(ttl_steps=3), "trainable": False}, "not trainable"),
  ],
)
def test_bad_policies_are_value_errors_naming_table_and_parameter(kwargs, parameter):
  with pytest.raises(ValueError, match=f"table 'bad_policy'.*{parameter}"):
    tf_ext.get_dynamic_embedding_variable("bad_policy", 2, **kwargs)


def test_policies_on_keras_layers_are_checked_too():
  with pytest.raises(ValueError, match="table 'bad_layer'.*max_size"):
    tf_ext.keras.layers.DynamicEmbedding(
      2, name="bad_layer", eviction=tf_ext.EvictionPolicy(max_size=-1)
    )


def test_evict_without_a_policy_and_hooks_on_tables_without_one_are_clear_errors():
  table = tf_ext.get_dynamic_embedding_variable("no_policy", 2)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'no_policy'.*eviction policy"):
    table.evict()
  with pytest.raises(ValueError, match="every_n_steps"):
    tf_ext.train.EvictionHook(every_n_steps=0)
  with pytest.raises(ValueError, match="'no_policy' has no eviction policy"):
    lifecycle.check_evictable("EvictionHook", [table])


def test_the_kernels_reject_bad_policies_that_bypass_python():
  library = tf_ext._ops_loader.load()
  table = tf_ext.get_dynamic_embedding_variable("raw_policy", 2)
  with pytest.raises(tf.errors.InvalidArgumentError, match="must be >= 0"):
    library.tf_ext_table_evict(table.resource_handle, tf.constant(-1, tf.int64), ttl_steps=-1)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'raw_admission'.*min_count"):
    library.tf_ext_dynamic_table(
      table_name="raw_admission", key_dtype=tf.int64, dim=2, admission_min_count=-1
    )

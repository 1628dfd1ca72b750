"""Admission state in checkpoints: an id counted k < min_count times before a save is admitted
after a restore at exactly its (min_count - k)-th further update, through every checkpoint path
(tf.train.Checkpoint, Saver, delta chains, sharded tables restored into any number of shards),
for the count-min sketch and exact counters."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ext

DIM = 2
MIN_COUNT = 5
# Ids and the updates each gets before the save: 1 to 4, all below MIN_COUNT.
IDS = np.array([3, 17, 40, 58, 71, 96, 1001, 10**12, -5, 2**40], np.int64)
COUNTS = 1 + np.arange(len(IDS)) % (MIN_COUNT - 1)


def _table(name, exact, num_shards=None):
  return tf_ext.get_dynamic_embedding_variable(
    name,
    DIM,
    initializer="zeros",
    num_shards=num_shards,
    admission=tf_ext.FrequencyAdmission(MIN_COUNT, exact=exact),
  )


def _variable(name, exact):
  """A new table object even where one of this name exists (as in a new process)."""
  return tf_ext.DynamicEmbeddingVariable(
    name, DIM, initializer="zeros", admission=tf_ext.FrequencyAdmission(MIN_COUNT, exact=exact)
  )


def _variables(table):
  return list(getattr(table, "gradient_anchors", None) or [table.gradient_anchor])


def _update(table, ids):
  """One SGD step over `ids` (each id's update is counted by the table's admission)."""
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
  variables = _variables(table)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(table.lookup(tf.constant(ids, tf.int64)))
  optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _count(table, counts):
  """Updates IDS[i] counts[i] times (none reaches MIN_COUNT)."""
  for round_ in range(int(np.max(counts))):
    _update(table, IDS[counts > round_])
  assert int(table.size()) == 0


def _keys(table):
  return sorted(table.export()[0].numpy().tolist())


def _assert_admitted_exactly_on_time(table, counts=COUNTS):
  """Updates every id until all are admitted: each must get its row at its
  (MIN_COUNT - counts[i])-th update, not earlier, not later."""
  for further in range(1, MIN_COUNT + 1):
    _update(table, IDS)
    expected = sorted(IDS[counts + further >= MIN_COUNT].tolist())
    assert _keys(table) == expected, f"after {further} further updates"


@pytest.mark.parametrize("exact", [False, True])
def test_checkpoint_restores_the_counts_of_waiting_ids(tmp_path, exact):
  source = _table(f"ck_src_{exact}", exact)
  _count(source, COUNTS)
  path = tf.train.Checkpoint(table=source).write(str(tmp_path / "ckpt"))
  target = _table(f"ck_dst_{exact}", exact)
  _update(target, IDS)  # counts of its own, which the restore replaces
  tf.train.Checkpoint(table=target).read(path).assert_consumed()
  _assert_admitted_exactly_on_time(target)


@pytest.mark.parametrize("exact", [False, True])
def test_saver_restores_the_counts_of_waiting_ids(tmp_path, exact):
  def graph(name):
    table = _table(name, exact)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    train = opt.minimize(tf.reduce_sum(table.lookup(ids)))
    return table, ids, train, tf.compat.v1.train.Saver()

  with tf.Graph().as_default():
    table, ids, train, saver = graph("sv")
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for round_ in range(int(np.max(COUNTS))):
        sess.run(train, {ids: IDS[COUNTS > round_]})
      path = saver.save(sess, str(tmp_path / "ckpt"))
  with tf.Graph().as_default():
    table, ids, train, saver = graph("sv")
    keys = table.export()[0]
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.restore(sess, path)
      for further in range(1, MIN_COUNT + 1):
        sess.run(train, {ids: IDS})
        expected = sorted(IDS[COUNTS + further >= MIN_COUNT].tolist())
        assert sorted(sess.run(keys).tolist()) == expected, f"after {further} further updates"


@pytest.mark.parametrize("exact", [False, True])
def test_a_delta_chain_restores_the_counts_of_its_last_link(tmp_path, exact):
  source = _variable(f"delta_{exact}", exact)
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [source])
  first = np.minimum(COUNTS, 2)
  _count(source, first)
  manager.save(1)  # full: counts up to 2
  _count(source, COUNTS - first)  # every id reaches COUNTS, none is admitted
  manager.save(2)  # delta: the counts as they are now
  assert [link["kind"] for link in manager.links()] == ["full", "delta"]

  target = _variable(f"delta_{exact}", exact)  # tables are matched by name
  tf_ext.DeltaCheckpointManager(tmp_path / "chain", [target]).restore()
  _assert_admitted_exactly_on_time(target)


@pytest.mark.parametrize("exact", [False, True])
def test_a_delta_after_admissions_forgets_the_admitted_ids_counts(tmp_path, exact):
  source = _variable(f"admitted_{exact}", exact)
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [source])
  _count(source, COUNTS)
  manager.save(1)
  _update(source, IDS)  # the ids counted 4 times get their rows
  admitted = IDS[COUNTS + 1 >= MIN_COUNT]
  assert _keys(source) == sorted(admitted.tolist())
  manager.save(2)
  target = _variable(f"admitted_{exact}", exact)
  tf_ext.DeltaCheckpointManager(tmp_path / "chain", [target]).restore()
  assert _keys(target) == sorted(admitted.tolist())
  _assert_admitted_exactly_on_time(target, COUNTS + 1)


@pytest.mark.parametrize("old, new", [(2, 2), (2, 3), (3, None), (None, 2)])
@pytest.mark.parametrize("exact", [False, True])
def test_sharded_tables_restore_counts_into_any_number_of_shards(tmp_path, exact, old, new):
  source = _table(f"sh_src_{exact}_{old}_{new}", exact, old)
  _count(source, COUNTS)
  path = tf.train.Checkpoint(table=source).write(str(tmp_path / "ckpt"))
  target = _table(f"sh_dst_{exact}_{old}_{new}", exact, new)
  tf.train.Checkpoint(table=target).read(path)
  _assert_admitted_exactly_on_time(target)

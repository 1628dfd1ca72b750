"""Sharded tables: routing by id, placement by the device function, training, checkpoints that
restore into any number of shards, the column and the Keras layer, and bad input."""

import json
import socket
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext.dynamic_embedding import checkpoint, sharded

DIM = 4
IDS = np.array([[1, 2, 3], [4, 5, 10**15], [-7, 0, 2**62]], np.int64)


def _pair(name, num_shards, **kwargs):
  """A sharded table and a plain one with the same initializer."""
  kwargs.setdefault("initializer", tf.keras.initializers.RandomNormal(seed=3))
  shards = tf_ext.get_dynamic_embedding_variable(f"{name}_s", DIM, num_shards=num_shards, **kwargs)
  plain = tf_ext.get_dynamic_embedding_variable(f"{name}_p", DIM, **kwargs)
  return shards, plain


def _train(table, variables, opt, steps, seed=0):
  rng = np.random.default_rng(seed)
  for _ in range(steps):
    ids = rng.integers(0, 200, (32, 2))
    labels = rng.normal(size=(32, DIM)).astype(np.float32)
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(table.lookup(ids) - labels[:, None, :]))
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _sorted_export(table):
  keys, values, slots, counts, steps, _ = (x.numpy() for x in table.export_with_slots())
  order = np.argsort(keys)
  return keys[order], values[order], slots[order], counts[order], steps[order]


def test_lookup_matches_a_plain_table_for_every_shape():
  table, plain = _pair("lk", 3)
  assert isinstance(table, tf_ext.ShardedDynamicEmbeddingVariable) and table.num_shards == 3
  assert [s.name for s in table.shards] == ["lk_s/part_0", "lk_s/part_1", "lk_s/part_2"]
  for ids in (IDS, IDS[0], np.int64(5), np.zeros([0, 2], np.int64), IDS.astype(np.int32)):
    got = table.lookup(ids)
    assert got.shape == np.shape(ids) + (DIM,)
    np.testing.assert_array_equal(got.numpy(), plain.lookup(ids).numpy())


def test_string_keys_route_and_combine():
  table, plain = _pair("str", 2, key_dtype=tf.string)
  ragged = tf.ragged.constant([["a", "bb", "ccc"], [], ["user:1"]])
  np.testing.assert_allclose(
    tf_ext.embedding_lookup(table, ragged, combiner="mean").numpy(),
    tf_ext.embedding_lookup(plain, ragged, combiner="mean").numpy(),
  )
  table.insert(["a", "b", "c", "d"], np.ones([4, DIM], np.float32))
  assert sorted(int(s.size()) for s in table.shards) != [0, 4]  # both shards got some
  assert int(table.size()) == 4


def test_training_matches_a_plain_table_and_rows_split_evenly():
  table, plain = _pair("tr", 2)
  for t in (table, plain):
    variables = getattr(t, "gradient_anchors", None) or [t.gradient_anchor]
    _train(t, variables, tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), 5)
  for a, b in zip(_sorted_export(table), _sorted_export(plain)):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  sizes = [int(s.size()) for s in table.shards]
  total = int(plain.size())
  assert sum(sizes) == total > 150
  assert all(abs(size - total / 2) <= 0.15 * total for size in sizes), sizes
  # Each shard holds exactly the ids TfExtShardOf gives it.
  for index, shard in enumerate(table.shards):
    keys = shard.export()[0]
    np.testing.assert_array_equal(table.shard_of(keys).numpy(), np.full(len(keys), index))


def test_insert_remove_export_import_and_statistics():
  table, _ = _pair("ops", 3)
  keys = np.arange(30, dtype=np.int64)
  values = np.arange(30 * DIM, dtype=np.float32).reshape(30, DIM)
  table.insert(keys, values)
  np.testing.assert_array_equal(table.lookup(keys).numpy(), values)
  table.remove(keys[:10])
  assert int(table.size()) == 20
  exported = table.export_with_slots()
  other, _ = _pair("ops2", 2)
  other.import_with_slots(*exported)
  np.testing.assert_array_equal(other.lookup(keys[10:]).numpy(), values[10:])
  stats = {k: v.numpy() for k, v in other.statistics().items()}
  assert stats["size"] == 20 and stats["lookups"] == 20 and stats["lookup_hit_rate"] == 1.0
  assert int(other.memory_bytes()) > 0
  table.clear()
  assert int(table.size()) == 0


def _cluster(ps_tasks):
  return tf.train.ClusterSpec(
    {"ps": [f"127.0.0.1:{2000 + i}" for i in range(ps_tasks)], "worker": ["127.0.0.1:3000"]}
  )


def test_shards_are_placed_round_robin_with_their_updates():
  with tf.Graph().as_default() as graph:
    setter = tf.compat.v1.train.replica_device_setter(cluster=_cluster(2))
    with tf.compat.v1.device(setter):
      table = tf_ext.get_dynamic_embedding_variable("placed", DIM, num_shards=2)
      rows = table.lookup(tf.constant([1, 2, 3], tf.int64))
      loss = tf.reduce_sum(rows)
      opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
      opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  assert table.devices == ["/job:ps/task:0", "/job:ps/task:1"]
  by_type = {}
  for op in graph.get_operations():
    by_type.setdefault(op.type, []).append(op)
  for kind in ("TfExtDynamicTable", "TfExtTableFind", "TfExtTableApplyGradient"):
    devices = sorted(op.device for op in by_type[kind])
    assert devices == ["/job:ps/task:0", "/job:ps/task:1"], (kind, devices)
  assert all(op.device == "/job:worker" for op in by_type["TfExtShardOf"])


def test_more_shards_than_ps_tasks_warns_and_works():
  with tf.Graph().as_default():
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=_cluster(2))):
      with pytest.warns(UserWarning, match="'crowded'.*3 shards on 2 devices.*share"):
        table = tf_ext.get_dynamic_embedding_variable("crowded", DIM, num_shards=3)
  assert table.devices == ["/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:0"]
  with tf.Graph().as_default(), warnings.catch_warnings():
    warnings.simplefilter("error")  # no cluster: no warning
    tf_ext.get_dynamic_embedding_variable("local", DIM, num_shards=3)


# Shards' gradient anchors are local variables (not saved): sessions initialize both kinds.
_INIT = "init_all"


def _graph_model(name, num_shards, ids):
  """A graph with a table (sharded or not), a training op over `ids` and a Saver."""
  table = tf_ext.get_dynamic_embedding_variable(
    name, DIM, num_shards=num_shards, initializer="truncated_normal"
  )
  loss = tf.reduce_sum(tf.square(table.lookup(ids) - 1.0))
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
  train = opt.minimize(loss)
  tf.group(
    tf.compat.v1.global_variables_initializer(),
    tf.compat.v1.local_variables_initializer(),
    name=_INIT,
  )
  return table, train, tf.compat.v1.train.Saver()


@pytest.mark.parametrize("old, new", [(2, 3), (3, 2), (2, 1), (2, None), (None, 3), (2, 2)])
def test_saver_restores_into_any_number_of_shards(tmp_path, old, new):
  ids = np.arange(0, 300, 3, dtype=np.int64)
  with tf.Graph().as_default():
    table, train, saver = _graph_model("emb", old, ids)
    with tf.compat.v1.Session() as sess:
      sess.run(_INIT)
      for _ in range(3):
        sess.run(train)
      path = saver.save(sess, str(tmp_path / "ckpt"))
      expected = sess.run(table.export_with_slots())
  order = np.argsort(expected[0])
  with tf.Graph().as_default():
    table, train, saver = _graph_model("emb", new, ids)
    with tf.compat.v1.Session() as sess:
      sess.run(_INIT)
      saver.restore(sess, path)
      got = sess.run(table.export_with_slots())
      if new is not None:
        sizes = sess.run([s.size() for s in table.shards])
        assert sum(sizes) == len(ids) and min(sizes) > 0
        for index, shard in enumerate(table.shards):
          keys = sess.run(shard.export()[0])
          np.testing.assert_array_equal(sess.run(table.shard_of(keys)), np.full(len(keys), index))
      sess.run(train)  # training goes on
  got_order = np.argsort(got[0])
  for i in range(5):
    np.testing.assert_array_equal(got[i][got_order], expected[i][order])


def test_checkpoint_restores_into_another_number_of_shards(tmp_path):
  table, plain = _pair("ck", 3)
  _train(
    table,
    table.gradient_anchors,
    tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1)),
    3,
  )
  path = tf.train.Checkpoint(table=table).write(str(tmp_path / "ckpt"))
  two, _ = _pair("ck2", 2)
  tf.train.Checkpoint(table=two).read(path)
  tf.train.Checkpoint(table=plain).read(path)
  for other in (two, plain):
    for a, b in zip(_sorted_export(table), _sorted_export(other)):
      np.testing.assert_array_equal(a, b)
  assert [int(s.size()) for s in two.shards] != [0, int(table.size())]


def test_functional_form_column_and_keras_layer_take_num_shards(tmp_path):
  rows = tf_ext.dynamic_embedding(tf.constant([[1, 2]], tf.int64), DIM, "fn", num_shards=2)
  assert rows.shape == (1, 2, DIM)

  layer = tf_ext.keras.layers.DynamicEmbedding(DIM, num_shards=2, combiner="sum", name="kl")
  ids = tf.keras.Input(shape=(None,), dtype=tf.int64, ragged=True)
  model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(layer(ids)))
  model.compile(tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1)), "mse")
  model.fit(tf.ragged.constant([[1, 2], [3], [4, 5, 6]]), np.ones([3, 1]), verbose=0, epochs=2)
  assert layer.table.num_shards == 2 and int(layer.table.size()) == 6
  config = layer.get_config()
  assert config["num_shards"] == 2
  assert tf_ext.keras.layers.DynamicEmbedding.from_config(config).num_shards == 2
  model.save(str(tmp_path / "model.keras"))
  loaded = tf.keras.models.load_model(str(tmp_path / "model.keras"))
  probe = tf.ragged.constant([[1, 2], [6]])
  np.testing.assert_allclose(loaded(probe).numpy(), model(probe).numpy(), rtol=1e-6)
  # Weights saved with 2 shards load into 3 shards (or none).
  for num_shards in (3, None):
    other = tf_ext.keras.layers.DynamicEmbedding(DIM, num_shards=num_shards, combiner="sum")
    dense = tf.keras.layers.Dense(1)
    again = tf.keras.Model(ids, dense(other(ids)))
    again.load_weights(str(tmp_path / "model.keras"))
    np.testing.assert_allclose(again(probe).numpy(), model(probe).numpy(), rtol=1e-6)

  column = tf_ext.feature_column.dynamic_embedding_column(
    tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("item"), DIM, num_shards=2
  )
  assert column.get_config()["num_shards"] == 2
  features = tf.keras.layers.DenseFeatures([column])
  out = features({"item": tf.constant([[1, 2], [3, -1]], tf.int64)})
  assert out.shape == (2, DIM)
  table = features._state_manager.get_resource(column, "table")  # pylint: disable=protected-access
  assert isinstance(table, tf_ext.ShardedDynamicEmbeddingVariable) and table.num_shards == 2
  restored = type(column).from_config(column.get_config())
  assert restored.num_shards == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", 10**6])
def test_bad_num_shards_names_the_table(bad):
  with pytest.raises(tf.errors.InvalidArgumentError, match="'bad_shards'.*num_shards"):
    tf_ext.get_dynamic_embedding_variable("bad_shards", DIM, num_shards=bad)
  with pytest.raises(tf.errors.InvalidArgumentError, match="num_shards"):
    tf_ext.keras.layers.DynamicEmbedding(DIM, num_shards=bad, name="bad_layer")
  with pytest.raises(tf.errors.InvalidArgumentError, match="'c_dynamic_embedding'.*num_shards"):
    tf_ext.feature_column.dynamic_embedding_column(
      tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("c"), DIM, num_shards=bad
    )


def test_get_or_create_checks_num_shards():
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable("again", DIM, num_shards=2)
    assert tf_ext.get_dynamic_embedding_variable("again", DIM, num_shards=2) is table
    with pytest.raises(tf.errors.InvalidArgumentError, match="'again'.*num_shards 2.*3"):
      tf_ext.get_dynamic_embedding_variable("again", DIM, num_shards=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'again'.*num_shards 2.*None"):
      tf_ext.get_dynamic_embedding_variable("again", DIM)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'wide'.*dim"):
    tf_ext.get_dynamic_embedding_variable("wide", 5000, num_shards=2)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'keys'.*must be int64"):
    tf_ext.get_dynamic_embedding_variable("keys", DIM, num_shards=2).lookup(["a"])


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_unreachable_ps_is_a_clear_error_within_the_timeout():
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    reachable = f"127.0.0.1:{listener.getsockname()[1]}"
    unreachable = f"127.0.0.1:{_free_port()}"  # nobody listens there
    start = time.monotonic()
    with pytest.raises(tf.errors.DeadlineExceededError, match=f"/job:ps/task:1 at {unreachable}"):
      tf_ext.wait_for_cluster({"ps": [reachable, unreachable], "worker": ["x:1"]}, timeout_s=2)
    assert time.monotonic() - start < 10
    start = time.monotonic()  # reachable tasks pass at once; other jobs are not checked
    tf_ext.wait_for_cluster({"ps": [reachable], "worker": ["x:1"]}, timeout_s=5)
    assert time.monotonic() - start < 2


def test_table_on_an_unreachable_ps_fails_when_built_not_at_session_start(monkeypatch):
  """Without any call to wait_for_cluster: building a table on a TF_CONFIG task that does not
  answer is an error naming the table and the address within TF_EXT_PS_WAIT_TIMEOUT_S."""
  dead = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
  config = {
    "cluster": {"ps": dead, "worker": ["127.0.0.1:1"]},
    "task": {"type": "worker", "index": 0},
  }
  monkeypatch.setenv("TF_CONFIG", json.dumps(config))
  monkeypatch.setenv("TF_EXT_PS_WAIT_TIMEOUT_S", "2")
  cluster = tf.train.ClusterSpec(config["cluster"])
  start = time.monotonic()
  with tf.Graph().as_default():
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
      with pytest.raises(
        tf.errors.DeadlineExceededError,
        match=f"table 'users/part_0' on /job:ps/task:0.*unreachable after 2 s.*{dead[0]}",
      ):
        tf_ext.get_dynamic_embedding_variable("users", 4, num_shards=2)
  assert time.monotonic() - start < 10
  monkeypatch.setenv("TF_EXT_PS_WAIT_TIMEOUT_S", "0")  # the check off: the graph builds
  with tf.Graph().as_default():
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
      tf_ext.get_dynamic_embedding_variable("users", 4, num_shards=2)


def test_estimator_with_sharded_columns_trains_and_reshards_across_runs(tmp_path):
  """Estimator (Scaffold's sharded Saver, local anchors): train with 2 shards, then go on from
  its checkpoint with 3 shards."""
  rng = np.random.default_rng(0)
  features = {"user": rng.integers(0, 300, (256, 2))}
  labels = (features["user"][:, 0] % 2).astype(np.float32)

  def input_fn():
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat(3).batch(32)

  def estimator(num_shards):
    def model_fn(features, labels, mode):
      column = tf_ext.feature_column.dynamic_embedding_column(
        tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("user"),
        DIM,
        num_shards=num_shards,
      )
      net = tf.compat.v1.feature_column.input_layer(features, [column])
      logits = tf.compat.v1.layers.dense(net, 1)
      loss = tf.compat.v1.losses.sigmoid_cross_entropy(tf.reshape(labels, [-1, 1]), logits)
      opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3))
      train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
      return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))

  estimator(2).train(input_fn)
  first = estimator(2).evaluate(input_fn, steps=4)["loss"]
  assert estimator(3).evaluate(input_fn, steps=4)["loss"] == pytest.approx(first, rel=1e-6)
  estimator(3).train(input_fn)
  assert estimator(3).evaluate(input_fn, steps=4)["loss"] < first


def test_saved_model_round_trip(tmp_path):
  class Model(tf.Module):
    def __init__(self):
      super().__init__()
      self.table = tf_ext.get_dynamic_embedding_variable("served", DIM, num_shards=2)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def __call__(self, ids):
      return self.table.lookup(ids)

  model = Model()
  model.table.insert(np.arange(10), np.ones([10, DIM], np.float32))
  tf.saved_model.save(model, str(tmp_path / "model"))
  loaded = tf.saved_model.load(str(tmp_path / "model"))  # without tf_ext's classes
  ids = tf.constant(np.arange(20), tf.int64)
  np.testing.assert_array_equal(loaded(ids).numpy(), model(ids).numpy())


def test_eviction_runs_in_every_shard():
  table = tf_ext.get_dynamic_embedding_variable(
    "evicted", DIM, num_shards=2, eviction=tf_ext.EvictionPolicy(ttl_steps=10)
  )
  table.insert(np.arange(50), np.ones([50, DIM], np.float32))  # inserted rows have step 0
  assert int(table.evict(step=100)) == 50 and int(table.size()) == 0
  with pytest.raises(tf.errors.InvalidArgumentError, match="evict\\(\\) needs an eviction"):
    tf_ext.get_dynamic_embedding_variable("no_policy", DIM, num_shards=2).evict()


def test_a_missing_shard_file_is_an_error_naming_the_table_and_file(tmp_path):
  table, _ = _pair("lost", 2)
  table.insert(np.arange(10), np.ones([10, DIM], np.float32))
  path = tf.train.Checkpoint(table=table).write(str(tmp_path / "ckpt"))
  suffix = checkpoint.snapshot_suffix("table/part_1")
  (tmp_path / f"ckpt{suffix}").unlink()
  three, _ = _pair("lost3", 3)
  with pytest.raises(tf.errors.NotFoundError, match=f"'lost3_s/part_0'.*ckpt{suffix}"):
    tf.train.Checkpoint(table=three).read(path)
  assert int(three.size()) == 0  # nothing half-restored


@pytest.mark.parametrize(
  "ids",
  [
    np.array([5, 3, 5, 10**15, -7, 3, 0, 2**62, -7], np.int64),
    np.array([b"b", b"", b"a\x00b", b"b", b"user:1", b""], object),
    np.array([], np.int64),
  ],
)
def test_distinct_by_shard_groups_the_distinct_ids_by_their_shard_in_graphs_and_eagerly(ids):
  num_shards = 3
  shards = sharded.shard_of(tf.constant(ids), num_shards).numpy()
  seen, expected = set(), []
  for i in range(len(ids)):  # first occurrences, then a stable sort by shard
    if ids[i] not in seen:
      seen.add(ids[i])
      expected.append(i)
  expected.sort(key=lambda i: shards[i])
  counts = np.bincount(shards[expected], minlength=num_shards) if expected else [0] * num_shards
  grouped = tf.function(lambda x: sharded.distinct_by_shard(x, num_shards))
  for run in (lambda x: sharded.distinct_by_shard(x, num_shards), grouped):
    distinct, positions, got_counts = (t.numpy() for t in run(tf.constant(ids)))
    assert list(distinct) == [ids[i] for i in expected]
    assert list(distinct[positions]) == list(ids)
    assert list(got_counts) == list(counts)


def test_distinct_by_shard_refuses_ids_that_are_not_1_d():
  with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
    sharded.distinct_by_shard(tf.constant([[1, 2]], tf.int64), 2)
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
    tf.function(lambda: sharded.distinct_by_shard(tf.constant([[1, 2]], tf.int64), 2))()


def test_a_one_shard_table_looks_up_in_a_graph_with_and_without_a_combiner():
  """A one-shard table's lookup is its shard's own find: its fusion marker names the shard."""
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable("one_shard", 2, num_shards=1, initializer=1.0)
    ids = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([1, 2, 3], tf.int64), [2, 2])
    combined = tf_ext.embedding_lookup(table, ids, combiner="sum")
    rows = tf_ext.embedding_lookup(table, tf.constant([1, 2], tf.int64))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      got_combined, got_rows = session.run([combined, rows])
  np.testing.assert_array_equal(got_combined, [[1, 1], [2, 2]])
  np.testing.assert_array_equal(got_rows, [[1, 1], [1, 1]])

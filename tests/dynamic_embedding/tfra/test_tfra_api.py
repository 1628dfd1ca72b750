"""`import tf_ext.tfra as de`: TFRA programs over tf_ext tables, eagerly, in tf.function, in TF1
graphs and in Keras, against TensorFlow's own dense embeddings where the semantics are TFRA's."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.keras.optimizer_v2 import gradient_descent as tf_keras_sgd

import tf_ext
import tf_ext.tfra as de


def _name(request):
  return request.node.name.replace("[", "_").replace("]", "")


def test_the_public_path_is_the_capability_package():
  from tf_ext.dynamic_embedding import tfra as home

  assert de is home
  assert de.keras.layers.BasicEmbedding is de.keras.layers.Embedding
  assert de.train.Checkpoint is de.train.DECheckpoint


def test_variable_reads_writes_and_exports(request):
  var = de.get_variable(_name(request), dim=3)
  keys = tf.constant([5, -1, 2**40], tf.int64)
  values = tf.reshape(tf.range(9, dtype=tf.float32), [3, 3])
  var.upsert(keys, values)
  assert int(var.size()) == 3
  got = var.lookup(tf.constant([[2**40, 7]], tf.int64))
  assert got.shape == (1, 2, 3)
  np.testing.assert_array_equal(got[0, 0], [6, 7, 8])
  np.testing.assert_array_equal(got[0, 1], [0, 0, 0])  # TFRA's default initializer: zeros
  exported_keys, exported_values = var.export()
  order = np.argsort(exported_keys.numpy())
  np.testing.assert_array_equal(exported_keys.numpy()[order], [-1, 5, 2**40])
  np.testing.assert_array_equal(exported_values.numpy()[order], values.numpy()[[1, 0, 2]])
  rows, exists = var.lookup(tf.constant([[5, 6], [-1, 2**40]], tf.int64), return_exists=True)
  np.testing.assert_array_equal(exists, [[True, False], [True, True]])
  np.testing.assert_array_equal(rows[0], [[0, 1, 2], [0, 0, 0]])
  var.remove(tf.constant([5, 99], tf.int64))
  assert int(var.size()) == 2
  # accum: existing keys get new - old added, missing keys are set to new.
  var.accum(
    tf.constant([-1, 11], tf.int64),
    tf.ones([2, 3]),
    tf.fill([2, 3], 3.0),
    tf.constant([True, False]),
  )
  np.testing.assert_array_equal(var.lookup(tf.constant([-1, 11], tf.int64)), [[5, 6, 7], [3, 3, 3]])
  var.clear()
  assert int(var.size()) == 0


def test_int32_keys_and_half_rows_convert_exactly(request):
  var = de.get_variable(_name(request), key_dtype=tf.int32, value_dtype=tf.float16, dim=2)
  values = tf.constant([[0.1, -65504.0], [6e-8, 3.0]], tf.float16)
  var.upsert(tf.constant([3, -7], tf.int32), values)
  got = var.lookup(tf.constant([-7, 3], tf.int32))
  assert got.dtype == tf.float16
  np.testing.assert_array_equal(got.numpy(), values.numpy()[[1, 0]])
  keys, rows = var.export()
  assert keys.dtype == tf.int32 and rows.dtype == tf.float16


@pytest.mark.parametrize(
  "value_dtype, initial, rows",
  [
    (tf.int32, -1, [[2**31 - 1, -5], [7, 0]]),
    (tf.int64, -1, [[2**62 + 3, -(2**40)], [1, 2]]),
    (tf.float64, 0.0, [[1e-300, np.pi], [2.5, -0.0]]),
    (tf.bool, True, [[True, False], [False, False]]),
    (tf.int8, 3, [[-128, 127], [0, 1]]),
  ],
)
def test_rows_of_every_offered_dtype_are_held_exactly(request, value_dtype, initial, rows):
  var = de.get_variable(_name(request), value_dtype=value_dtype, dim=2, initializer=initial)
  var.upsert(tf.constant([1, 2], tf.int64), tf.constant(rows, value_dtype))
  got = var.lookup(tf.constant([2, 1, 9], tf.int64))
  assert got.dtype == value_dtype
  expected = np.array([rows[1], rows[0], [initial] * 2], value_dtype.as_numpy_dtype)
  np.testing.assert_array_equal(got.numpy(), expected)
  assert got.numpy().tobytes() == expected.tobytes()  # bit for bit (-0.0, the last int64 bits)
  keys, values = var.export()
  assert values.dtype == value_dtype and sorted(keys.numpy()) == [1, 2]


@pytest.mark.parametrize(
  "initializer, expected",
  [(None, 0.0), (0.5, 0.5), (np.full([4], -2.0), -2.0), (tf.keras.initializers.Ones(), 1.0)],
)
def test_constant_initializers_read_as_in_tfra(request, initializer, expected):
  var = de.get_variable(_name(request), dim=4, initializer=initializer)
  np.testing.assert_array_equal(
    var.lookup(tf.constant([1, 2], tf.int64)), np.full([2, 4], expected)
  )


@pytest.mark.parametrize(
  "value_dtype, initializer, expected",
  [
    (tf.float64, np.array([-1.0]), [-1.0, -1.0]),
    (tf.float64, 0.1, [0.1, 0.1]),
    (tf.int64, 5, [5, 5]),
    (tf.int32, tf.constant([-1, -2], tf.int64), [-1, -2]),
    (tf.float32, np.array([1.5, -2.0]), [1.5, -2.0]),
  ],
  ids=["float64_minus_one", "float64_tenth", "int64_five", "int32_row", "float32_row"],
)
def test_initial_rows_the_table_cannot_compute_read_as_in_tfra(
  request, value_dtype, initializer, expected
):
  var = de.get_variable(_name(request), value_dtype=value_dtype, dim=2, initializer=initializer)
  stored = np.array([[3, 4]], value_dtype.as_numpy_dtype)
  var.upsert(tf.constant([1], tf.int64), tf.constant(stored, value_dtype))
  rows, exists = var.lookup(tf.constant([[1, 7], [8, 1]], tf.int64), return_exists=True)
  expected = np.array(expected, value_dtype.as_numpy_dtype)
  np.testing.assert_array_equal(rows.numpy(), [[stored[0], expected], [expected, stored[0]]])
  np.testing.assert_array_equal(exists, [[True, False], [False, True]])
  assert int(var.size()) == 1  # lookups insert nothing


def test_a_row_of_different_initial_values_is_where_training_starts(request):
  var = de.get_variable(_name(request), dim=3, initializer=np.array([1.0, 2.0, 3.0]))
  shadow = de.shadow_ops.ShadowVariable(var, name="first_rows")
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
  for _ in range(2):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, tf.constant([5, 6], tf.int64)))
    optimizer.apply_gradients([(tape.gradient(loss, shadow), shadow)])
  np.testing.assert_allclose(
    var.lookup(tf.constant([5, 6, 9], tf.int64)), [[0, 1, 2]] * 2 + [[1, 2, 3]]
  )
  assert int(var.size()) == 2


def test_random_rows_of_float64_draw_from_the_asked_distribution(request):
  var = de.get_variable(
    _name(request),
    value_dtype=tf.float64,
    dim=8,
    initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5),
  )
  rows = var.lookup(tf.range(2000, dtype=tf.int64)).numpy()
  assert rows.dtype == np.float64 and rows.min() >= -0.5 and rows.max() < 0.5
  assert abs(rows.std() - 1 / np.sqrt(12)) < 0.01


def test_a_keras_initializer_gives_each_position_of_a_lookup_its_row_as_in_tfra(request):
  # TFRA calls the initializer for each lookup's keys, and a Keras initializer gives the same
  # values at every call: new ids at the same position of a lookup start from the same row.
  var = de.get_variable(
    _name(request), dim=16, initializer=tf.keras.initializers.RandomNormal(stddev=0.3)
  )
  rows = var.lookup(tf.range(4000, dtype=tf.int64)).numpy()
  assert abs(rows.std() - 0.3) < 0.01 and abs(rows.mean()) < 0.01
  np.testing.assert_array_equal(rows[:10], var.lookup(tf.range(10, 20, dtype=tf.int64)))
  # A TensorFlow initializer draws anew at every call.
  drawn = de.get_variable(
    _name(request) + "_tf", dim=16, initializer=tf.random_normal_initializer(stddev=0.3)
  )
  assert not np.allclose(
    drawn.lookup(tf.range(10, dtype=tf.int64)), drawn.lookup(tf.range(10, dtype=tf.int64))
  )


def test_a_variance_scaling_initializer_scales_by_the_lookups_keys_as_in_tfra(request):
  var = de.get_variable(_name(request), dim=8, initializer=tf.keras.initializers.GlorotNormal())
  # Glorot: variance 2 / (fan in + fan out) of the shape [keys, dim] TFRA draws.
  for count in (8, 4000):
    rows = var.lookup(tf.range(count, dtype=tf.int64)).numpy()
    assert abs(rows.std() / np.sqrt(2.0 / (count + 8)) - 1) < 0.35


def test_training_starts_from_the_row_a_key_read(request):
  var = de.get_variable(_name(request), dim=4, initializer=tf.keras.initializers.RandomNormal())
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
  shadow = de.shadow_ops.ShadowVariable(var, name="read_rows")
  with tf.GradientTape() as tape:
    read = de.shadow_ops.embedding_lookup(shadow, tf.constant([3], tf.int64))
    loss = tf.reduce_sum(read)
  optimizer.apply_gradients([(tape.gradient(loss, shadow), shadow)])
  np.testing.assert_allclose(var.lookup(tf.constant([3], tf.int64)), read.numpy() - 0.5, 1e-6)
  # In a TF1 graph, through a lookup's wrapper: key 7 reads two rows and trains from one of them.
  with tf.Graph().as_default():
    graph_var = de.get_variable(
      "read_rows_graph_random", dim=4, initializer=tf.keras.initializers.RandomUniform(1.0, 2.0)
    )
    ids = tf.constant([7, 3, 7], tf.int64)
    rows, wrapper = de.embedding_lookup(graph_var, ids, name="first", return_trainable=True)
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25))
    train = train.minimize(tf.reduce_sum(rows[1]), var_list=[wrapper])
    after = graph_var.lookup(tf.constant([3, 7], tf.int64))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      _, read = session.run([train, rows])
      got = session.run(after)
  np.testing.assert_allclose(got[0], read[1] - 0.25, 1e-6)
  assert any(np.allclose(got[1], read[i]) for i in (0, 2))


def test_per_key_initial_rows_are_drawn_in_the_table(request, monkeypatch):
  monkeypatch.setenv("TF_EXT_TFRA_INITIAL_ROWS", "per_key")
  var = de.get_variable(
    _name(request), dim=16, initializer=tf.keras.initializers.RandomNormal(stddev=0.3)
  )
  other = de.get_variable(
    _name(request) + "_other", dim=16, initializer=tf.keras.initializers.RandomNormal(stddev=0.3)
  )
  rows = var.lookup(tf.range(4000, dtype=tf.int64)).numpy()
  assert abs(rows.std() - 0.3) < 0.01 and abs(rows.mean()) < 0.01
  # The same key reads the same row again; another table without a seed starts elsewhere.
  np.testing.assert_array_equal(rows[:10], var.lookup(tf.range(10, dtype=tf.int64)))
  assert not np.allclose(rows[:10], other.lookup(tf.range(10, dtype=tf.int64)))
  monkeypatch.setenv("TF_EXT_TFRA_INITIAL_ROWS", "tfras")
  with pytest.raises(ValueError, match="TF_EXT_TFRA_INITIAL_ROWS"):
    de.get_variable(_name(request) + "_bad", dim=2, initializer=tf.keras.initializers.Zeros())


@pytest.mark.parametrize(
  "initializer",
  [tf.keras.initializers.GlorotNormal(seed=3), tf.keras.initializers.HeUniform(seed=3)],
  ids=["glorot_normal", "he_uniform"],
)
def test_per_key_variance_scaling_draws_as_tensorflow_for_a_row(request, monkeypatch, initializer):
  monkeypatch.setenv("TF_EXT_TFRA_INITIAL_ROWS", "per_key")
  var = de.get_variable(_name(request), dim=32, initializer=initializer)
  rows = var.lookup(tf.range(3000, dtype=tf.int64)).numpy()
  # Unseeded instances: a seeded Keras initializer draws the same values at every call.
  reference = np.concatenate([type(initializer)()(shape=[32]).numpy() for _ in range(300)])
  assert abs(rows.std() / reference.std() - 1) < 0.03
  assert abs(np.percentile(np.abs(rows), 99) / np.percentile(np.abs(reference), 99) - 1) < 0.05


def test_a_partitioned_variable_routes_keys_by_its_partitioner(request):
  def by_thousands(keys, shard_num):
    return tf.cast((keys // 1000) % shard_num, tf.int32)

  var = de.get_variable(
    _name(request), dim=2, devices=["/CPU:0"] * 3, partitioner=by_thousands, initializer=1.0
  )
  assert [t.name for t in var.tables] == [f"{var.name}_mht_{i}of3" for i in (1, 2, 3)]
  keys = tf.constant([0, 1, 1000, 2000, 2001, 2002, 3000], tf.int64)
  var.upsert(keys, tf.stack([tf.cast(keys, tf.float32)] * 2, axis=1))
  assert [int(var.size(i)) for i in range(3)] == [3, 1, 3]
  _, exists = var.lookup(tf.constant([2001, 1, 4000, 1000], tf.int64), return_exists=True)
  np.testing.assert_array_equal(exists, [True, True, False, True])
  np.testing.assert_array_equal(
    var.lookup(tf.constant([2002, 5, 1000], tf.int64)), [[2002, 2002], [1, 1], [1000, 1000]]
  )
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
  ids = tf.constant([2002, 7, 1000, 7], tf.int64)
  with tf.GradientTape() as tape:
    rows, wrapper = de.embedding_lookup(var, ids, name="lookup", return_trainable=True)
    loss = tf.reduce_sum(rows)
  optimizer.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])
  np.testing.assert_array_equal(
    var.lookup(tf.constant([2002, 7, 1000], tf.int64)), [[2001.5] * 2, [0.0] * 2, [999.5] * 2]
  )
  assert [int(var.size(i)) for i in range(3)] == [4, 1, 3]  # 7 went to shard 0


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_lookups_train_as_tensorflow_dense_embeddings(request, combiner, weighted):
  """embedding_lookup_sparse and SGD/Adagrad updates of a de.Variable give what
  tf.nn.embedding_lookup_sparse and the same optimizer give on a dense variable."""
  rng = np.random.default_rng(0)
  vocabulary, dim = 50, 4
  dense = tf.Variable(rng.normal(size=[vocabulary, dim]).astype(np.float32))
  var = de.get_variable(_name(request), dim=dim)
  var.upsert(tf.range(vocabulary, dtype=tf.int64), dense.read_value())
  dense_opt = tf.keras.optimizers.Adagrad(0.1)
  de_opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1))
  for step in range(4):
    indices = [[0, 0], [0, 1], [1, 0], [3, 0], [3, 1], [3, 2]]
    ids = tf.SparseTensor(indices, rng.integers(0, vocabulary, 6), [4, 3])
    weights = tf.SparseTensor(indices, rng.uniform(0.5, 2.0, 6).astype(np.float32), [4, 3])
    weights = weights if weighted else None
    with tf.GradientTape(persistent=True) as tape:
      expected = tf.nn.embedding_lookup_sparse(dense, ids, weights, combiner=combiner)
      got, wrapper = de.embedding_lookup_sparse(
        var, ids, weights, combiner=combiner, name="sparse", return_trainable=True
      )
      target = tf.constant(rng.normal(size=[4, dim]).astype(np.float32))
      dense_loss = tf.reduce_sum(tf.square(expected - target))
      de_loss = tf.reduce_sum(tf.square(got - target))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=f"step {step}")
    dense_opt.apply_gradients([(tape.gradient(dense_loss, dense), dense)])
    de_opt.apply_gradients([(tape.gradient(de_loss, wrapper), wrapper)])
  np.testing.assert_allclose(
    var.lookup(tf.range(vocabulary, dtype=tf.int64)), dense.read_value(), rtol=1e-5, atol=1e-6
  )


def test_safe_sparse_lookup_fills_empty_rows_and_looks_minus_one_up(request):
  var = de.get_variable(_name(request), dim=2, initializer=0.25)
  var.upsert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 1.0], [3.0, 5.0]]))
  ids = tf.SparseTensor(
    [[0, 0, 0], [0, 0, 1], [1, 1, 0], [1, 1, 1]], tf.constant([1, 2, 2, -1], tf.int64), [2, 2, 2]
  )
  weights = tf.SparseTensor(ids.indices, [1.0, 3.0, 1.0, -2.0], ids.dense_shape)
  got = de.safe_embedding_lookup_sparse(var, ids, weights, combiner="mean")
  assert got.shape == (2, 2, 2)
  # Row (0, 0): weighted mean of 1 and 2; (1, 1): id -1's weight is <= 0, so only 2 stays;
  # the empty rows are zeros.
  np.testing.assert_allclose(got, [[[2.5, 4.0], [0, 0]], [[0, 0], [3.0, 5.0]]])
  # With "sum", weights are not pruned and -1 is an ordinary id (its initial row), as in TFRA.
  summed = de.safe_embedding_lookup_sparse(var, ids, None, combiner="sum", default_id=2)
  np.testing.assert_allclose(summed[1, 1], [3.25, 5.25])
  np.testing.assert_allclose(summed[0, 1], [3.0, 5.0])  # default_id's row


def test_embedding_lookup_unique_equals_embedding_lookup(request):
  var = de.get_variable(_name(request), dim=3, initializer=tf.keras.initializers.RandomUniform())
  ids = tf.constant([[4, 4, 9], [9, 1, 4]], tf.int64)
  # Stored rows: a missing id reads its position's initial row, and the positions differ.
  var.upsert(tf.constant([1, 4, 9], tf.int64), tf.random.uniform([3, 3]))
  unique = de.embedding_lookup_unique(var, ids, name="unique")
  assert unique.shape == (2, 3, 3)
  np.testing.assert_array_equal(unique, de.embedding_lookup(var, ids, name="plain"))


def test_tf_function_training_through_a_shadow_variable(request):
  var = de.get_variable(_name(request), dim=2)
  shadow = de.shadow_ops.ShadowVariable(var, name="shadow")
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))

  @tf.function
  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, ids))
    optimizer.apply_gradients([(tape.gradient(loss, shadow), shadow)])

  for _ in range(3):
    step(tf.constant([1, 1, 2], tf.int64))
  np.testing.assert_array_equal(var.lookup(tf.constant([1, 2], tf.int64)), [[-6, -6], [-3, -3]])
  assert var.get_trainable_by_name("shadow") is shadow


def test_tf1_graph_trains_saves_and_restores(tmp_path):
  prefix = str(tmp_path / "model")
  with tf.Graph().as_default():
    var = de.get_variable("graph_table", dim=2, initializer=tf.keras.initializers.Zeros())
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    rows = de.embedding_lookup(var, ids)
    loss = tf.reduce_sum(tf.square(rows - 1.0))
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(
      loss, global_step=tf.compat.v1.train.get_or_create_global_step()
    )
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())  # wrappers need no local init
      for _ in range(5):
        session.run(train, {ids: [3, 4, 4]})
      trained = session.run(var.lookup(tf.constant([3, 4], tf.int64)))
      saver.save(session, prefix)
    assert np.all(trained > 0.3)
  with tf.Graph().as_default():
    var = de.get_variable("graph_table", dim=2)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      saver.restore(session, prefix)
      np.testing.assert_array_equal(session.run(var.lookup(tf.constant([3, 4], tf.int64))), trained)
      assert session.run(var.size()) == 2


@pytest.mark.parametrize("var_list", ["variable", "tables", "native", "sharded"])
def test_a_saver_given_the_tables_saves_and_restores_them(tmp_path, var_list):
  """Saver(var_list=[...]) with a Variable, its tables, or a tf_ext table: the tables' rows."""

  def make():
    if var_list in ("native", "sharded"):
      shards = 3 if var_list == "sharded" else None
      table = tf_ext.get_dynamic_embedding_variable("saved", 2, num_shards=shards)
      return table, [table], table.insert
    var = de.get_variable("saved", dim=2)
    return var, [var] if var_list == "variable" else list(var.tables), var.upsert

  prefix = str(tmp_path / "listed")
  with tf.Graph().as_default():
    table, saved, write = make()
    written = write(tf.constant([4, 5], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
    saver = tf.compat.v1.train.Saver(saved)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      session.run(written)
      saver.save(session, prefix)
  with tf.Graph().as_default():
    table, saved, _ = make()
    saver = tf.compat.v1.train.Saver(saved)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(tf.compat.v1.local_variables_initializer())  # a sharded table's anchors
      saver.restore(session, prefix)
      np.testing.assert_array_equal(
        session.run(table.lookup(tf.constant([5, 4], tf.int64))), [[3, 4], [1, 2]]
      )


def test_get_variable_reuse_follows_the_variable_scope():
  with tf.Graph().as_default():
    first = de.get_variable("scoped", dim=2)
    with pytest.raises(ValueError, match="already exists"):
      de.get_variable("scoped", dim=2)
    with tf.compat.v1.variable_scope("", reuse=True):
      assert de.get_variable("scoped", dim=2) is first
    with tf.compat.v1.variable_scope("outer"):
      assert de.get_variable("scoped", dim=2).name == "outer/scoped"


def test_checkpoint_round_trip(request, tmp_path):
  var = de.get_variable(_name(request), dim=2)
  var.upsert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
  path = de.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
  fresh = de.Variable(name=_name(request) + "_fresh", dim=2)
  de.train.Checkpoint(emb=fresh).restore(path).assert_consumed()
  keys, values = fresh.export()
  order = np.argsort(keys.numpy())
  np.testing.assert_array_equal(values.numpy()[order], [[1, 2], [3, 4]])


def _deepfm_like(name):
  ids = tf.keras.Input(shape=(3,), dtype=tf.int64)
  embedding = de.keras.layers.Embedding(4, name=name)
  squashed = de.keras.layers.SquashedEmbedding(4, combiner="mean", name=name + "_sq")
  features = tf.concat([tf.reshape(embedding(ids), [-1, 12]), squashed(ids)], 1)
  return tf.keras.Model(ids, tf.keras.layers.Dense(1, activation="sigmoid")(features))


def test_keras_layers_train_and_weights_reload(request, tmp_path):
  rng = np.random.default_rng(1)
  x, y = rng.integers(0, 200, (256, 3)), rng.integers(0, 2, 256).astype(np.float32)
  model = _deepfm_like(_name(request))
  model.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01)), "binary_crossentropy")
  history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]
  assert [w.name.split(":")[0] for w in model.trainable_weights][:2] == [
    f"{_name(request)}-shadow",
    f"{_name(request)}_sq-shadow",
  ]
  model.save_weights(str(tmp_path / "weights"))
  fresh = _deepfm_like(_name(request) + "_fresh")
  fresh.load_weights(str(tmp_path / "weights"))
  np.testing.assert_array_equal(fresh.predict(x, verbose=0), model.predict(x, verbose=0))
  # A SavedModel (de.keras.models.save_model) serves the same predictions without the layers.
  de.keras.models.save_model(model, str(tmp_path / "saved"))
  served = tf.saved_model.load(str(tmp_path / "saved"))
  np.testing.assert_allclose(served(tf.constant(x[:8])), model.predict(x[:8], verbose=0), atol=1e-6)


def test_field_wise_embedding_pools_per_field(request):
  layer = de.keras.layers.FieldWiseEmbedding(
    2,
    3,
    slot_map_fn=lambda ids: tf.math.floormod(ids, 3),
    initializer=tf.keras.initializers.Zeros(),
    name=_name(request),
  )
  layer.params.upsert(tf.range(10, dtype=tf.int64), tf.ones([10, 2]))
  out = layer(tf.constant([[0, 3, 1], [2, 5, 8]], tf.int64))
  np.testing.assert_array_equal(out[:, :, 0], [[2, 1, 0], [0, 0, 3]])


@pytest.mark.parametrize("policy", [de.TimestampRestrictPolicy, de.FrequencyRestrictPolicy])
def test_restrict_keeps_the_rows_the_policy_ranks_first(request, policy):
  var = de.get_variable(_name(request), dim=1, restrict_policy=policy)
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
  shadow = de.shadow_ops.ShadowVariable(var, name="restrict")
  # Ids 0..9, each trained at steps 10 - id on: id 0 most often, id 9 least often and latest
  # for the timestamp policy we train them in reverse: the latest trained come first.
  order = range(10) if policy is de.FrequencyRestrictPolicy else reversed(range(10))
  for step, last in enumerate(order):
    with tf.GradientTape() as tape:
      ids = tf.range(last + 1, dtype=tf.int64) if policy is de.FrequencyRestrictPolicy else [last]
      loss = tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, tf.constant(ids, tf.int64)))
    optimizer.apply_gradients([(tape.gradient(loss, shadow), shadow)])
    del step
  assert int(var.size()) == 10
  var.restrict(4, trigger=12)  # not above the trigger: nothing happens
  assert int(var.size()) == 10
  var.restrict(4)
  keys, _ = var.export()
  assert sorted(keys.numpy().tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("policy", [de.TimestampRestrictPolicy, de.FrequencyRestrictPolicy])
def test_a_policy_keeps_its_status_as_tfra_does(request, policy):
  var = de.get_variable(_name(request), dim=1)
  standalone = policy(var)
  standalone.apply_update(tf.constant([0, 1, 2, 2], tf.int64))
  standalone.apply_update(tf.constant([[1, 2], [3, 3]], tf.int64))
  keys, values = standalone.status.export()
  by_key = dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist()))
  assert sorted(by_key) == [0, 1, 2, 3] and int(var.size()) == 0  # the Variable is untouched
  if policy is de.FrequencyRestrictPolicy:
    assert standalone.freq_var is standalone.status
    assert by_key == {0: 1, 1: 2, 2: 2, 3: 1}  # once per update, however often a batch repeats
  else:
    assert standalone.tstp_var is standalone.status
    assert by_key[0] < min(by_key[1], by_key[2], by_key[3])  # wall-clock, microseconds
    assert abs(by_key[3] / 1e6 - __import__("time").time()) < 60


def test_training_records_the_status_without_a_global_step(tmp_path):
  with tf.Graph().as_default():
    var = de.get_variable("status_graph", dim=1, restrict_policy=de.TimestampRestrictPolicy)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    rows = de.embedding_lookup(var, ids, name="status_lookup")
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
      tf.reduce_sum(rows)
    )
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for batch in ([0, 1, 2], [2, 3], [3, 4]):
        session.run(train, {ids: batch})
      assert session.run(var.restrict_policy.status.size()) == 5
      session.run(var.restrict(2))
      keys, _ = session.run(var.export())
      assert sorted(keys.tolist()) == [3, 4]
      assert session.run(var.restrict_policy.status.size()) == 2
      tf.compat.v1.train.Saver().save(session, str(tmp_path / "model"))
  with tf.Graph().as_default():
    var = de.get_variable("status_graph", dim=1, restrict_policy=de.TimestampRestrictPolicy)
    with tf.compat.v1.Session() as session:
      tf.compat.v1.train.Saver().restore(session, str(tmp_path / "model"))
      assert session.run(var.restrict_policy.status.size()) == 2


def test_accum_leaves_keys_another_writer_changed(request):
  var = de.get_variable(_name(request), dim=1)
  var.upsert(tf.constant([0, 1], tf.int64), tf.constant([[0.0], [1.0]]))
  _, exists = var.lookup(tf.constant([0, 1, 7], tf.int64), return_exists=True)
  var.remove(tf.constant([1], tf.int64))  # another writer, between the lookup and accum
  var.upsert(tf.constant([7], tf.int64), tf.constant([[99.0]]))
  var.accum(tf.constant([0, 1, 7], tf.int64), tf.zeros([3, 1]), tf.fill([3, 1], 10.0), exists)
  keys, values = var.export()
  assert dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist())) == {0: 10.0, 7: 99.0}


def test_a_lookup_wrapper_in_arithmetic_is_its_rows():
  with tf.Graph().as_default():
    var = de.get_variable("wrapper_rows", dim=2, initializer=1.0)
    _, wrapper = de.embedding_lookup(
      var, tf.constant([1, 2], tf.int64), name="rows_lookup", return_trainable=True
    )
    product = wrapper * wrapper
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25))
    train = train.minimize(lambda: wrapper * wrapper, var_list=[wrapper])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      assert session.run(product).shape == (2, 2)
      session.run(train)
      np.testing.assert_allclose(session.run(var.lookup(tf.constant([1, 2], tf.int64))), 0.5)


def test_a_shadow_variable_tells_its_last_ids_and_hvd_variable_of_one_rank_is_it(request):
  var = de.get_variable(_name(request), dim=2, initializer=0.5)
  shadow = de.shadow_ops.ShadowVariable(var, name="last_ids")
  assert shadow.ids.dtype == tf.int64 and shadow.ids.shape == (0,)
  de.shadow_ops.embedding_lookup(shadow, tf.constant([[4, 2]], tf.int64))
  np.testing.assert_array_equal(shadow.ids, [4, 2])
  np.testing.assert_array_equal(shadow.read_value(False), np.full([2, 2], 0.5))
  assert de.shadow_ops.HvdVariable("hvd", shadow, 2, mpi_size=1) is shadow
  with pytest.raises(NotImplementedError, match="HvdAllToAllEmbedding"):
    de.shadow_ops.HvdVariable("hvd", shadow, 2, mpi_size=2)


def test_size_answers_in_a_finalized_graph():
  with tf.Graph().as_default() as graph:
    var = de.get_variable("finalized_size", dim=1, devices=["/CPU:0", "/CPU:0"])
    insert = var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 1]))
    size = var.size()
    graph.finalize()  # as MonitoredTrainingSession does
    assert var.size() is size
    with tf.compat.v1.Session() as session:
      session.run(insert)
      assert session.run(var.size()) == 3 and session.run(var.size(1)) >= 1


def test_restrict_without_a_policy_does_nothing(request):
  var = de.get_variable(_name(request), dim=1)
  assert var.restrict(1) is None


def test_bad_input_is_refused_by_name(request):
  name = _name(request)
  with pytest.raises(TypeError, match="string-string.*not supported"):
    de.get_variable(name + "_a", key_dtype=tf.string, value_dtype=tf.string)
  with pytest.raises(TypeError, match="int64-uint64.*not supported"):
    de.get_variable(name + "_a2", value_dtype=tf.uint64)
  with pytest.raises(ValueError, match="MutableHashTable.*restrict_policy is not offered"):
    de.get_variable(name + "_a3", value_dtype=tf.string, restrict_policy=de.TimestampRestrictPolicy)
  with pytest.raises(TypeError, match="string rows take a constant initializer"):
    de.get_variable(name + "_a4", value_dtype=tf.string, initializer=tf.keras.initializers.Ones())
  with pytest.raises(ValueError, match="'/GPU:7', which this process does not have"):
    de.get_variable(name + "_b", devices=["/GPU:7"])
  with pytest.raises(NotImplementedError, match="Redis.*num_shards"):
    de.RedisTableCreator(de.RedisTableConfig(redis_address="127.0.0.1"))
  with pytest.raises(RuntimeError, match="call hvd.init"):
    de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(), synchronous=True)
  with pytest.raises(NotImplementedError, match="table entry.*DynamicEmbeddingOptimizer"):
    de.create_slots(None, None, "m", "Adam", None)
  var = de.get_variable(name + "_d", dim=2)
  with pytest.raises(TypeError, match="key_dtype should be same"):
    de.embedding_lookup(var, tf.constant([1], tf.int32), name="x")
  with pytest.raises(ValueError, match="Must specify a name"):
    de.embedding_lookup(var, tf.constant([1], tf.int64))
  with pytest.raises(TypeError, match="params should be a Variable"):
    de.embedding_lookup(tf.Variable([1.0]), tf.constant([1], tf.int64), name="x")
  with pytest.raises(TypeError, match="restrict_policy must be subclass"):
    de.get_variable(name + "_e", restrict_policy=de.TimestampRestrictPolicy(var))


def test_hkv_creator_falls_back_to_the_cpu_table_without_a_gpu(request):
  var = de.get_variable(_name(request), dim=2, kv_creator=de.HkvHashTableCreator())
  assert not tf.config.list_logical_devices("GPU")
  assert "CPU" in var.tables[0].device
  var.upsert(tf.constant([1], tf.int64), tf.constant([[1.0, 2.0]]))
  np.testing.assert_array_equal(var.lookup(tf.constant([1], tf.int64)), [[1, 2]])


_SNAPSHOT_OF_TENSORFLOW = """
import sys, types
import tensorflow as tf

def snapshot():
  found = {}
  for name, module in list(sys.modules.items()):
    if name.startswith(("tensorflow", "keras")) and isinstance(module, types.ModuleType):
      for attribute, value in list(vars(module).items()):
        found[(name, attribute)] = id(value)
        if isinstance(value, type):
          for member, inner in list(vars(value).items()):
            found[(name, attribute, member)] = id(inner)
  return found

tf.keras.optimizers.Adam  # loads Keras (tf.keras is a lazy loader until first used)
before = snapshot()
import tf_ext.tfra
after = snapshot()
changed = sorted(str(k) for k in before if after.get(k) != before[k])
print(len(before), changed)
"""


def test_importing_tfra_patches_nothing_in_tensorflow():
  """TFRA's import replaces TensorFlow functions and methods (patch_on_tf); tf_ext.tfra's changes
  no attribute of any TensorFlow or Keras module or class already loaded."""
  result = subprocess.run(
    [sys.executable, "-c", _SNAPSHOT_OF_TENSORFLOW], capture_output=True, text=True, check=True
  )
  count, changed = result.stdout.strip().splitlines()[-1].split(" ", 1)
  assert int(count) > 10000 and changed == "[]", changed


def test_warm_start_fills_variables_from_a_saver_checkpoint_of_other_names(tmp_path):
  prefix = str(tmp_path / "warm")
  with tf.Graph().as_default():
    saved = de.get_variable("previous", dim=1, devices=["/CPU:0"] * 2)
    written = saved.upsert(tf.range(10, dtype=tf.int64), tf.reshape(tf.range(10.0), [10, 1]))
    saver = tf.compat.v1.train.Saver([saved])
    with tf.compat.v1.Session() as session:
      session.run(written)
      saver.save(session, prefix)
  with tf.Graph().as_default():
    var = de.get_variable("current", dim=1, devices=["/CPU:0"] * 2)
    tf.compat.v1.add_to_collection(de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, var)
    rows = var.lookup(tf.constant([9, 3], tf.int64))
    hook = de.WarmStartHook(str(tmp_path), ".*curr.*", {"current": "previous"})
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
      np.testing.assert_array_equal(session.run(rows), [[9.0], [3.0]])
  with tf.Graph().as_default():
    known = de.get_variable("previous", dim=1, devices=["/CPU:0"] * 2)
    unknown = de.get_variable("unknown", dim=1)
    with tf.compat.v1.Session() as session:
      with pytest.raises(tf.errors.OpError):  # no table of that name in the checkpoint
        session.run(de.warm_start(prefix, [known, unknown]))
      assert session.run(known.size()) == 0  # checked first: the known one is not restored


@pytest.mark.parametrize("api", ["legacy", "tensorflow.python.keras", "native"])
def test_a_keras_optimizer_in_a_tf1_session_updates_the_rows(api):
  """A Keras optimizer's minimize in a TF1 graph returns what a session runs: the table updates
  (before, it returned the step counter, which reads without running them)."""
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    sgd = tf_keras_sgd.SGD(0.1) if api != "legacy" else tf.keras.optimizers.legacy.SGD(0.1)
    if api == "native":
      table = tf_ext.get_dynamic_embedding_variable("keras_in_tf1", 1, initializer=0.5)
      optimizer = tf_ext.DynamicEmbeddingOptimizer(sgd)
      train = optimizer.minimize(
        lambda: tf.reduce_sum(table.lookup(tf.constant([1, 3, 3], tf.int64))),
        [table.gradient_anchor],
      )
    else:
      table = de.get_variable("keras_in_tf1", dim=1, initializer=0.5)
      wrappers = []

      def loss():
        rows, wrapper = de.embedding_lookup_unique(
          table, tf.constant([1, 3, 3], tf.int64), return_trainable=True, name="k1"
        )
        wrappers[:] = [wrapper]
        return tf.reduce_sum(rows)

      train = de.DynamicEmbeddingOptimizer(sgd).minimize(loss, lambda: wrappers)
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(tf.compat.v1.local_variables_initializer())
    session.run(train)
    session.run(train)
    np.testing.assert_allclose(
      session.run(table.lookup(tf.constant([1, 3], tf.int64))), [[0.3], [0.1]], atol=1e-6
    )


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32])
def test_string_rows_in_a_graph_eagerly_and_in_checkpoints(request, key_dtype, tmp_path):
  """value_dtype=tf.string: rows held in TensorFlow's MutableHashTable, sharded, read with the
  initializer's row for missing keys, saved by Saver and tf.train.Checkpoint."""
  name = _name(request)
  keys, values = [0, 1, 2, 3], [["a", "b"], ["c", ""], ["e", "f"], ["g", "h"]]

  def exercise(run, var):
    assert run(var.size()) == 0
    run(var.upsert(tf.constant(keys, key_dtype), tf.constant(values)))
    run(var.remove(tf.constant([1, 5], key_dtype)))
    assert run(var.size()) == 3
    rows, exists = run(var.lookup(tf.constant([[0, 1], [3, 9]], key_dtype), return_exists=True))
    np.testing.assert_array_equal(
      rows, [[[b"a", b"b"], [b"-1", b"-1"]], [[b"g", b"h"], [b"-1", b"-1"]]]
    )
    np.testing.assert_array_equal(exists, [[True, False], [True, False]])
    exported_keys, exported_values = run(var.export())
    order = np.argsort(exported_keys)
    np.testing.assert_array_equal(exported_keys[order], [0, 2, 3])
    np.testing.assert_array_equal(
      exported_values[order], [[b"a", b"b"], [b"e", b"f"], [b"g", b"h"]]
    )

  def make(suffix):
    return de.get_variable(
      name + suffix,
      key_dtype=key_dtype,
      value_dtype=tf.string,
      dim=2,
      initializer="-1",
      devices=["/CPU:0", "/CPU:0"],
    )

  var = make("_eager")
  exercise(lambda t: tf.nest.map_structure(lambda x: x.numpy() if tf.is_tensor(x) else x, t), var)
  path = tf.train.Checkpoint(var=var).save(str(tmp_path / "eager" / "ckpt"))
  again = make("_eager_restored")
  tf.train.Checkpoint(var=again).restore(path).assert_consumed()
  np.testing.assert_array_equal(
    again.lookup(tf.constant([2, 1], key_dtype)), [[b"e", b"f"], [b"-1", b"-1"]]
  )
  with pytest.raises(TypeError, match="string rows are not trained"):
    de.embedding_lookup(var, tf.constant([1], key_dtype), name="x")
  with pytest.raises(TypeError, match="accum adds rows"):
    var.accum(tf.constant(keys, key_dtype), values, values, [True] * 4)
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    var = make("_graph")
    exercise(session.run, var)
    prefix = tf.compat.v1.train.Saver([var]).save(session, str(tmp_path / "graph" / "model"))
    session.run(var.clear())
    assert session.run(var.size()) == 0
    tf.compat.v1.train.Saver([var]).restore(session, prefix)
    assert session.run(var.size()) == 3

"""tf_ext.feature_column: dynamic embedding columns in DenseFeatures (Keras), input_layer (TF1
graphs, Estimator model_fn) and checkpoints; ids are used as they are; bad columns are clear
errors."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext.dynamic_embedding.variable import tables as live_tables
from tf_ext.feature_column import DynamicEmbeddingColumn
from tf_ext.keras.lifecycle_callbacks import model_tables

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

fcol = tf_ext.feature_column
DIM = 4


def run_python(code):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr[-5000:]


def _columns():
  return {
    "user": fcol.categorical_column_with_dynamic_vocabulary("user", tf.int64),
    "city": fcol.categorical_column_with_dynamic_vocabulary("city", tf.string),
    "item": tf.feature_column.categorical_column_with_identity("item", num_buckets=2**62),
    "color": tf.feature_column.categorical_column_with_vocabulary_list("color", ["red", "blue"]),
    "tag": tf.feature_column.categorical_column_with_hash_bucket("tag", 10),
  }


def _features(n=64, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "user": rng.integers(10**14, 10**14 + 20, (n, 1)).astype(np.int64),
    "city": rng.choice(np.array([b"paris", b"oslo", b"lima"]), (n, 1)),
    "item": rng.integers(2**61, 2**61 + 5, (n, 2)).astype(np.int64),
    "color": rng.choice(np.array([b"red", b"blue", b"green"]), (n, 1)),
    "tag": rng.choice(np.array([b"a", b"b", b"c", b"d"]), (n, 1)),
  }


def _keys(table):
  return set(table.export()[0].numpy().tolist())


def test_dense_features_trains_in_keras_with_ids_as_they_are(tmp_path):
  columns = [fcol.dynamic_embedding_column(c, DIM) for c in _columns().values()]
  features = _features()
  labels = (features["user"][:, 0] % 2).astype(np.float32)
  inputs = {
    k: tf.keras.Input(
      shape=(v.shape[1],), dtype=tf.string if v.dtype.kind == "S" else tf.int64, name=k
    )
    for k, v in features.items()
  }
  hidden = tf.keras.layers.DenseFeatures(columns, name="features")(inputs)
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(
    tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), "binary_crossentropy"
  )
  # The model's tables are found through what it tracks (for the table callbacks).
  assert sorted(t.name for t in model_tables(model, eager=False)) == sorted(
    f"{name}_dynamic_embedding" for name in _columns()
  )
  history = model.fit(features, labels, batch_size=16, epochs=8, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]
  tables = {t.name.split("/")[-1]: t for t in live_tables()}
  # Ids are the keys themselves: no modulo, no hashing (except the hash-bucket column's own).
  assert _keys(tables["user_dynamic_embedding"]) == set(features["user"].ravel().tolist())
  assert _keys(tables["item_dynamic_embedding"]) == set(features["item"].ravel().tolist())
  assert _keys(tables["city_dynamic_embedding"]) == {b"paris", b"oslo", b"lima"}
  assert _keys(tables["color_dynamic_embedding"]) == {0, 1}  # "green" is out of vocabulary
  assert _keys(tables["tag_dynamic_embedding"]) <= set(range(10))  # buckets: they may collide

  # The layer tracks its tables: a checkpoint of the model restores them.
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  expected = model.predict(features, verbose=0)
  tf.keras.backend.clear_session()
  restored_hidden = tf.keras.layers.DenseFeatures(
    [fcol.dynamic_embedding_column(c, DIM) for c in _columns().values()], name="features"
  )(inputs)
  restored = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(restored_hidden))
  tf.train.Checkpoint(model=restored).read(path).expect_partial()
  np.testing.assert_allclose(restored.predict(features, verbose=0), expected, rtol=1e-6)


def test_each_dense_features_layer_owns_its_table_and_trains_it():
  """Two layers over one column (a model built twice): each has its own table, whose gradient
  anchor is the layer's weight, so each model trains its own rows."""
  user = fcol.categorical_column_with_dynamic_vocabulary("user", tf.int64)
  layers = [tf.keras.layers.DenseFeatures([fcol.dynamic_embedding_column(user, DIM)]) for _ in "ab"]
  for layer in layers:
    layer({"user": tf.constant([[1]], tf.int64)})
  first, second = (layer._resources["user_dynamic_embedding"]["table"] for layer in layers)
  assert first is not second
  for layer, table in zip(layers, (first, second)):
    assert [v.ref() for v in layer.trainable_variables] == [table.gradient_anchor.ref()]
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layers[1]({"user": tf.constant([[7]], tf.int64)}))
  optimizer.apply_gradients(
    zip(tape.gradient(loss, layers[1].trainable_variables), layers[1].trainable_variables)
  )
  assert (int(first.size()), int(second.size())) == (0, 1)


def test_out_of_vocabulary_ids_read_zeros_like_tensorflows_embedding_column():
  color = _columns()["color"]
  layer = tf.keras.layers.DenseFeatures([fcol.dynamic_embedding_column(color, DIM)])
  out = layer({"color": tf.constant([["green"], ["red"]])}).numpy()
  np.testing.assert_array_equal(out[0], np.zeros(DIM))  # dropped, as embedding_column drops it
  assert np.any(out[1] != 0)


def test_input_layer_in_an_estimator_model_fn(tmp_path):
  def model_fn(features, labels, mode):
    columns = [fcol.dynamic_embedding_column(c, DIM) for c in _columns().values()]
    net = tf.compat.v1.feature_column.input_layer(features, columns)
    logits = tf.compat.v1.layers.dense(net, 1)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(tf.reshape(labels, [-1, 1]), logits)
    train_op = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3)).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  features = _features(256)
  labels = (features["user"][:, 0] % 2).astype(np.float32)

  def input_fn():
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat(5).batch(32)

  estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))
  estimator.train(input_fn)
  first = estimator.evaluate(input_fn, steps=2)["loss"]
  estimator.train(input_fn)  # restores the tables from its checkpoint, then trains on
  assert estimator.evaluate(input_fn, steps=2)["loss"] < first
  names = estimator.get_variable_names()
  assert "input_layer/user_dynamic_embedding/user_dynamic_embedding-slot_initial_values" in names


def test_bad_columns_are_clear_errors():
  with pytest.raises(ValueError, match="categorical_column must be a categorical column.*Numeric"):
    fcol.dynamic_embedding_column(tf.feature_column.numeric_column("price"), DIM)
  with pytest.raises(ValueError, match="'user': dimension must be a positive int"):
    fcol.dynamic_embedding_column(_columns()["user"], 0)
  with pytest.raises(ValueError, match="combiner must be one of"):
    fcol.dynamic_embedding_column(_columns()["user"], DIM, combiner="max")
  with pytest.raises(ValueError, match="dtype must be tf.int64 or tf.string"):
    fcol.categorical_column_with_dynamic_vocabulary("price", tf.float32)
  with pytest.raises(ValueError, match="'user' has no bucket count"):
    tf.feature_column.embedding_column(_columns()["user"], DIM).create_state(None)
  weighted = tf.feature_column.weighted_categorical_column(_columns()["item"], "item_weight")
  layer = tf.keras.layers.DenseFeatures([fcol.dynamic_embedding_column(weighted, DIM)])
  with pytest.raises(ValueError, match="weighted categorical columns are not supported"):
    layer({"item": tf.constant([[1]], tf.int64), "item_weight": tf.constant([[1.0]])})


@pytest.mark.parametrize("canned", ["DNNClassifier", "DNNLinearCombinedClassifier"])
def test_canned_estimators_train_the_tables_with_their_wrapped_optimizer(tmp_path, canned):
  """The label is the user id's parity: only trained user rows can predict it."""
  user = fcol.categorical_column_with_dynamic_vocabulary("user", tf.int64)
  city = fcol.categorical_column_with_dynamic_vocabulary("city", tf.string)
  columns = [fcol.dynamic_embedding_column(user, DIM), fcol.dynamic_embedding_column(city, DIM)]
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3))
  if canned == "DNNClassifier":
    estimator = tf.compat.v1.estimator.DNNClassifier(
      [8], columns, model_dir=str(tmp_path), optimizer=optimizer
    )
  else:
    estimator = tf.compat.v1.estimator.DNNLinearCombinedClassifier(
      model_dir=str(tmp_path),
      linear_feature_columns=[tf.feature_column.categorical_column_with_hash_bucket("city", 5)],
      dnn_feature_columns=columns,
      dnn_hidden_units=[8],
      dnn_optimizer=optimizer,
    )
  rng = np.random.default_rng(1)
  features = {
    "user": rng.integers(10**12, 10**12 + 50, (512, 1)),
    "city": rng.choice(np.array([b"a", b"b", b"c"]), (512, 1)),
  }
  labels = (features["user"][:, 0] % 2).astype(np.int64)

  def input_fn():
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat(4).batch(32)

  estimator.train(input_fn)
  assert estimator.evaluate(input_fn, steps=4)["auc"] > 0.95
  assert any(
    name.endswith("user_dynamic_embedding-slot_initial_values")
    for name in estimator.get_variable_names()
  )


def test_a_keras_model_with_dense_features_saves_and_loads_in_a_fresh_process(tmp_path):
  user = fcol.categorical_column_with_dynamic_vocabulary("user", tf.int64)
  column = fcol.dynamic_embedding_column(
    user, DIM, combiner="sum", initializer="normal", admission=tf_ext.FrequencyAdmission(2)
  )
  assert DynamicEmbeddingColumn.from_config(column.get_config()) == column
  inputs = {"user": tf.keras.Input(shape=(1,), dtype=tf.int64, name="user")}
  hidden = tf.keras.layers.DenseFeatures([column])(inputs)
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
  model.compile(tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1)), "mse")
  ids = np.array([[5], [6], [5], [10**13]], np.int64)
  model.fit({"user": ids}, np.ones(4, np.float32), epochs=3, verbose=0)
  expected = model.predict({"user": ids}, verbose=0)
  model.save(str(tmp_path / "saved"))
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    model = tf.keras.models.load_model({str(tmp_path / "saved")!r})
    got = model.predict({{"user": np.array({ids.tolist()}, np.int64)}}, verbose=0)
    np.testing.assert_allclose(got, np.array({expected.tolist()}), rtol=1e-6)
  """)

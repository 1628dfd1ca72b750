"""Training works in Keras fit, Estimator, a TF1 session and a tf.function GradientTape loop."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ext

VOCAB = 200


def _click_data(n, seed=0):
  """Labels depend on a hidden per-id bias, so a model that learns the table beats chance."""
  rng = np.random.default_rng(seed)
  bias = np.random.default_rng(123).normal(0, 2.0, VOCAB)
  ids = rng.integers(0, VOCAB, n).astype(np.int64)
  labels = (rng.random(n) < 1 / (1 + np.exp(-bias[ids]))).astype(np.float32)
  return ids * 1_000_003 + 7, labels  # sparse, large ids


def _auc(labels, scores):
  order = np.argsort(scores)
  ranks = np.empty(len(scores))
  ranks[order] = np.arange(1, len(scores) + 1)
  pos = labels == 1
  return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def _keras_model(optimizer):
  ids = tf.keras.Input(shape=(), dtype=tf.int64, name="ids")
  emb = tf_ext.keras.layers.DynamicEmbedding(8, initializer="zeros", name="item_emb")(ids)
  out = tf.keras.layers.Dense(1, activation="sigmoid")(emb)
  model = tf.keras.Model(ids, out)
  model.compile(optimizer=tf_ext.DynamicEmbeddingOptimizer(optimizer), loss="binary_crossentropy")
  return model


@pytest.mark.parametrize(
  "make_opt",
  [lambda: tf.keras.optimizers.Adam(0.05), lambda: tf.keras.optimizers.legacy.Adagrad(0.5)],
)
def test_keras_fit_learns_and_evaluation_does_not_grow_table(make_opt):
  ids, labels = _click_data(6000)
  model = _keras_model(make_opt())
  model.fit(ids, labels, batch_size=256, epochs=3, verbose=0)
  table = model.get_layer("item_emb").table
  assert int(table.size()) == len(np.unique(ids))
  unseen = np.arange(10**12, 10**12 + 500, dtype=np.int64)
  model.predict(unseen, verbose=0)
  model.evaluate(unseen, np.zeros(500), verbose=0)
  assert int(table.size()) == len(np.unique(ids))
  test_ids, test_labels = _click_data(3000, seed=1)
  assert _auc(test_labels, model.predict(test_ids, verbose=0)[:, 0]) > 0.75


def test_tf_function_gradient_tape_loop():
  table = tf_ext.get_dynamic_embedding_variable("tape_table", 4, initializer="zeros")
  dense = tf.keras.layers.Dense(1)
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))

  @tf.function
  def step(ids, labels):
    with tf.GradientTape() as tape:
      logits = dense(tf_ext.embedding_lookup(table, ids))[:, 0]
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
    variables = [table.gradient_anchor] + dense.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  ids, labels = _click_data(4000)
  losses = [float(step(ids[i : i + 200], labels[i : i + 200])) for i in range(0, 4000, 200)]
  assert np.mean(losses[-5:]) < np.mean(losses[:5])
  assert int(table.size()) == len(np.unique(ids))


def test_estimator_with_custom_model_fn(tmp_path):
  ids, labels = _click_data(4000)

  def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat(3).batch(200)

  def model_fn(features, labels, mode):
    emb = tf_ext.dynamic_embedding(features["ids"], 8, name="est_emb", initializer="zeros")
    logits = tf.compat.v1.layers.dense(emb, 1)[:, 0]
    predictions = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
    opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    metrics = {"auc": tf.compat.v1.metrics.auc(labels, predictions)}
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)

  estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path))
  estimator.train(input_fn)
  result = estimator.evaluate(
    lambda: tf.data.Dataset.from_tensor_slices(
      ({"ids": _click_data(2000, 1)[0]}, _click_data(2000, 1)[1])
    ).batch(500)
  )
  assert result["global_step"] == 60
  assert result["auc"] > 0.75  # restored from the checkpoint the training wrote


def test_session_training_of_two_tables_and_ragged_sparse_combiners():
  with tf.Graph().as_default():
    ragged_ph = tf.compat.v1.ragged.placeholder(tf.int64, 1, [])
    sparse_ph = tf.compat.v1.sparse_placeholder(tf.string)
    a = tf_ext.dynamic_embedding(ragged_ph, 4, name="ragged_emb", combiner="sqrtn", initializer=0.5)
    b = tf_ext.dynamic_embedding(sparse_ph, 4, name="sparse_emb", combiner="sum", initializer=0.25)
    loss = tf.reduce_sum(tf.square(a + b - 2.0))
    train = tf_ext.DynamicEmbeddingOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.05)
    ).minimize(loss)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      feed = {
        ragged_ph: tf.compat.v1.ragged.RaggedTensorValue(
          np.array([1, 2, 3], np.int64), np.array([0, 2, 3], np.int64)
        ),
        sparse_ph: tf.compat.v1.SparseTensorValue(
          [[0, 0], [0, 1], [1, 0]], [b"x", b"y", b"x"], [2, 2]
        ),
      }
      first = sess.run(loss, feed)
      for _ in range(30):
        sess.run(train, feed)
      assert sess.run(loss, feed) < first * 0.01


def test_lookup_of_distinct_ids_trains_as_the_plain_lookup_without_a_second_unique():
  """A graph that looks up a batch's tf.unique ids and gathers the rows back: the table update
  skips its own dedup (the gradient is keyed by distinct ids already) and trains the same rows."""
  ids = np.array([[3, 5, 3], [5, 9, 3]], np.int64)
  weights = np.arange(6, dtype=np.float32).reshape(2, 3, 1) / 10.0
  rows = {}
  for how in ("unique", "plain"):
    with tf.Graph().as_default() as graph:
      table = tf_ext.get_dynamic_embedding_variable(f"t_{how}", 4, initializer=0.5)
      if how == "unique":
        distinct, positions = tf.unique(tf.reshape(ids, [-1]))
        emb = tf.reshape(tf.gather(table.lookup(distinct), positions), [2, 3, 4])
      else:
        emb = table.lookup(ids)
      loss = tf.reduce_sum(tf.square(emb * weights - 1.0))
      opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3))
      train = opt.minimize(loss)
      dedups = [
        op for op in graph.get_operations() if "apply_gradient" in op.name and op.type == "Unique"
      ]
      assert len(dedups) == (0 if how == "unique" else 1)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          sess.run(train)
        rows[how] = sess.run(table.lookup([3, 5, 9]))
  np.testing.assert_allclose(rows["unique"], rows["plain"], rtol=1e-6)
  assert not np.allclose(rows["plain"], 0.5)  # it trained


def test_keras_layer_stays_float32_under_a_mixed_precision_policy():
  tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    rows = tf_ext.keras.layers.DynamicEmbedding(4, combiner="mean", name="mixed_policy_emb")(ids)
    assert rows.dtype == tf.float32
    hidden = tf.keras.layers.Dense(8)(rows)  # bf16 compute
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1, dtype="float32")(hidden))
    model.compile(tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1)), "mse")
    model.fit(np.arange(32).reshape(16, 2), np.ones((16, 1)), verbose=0)
    assert int(model.get_layer("mixed_policy_emb").table.size()) == 32
    with pytest.raises(ValueError, match="dtype must be float32"):
      tf_ext.keras.layers.DynamicEmbedding(4, dtype="bfloat16")
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")

"""A table trained by each optimizer matches an equivalent dense tf.Variable + tf.gather model."""

import numpy as np
import pytest
import tensorflow as tf
from _twins import graph_twins

import tf_ext

VOCAB, DIM, STEPS, BATCH = 20, 4, 6, 12


def _batches(every_row):
  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    if every_row:  # every row in every step: lazy (table) Adam equals dense Adam
      ids = np.concatenate([np.arange(VOCAB), rng.integers(0, VOCAB, BATCH)])
    else:  # random subsets with duplicates: exercises dedup + summed gradients
      ids = rng.integers(0, VOCAB, BATCH)
    yield ids.astype(np.int64), rng.normal(size=(len(ids), 1)).astype(np.float32)


def _initial_rows():
  return np.random.default_rng(1).normal(size=(VOCAB, DIM)).astype(np.float32)


def _loss(rows, dense_w, labels):
  return tf.reduce_mean(tf.square(tf.matmul(rows, dense_w) - labels))


KERAS = {
  "sgd": lambda: tf.keras.optimizers.SGD(0.3),
  "adagrad": lambda: tf.keras.optimizers.Adagrad(0.3, initial_accumulator_value=0.2),
  "adam": lambda: tf.keras.optimizers.Adam(0.05),
  "legacy_sgd": lambda: tf.keras.optimizers.legacy.SGD(0.3),
  "legacy_adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.3),
  "legacy_adam": lambda: tf.keras.optimizers.legacy.Adam(0.05),
}
V1 = {
  "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.3),
  "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.3, initial_accumulator_value=0.2),
  "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}


# Dense Adam also decays the moments of rows absent from a batch; table Adam is lazy by design,
# so Adam is compared with every row in every batch here and against a lazy reference below.
@pytest.mark.parametrize(
  "name,every_row", [(n, e) for n in sorted(KERAS) for e in (True, False) if e or "adam" not in n]
)
def test_keras_optimizers_match_dense_in_eager(name, every_row):
  init = _initial_rows()
  table = tf_ext.DynamicEmbeddingVariable(f"num_{name}_{every_row}", DIM, initializer="zeros")
  table.insert(np.arange(VOCAB), init)
  dense = tf.Variable(init)
  w_table, w_dense = tf.Variable(tf.ones([DIM, 1])), tf.Variable(tf.ones([DIM, 1]))
  opt_table = tf_ext.DynamicEmbeddingOptimizer(KERAS[name]())
  opt_dense = KERAS[name]()
  for ids, labels in _batches(every_row):
    with tf.GradientTape(persistent=True) as tape:
      loss_t = _loss(table.lookup(ids), w_table, labels)
      loss_d = _loss(tf.gather(dense, ids), w_dense, labels)
    vars_t = [table.gradient_anchor, w_table]
    opt_table.apply_gradients(zip(tape.gradient(loss_t, vars_t), vars_t))
    opt_dense.apply_gradients(zip(tape.gradient(loss_d, [dense, w_dense]), [dense, w_dense]))
  np.testing.assert_allclose(
    table.lookup(np.arange(VOCAB)).numpy(), dense.numpy(), rtol=2e-5, atol=2e-6
  )
  np.testing.assert_allclose(w_table.numpy(), w_dense.numpy(), rtol=2e-5, atol=2e-6)
  assert int(opt_table.iterations) == STEPS


@pytest.mark.parametrize("name", sorted(V1))
def test_v1_optimizers_match_dense_in_graph_mode(name):
  every_row = name == "adam"
  with tf.Graph().as_default():
    twins = graph_twins("v1_table", _initial_rows(), _loss, V1[name])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      twins.fit(sess, _batches(every_row))
      got, want = sess.run([twins.lookup_all, twins.dense])
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
      np.testing.assert_allclose(*sess.run([twins.w_table, twins.w_dense]), rtol=2e-5, atol=2e-6)
      assert sess.run(twins.step) == STEPS
      _, _, _, counts, last_steps, _ = sess.run(twins.table.export_with_slots())
      assert counts.max() <= STEPS and last_steps.max() == STEPS - 1


@pytest.mark.parametrize("bias_correction_step", ["row", "optimizer"])
def test_lazy_adam_matches_numpy_reference(bias_correction_step):
  """Rows absent from a batch keep their moments; bias correction uses the row's own count or
  the optimizer's step."""
  lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-7
  table = tf_ext.DynamicEmbeddingVariable(
    f"lazy_adam_{bias_correction_step}", 2, initializer="zeros"
  )
  opt = tf_ext.DynamicEmbeddingOptimizer(
    tf.keras.optimizers.Adam(lr, epsilon=eps), bias_correction_step=bias_correction_step
  )
  rows = {k: np.zeros(2) for k in range(3)}
  m = {k: np.zeros(2) for k in range(3)}
  v = {k: np.zeros(2) for k in range(3)}
  t = {k: 0 for k in range(3)}
  for step, ids in enumerate(([0, 1, 1], [2], [0, 2]), 1):
    grads = np.arange(len(ids) * 2, dtype=np.float32).reshape(-1, 2) + 1
    slices = tf.IndexedSlices(tf.constant(grads), tf.constant(ids, tf.int64))
    opt.apply_gradients([(slices, table.gradient_anchor)])
    summed = {}
    for k, g in zip(ids, grads):
      summed[k] = summed.get(k, 0) + g
    for k, g in summed.items():
      t[k] += 1
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      n = t[k] if bias_correction_step == "row" else step
      lr_t = lr * np.sqrt(1 - b2**n) / (1 - b1**n)
      rows[k] = rows[k] - lr_t * m[k] / (np.sqrt(v[k]) + eps)
  got = table.lookup([0, 1, 2]).numpy()
  np.testing.assert_allclose(got, np.stack([rows[k] for k in range(3)]), rtol=1e-5)
  keys, _, slots, counts, _, _ = (x.numpy() for x in table.export_with_slots())
  assert dict(zip(keys, counts)) == t


def test_string_keys_train_like_int_keys():
  ints = tf_ext.DynamicEmbeddingVariable("int_ids", 3, initializer="zeros")
  strs = tf_ext.DynamicEmbeddingVariable("str_ids", 3, key_dtype=tf.string, initializer="zeros")
  opt_i = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.5))
  opt_s = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.5))
  ids = np.array([3, 1, 3, 7])
  for _ in range(3):
    with tf.GradientTape(persistent=True) as tape:
      loss_i = tf.reduce_sum(tf.square(ints.lookup(ids) - 1.0))
      loss_s = tf.reduce_sum(tf.square(strs.lookup(tf.strings.as_string(ids)) - 1.0))
    opt_i.apply_gradients([(tape.gradient(loss_i, ints.gradient_anchor), ints.gradient_anchor)])
    opt_s.apply_gradients([(tape.gradient(loss_s, strs.gradient_anchor), strs.gradient_anchor)])
  np.testing.assert_allclose(
    ints.lookup(ids).numpy(), strs.lookup(tf.strings.as_string(ids)).numpy()
  )
  assert int(strs.size()) == 3

"""Momentum, FTRL, AMSGrad and Keras gradient clipping on table rows match the dense
tf.Variable + tf.gather model: the same ids, initial rows and labels train a table and a dense
variable side by side, in eager, tf.function, TF1 graph mode (MonitoredTrainingSession) and
Keras fit.

Table rows are updated lazily (only rows in the batch). Where TensorFlow's dense optimizer is
lazy too (TF1 and legacy Keras sparse updates of momentum and FTRL) the models are compared on
random batches with repeated ids; where it touches every row (Adam/AMSGrad, Keras 2.11+ momentum
and FTRL) they are compared with every row in every batch, and the lazy difference is shown.
"""

import numpy as np
import pytest
import tensorflow as tf
from _twins import graph_twins

import tf_ext
from tf_ext import _ops_loader

VOCAB, DIM, STEPS, BATCH = 20, 4, 6, 12
K, LEGACY, V1 = tf.keras.optimizers, tf.keras.optimizers.legacy, tf.compat.v1.train
TOLERANCE = {"rtol": 2e-5, "atol": 2e-6}
_FTRL = {
  "l1_regularization_strength": 0.01,
  "l2_regularization_strength": 0.1,
  "l2_shrinkage_regularization_strength": 0.05,
  "initial_accumulator_value": 0.2,
}


def _batches(every_row, steps=STEPS):
  rng = np.random.default_rng(0)
  for _ in range(steps):
    if every_row:  # every row in every step, some twice
      ids = np.concatenate([np.arange(VOCAB), rng.integers(0, VOCAB, BATCH)])
    else:  # random subsets with repeated ids: rows absent from a step, summed duplicates
      ids = rng.integers(0, VOCAB, BATCH)
    yield ids.astype(np.int64), rng.normal(size=(len(ids), 1)).astype(np.float32)


def _initial_rows():
  return np.random.default_rng(1).normal(size=(VOCAB, DIM)).astype(np.float32)


def _loss(rows, dense_w, labels):
  return tf.reduce_mean(tf.square(tf.matmul(rows, dense_w) - labels))


# name -> (make the optimizer, whether TF's dense update of an IndexedSlices gradient is lazy)
KERAS = {
  "sgd_momentum": (lambda: K.SGD(0.1, momentum=0.9), False),
  "sgd_nesterov": (lambda: K.SGD(0.1, momentum=0.9, nesterov=True), False),
  "legacy_sgd_momentum": (lambda: LEGACY.SGD(0.1, momentum=0.9), True),
  "legacy_sgd_nesterov": (lambda: LEGACY.SGD(0.1, momentum=0.9, nesterov=True), True),
  "adam_amsgrad": (lambda: K.Adam(0.05, amsgrad=True), False),
  "legacy_adam_amsgrad": (lambda: LEGACY.Adam(0.05, amsgrad=True), False),
  "ftrl": (lambda: K.Ftrl(0.2, beta=0.3, **_FTRL), False),
  "ftrl_power": (lambda: K.Ftrl(0.2, learning_rate_power=-0.7, **_FTRL), False),
  "legacy_ftrl": (lambda: LEGACY.Ftrl(0.2, beta=0.3, **_FTRL), True),
  "legacy_ftrl_power": (lambda: LEGACY.Ftrl(0.2, learning_rate_power=-0.7), True),
  # Clipping: the bounds are well under these gradients' norms and values, so they bind.
  "sgd_clipnorm": (lambda: K.SGD(0.3, clipnorm=0.05), True),
  "sgd_clipvalue": (lambda: K.SGD(0.3, clipvalue=0.01), True),
  "sgd_global_clipnorm": (lambda: K.SGD(0.3, global_clipnorm=0.05), True),
  "adam_amsgrad_global_clipnorm": (lambda: K.Adam(0.05, amsgrad=True, global_clipnorm=0.05), False),
  "legacy_sgd_clipnorm": (lambda: LEGACY.SGD(0.3, clipnorm=0.05), True),
  "legacy_sgd_momentum_clipvalue": (lambda: LEGACY.SGD(0.1, momentum=0.9, clipvalue=0.01), True),
  "legacy_ftrl_global_clipnorm": (lambda: LEGACY.Ftrl(0.2, global_clipnorm=0.05, **_FTRL), True),
  # Legacy Keras applies clipvalue, then the global norm.
  "legacy_sgd_clipvalue_global_clipnorm": (
    lambda: LEGACY.SGD(0.3, clipvalue=0.01, global_clipnorm=0.02),
    True,
  ),
}
_CLIPPING = ("clipnorm", "clipvalue", "global_clipnorm")


def _cases(optimizers):
  """(name, every_row): random batches too where the dense optimizer is lazy."""
  cases = []
  for name, (_, dense_is_lazy) in sorted(optimizers.items()):
    cases.append((name, True))
    if dense_is_lazy:
      cases.append((name, False))
  return cases


def _train_side_by_side(make, every_row, name, steps=STEPS, compile_steps=False):
  """Trains a table and a dense variable from the same rows; returns both rows and both dense w."""
  init = _initial_rows()
  table = tf_ext.DynamicEmbeddingVariable(f"opt_{name}", DIM, initializer="zeros")
  table.insert(np.arange(VOCAB), init)
  dense = tf.Variable(init)
  w_table, w_dense = tf.Variable(tf.ones([DIM, 1])), tf.Variable(tf.ones([DIM, 1]))
  opt_table = tf_ext.DynamicEmbeddingOptimizer(make())
  opt_dense = make()

  def step(ids, labels):
    with tf.GradientTape(persistent=True) as tape:
      loss_t = _loss(table.lookup(ids), w_table, labels)
      loss_d = _loss(tf.gather(dense, ids), w_dense, labels)
    vars_t = [table.gradient_anchor, w_table]
    opt_table.apply_gradients(zip(tape.gradient(loss_t, vars_t), vars_t))
    opt_dense.apply_gradients(zip(tape.gradient(loss_d, [dense, w_dense]), [dense, w_dense]))

  if compile_steps:
    step = tf.function(step)
  for ids, labels in _batches(every_row, steps):
    step(tf.constant(ids), tf.constant(labels))
  assert int(opt_table.iterations) == steps
  rows = table.lookup(np.arange(VOCAB)).numpy()
  return rows, dense.numpy(), w_table.numpy(), w_dense.numpy()


def _without_clipping(make):
  def make_unclipped():
    optimizer = make()
    config = optimizer.get_config()
    config.update({key: None for key in _CLIPPING})
    return type(optimizer).from_config(config)

  return make_unclipped


@pytest.mark.parametrize("name,every_row", _cases(KERAS))
def test_keras_optimizers_match_dense_in_eager(name, every_row):
  make, _ = KERAS[name]
  rows, dense, w_table, w_dense = _train_side_by_side(make, every_row, f"{name}_{every_row}")
  assert not np.allclose(rows, _initial_rows(), atol=1e-3)  # the rows trained
  np.testing.assert_allclose(rows, dense, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)
  if any(key in name for key in _CLIPPING):  # the clipping bound, or this test proves nothing
    _, unclipped, _, _ = _train_side_by_side(_without_clipping(make), every_row, f"{name}_unclip")
    assert np.abs(unclipped - dense).max() > 1e-2


@pytest.mark.parametrize(
  "name", ["ftrl", "sgd_nesterov", "adam_amsgrad_global_clipnorm", "legacy_sgd_clipnorm"]
)
def test_tf_function_steps_match_dense(name):
  rows, dense, w_table, w_dense = _train_side_by_side(
    KERAS[name][0], True, f"{name}_fn", compile_steps=True
  )
  np.testing.assert_allclose(rows, dense, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_amsgrad", "ftrl"])
def test_rows_absent_from_a_batch_do_not_move_unlike_keras_dense(name):
  """Keras 2.11+ updates every row of a dense variable for these; table rows are lazy."""
  init = _initial_rows()
  table = tf_ext.DynamicEmbeddingVariable(f"lazy_{name}", DIM, initializer="zeros")
  table.insert(np.arange(VOCAB), init)
  dense = tf.Variable(init)
  opt_table, opt_dense = tf_ext.DynamicEmbeddingOptimizer(KERAS[name][0]()), KERAS[name][0]()
  table_rows, dense_rows = [], []
  for ids in ([0, 1, 1], [0, 2], [1]):
    grads = tf.ones([len(ids), DIM])
    opt_table.apply_gradients(
      [(tf.IndexedSlices(grads, tf.constant(ids, tf.int64)), table.gradient_anchor)]
    )
    dense_grads = tf.IndexedSlices(grads, tf.constant(ids), dense_shape=tf.constant([VOCAB, DIM]))
    opt_dense.apply_gradients([(dense_grads, dense)])
    table_rows.append(table.lookup(np.arange(VOCAB)).numpy())
    dense_rows.append(dense.numpy())
  # Row 2 was in the second batch, not the third; rows from 3 on were in none.
  np.testing.assert_array_equal(table_rows[2][2], table_rows[1][2])
  np.testing.assert_array_equal(table_rows[2][3:], init[3:])
  assert not np.allclose(dense_rows[2][2], dense_rows[1][2])  # dense Keras moved it


# TF1 optimizers' sparse updates are lazy: compared on random batches too.
V1_OPTIMIZERS = {
  "momentum": lambda: V1.MomentumOptimizer(0.1, 0.9),
  "nesterov": lambda: V1.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
  "ftrl": lambda: V1.FtrlOptimizer(0.2),
  "ftrl_regularized": lambda: V1.FtrlOptimizer(0.2, learning_rate_power=-0.7, beta=0.3, **_FTRL),
  "ftrl_shrinkage_only": lambda: V1.FtrlOptimizer(0.2, l2_shrinkage_regularization_strength=0.1),
}


@pytest.mark.parametrize(
  "name,every_row", [(n, e) for n in sorted(V1_OPTIMIZERS) for e in (True, False)]
)
def test_v1_optimizers_match_dense_in_monitored_training_session(name, every_row):
  init = _initial_rows()
  with tf.Graph().as_default():
    twins = graph_twins("v1_opt_table", init, _loss, V1_OPTIMIZERS[name])
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
      twins.fit(sess, _batches(every_row))
      rows, want, w_table, w_dense, steps = sess.run(
        [twins.lookup_all, twins.dense, twins.w_table, twins.w_dense, twins.step]
      )
  assert steps == STEPS
  assert not np.allclose(rows, init, atol=1e-3)
  np.testing.assert_allclose(rows, want, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)


@pytest.mark.parametrize("name", ["legacy_adam_amsgrad", "legacy_sgd_clipvalue_global_clipnorm"])
def test_legacy_keras_optimizers_match_dense_in_graph_mode(name):
  with tf.Graph().as_default():
    twins = graph_twins("graph_keras_table", _initial_rows(), _loss, KERAS[name][0])
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
      twins.fit(sess, _batches(every_row=True))
      rows, want, w_table, w_dense = sess.run(
        [twins.lookup_all, twins.dense, twins.w_table, twins.w_dense]
      )
  np.testing.assert_allclose(rows, want, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)


def _fit_models(make, name):
  init = _initial_rows()
  ids = tf.keras.Input(shape=(), dtype=tf.int64)
  layer = tf_ext.keras.layers.DynamicEmbedding(DIM, initializer="zeros", name=f"fit_{name}")
  table_model = tf.keras.Model(
    ids, tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(layer(ids))
  )
  layer.table.insert(np.arange(VOCAB), init)
  embedding = tf.keras.layers.Embedding(
    VOCAB, DIM, embeddings_initializer=tf.keras.initializers.Constant(init)
  )
  dense_model = tf.keras.Model(
    ids, tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(embedding(ids))
  )
  table_model.compile(tf_ext.DynamicEmbeddingOptimizer(make()), "mse")
  dense_model.compile(make(), "mse")
  return table_model, layer.table, dense_model, embedding


@pytest.mark.parametrize(
  "name,make",
  [
    ("sgd_clipnorm", lambda: K.SGD(0.3, clipnorm=0.05)),
    (
      "legacy_momentum_global_clipnorm",
      lambda: LEGACY.SGD(0.1, momentum=0.9, global_clipnorm=0.05),
    ),
    ("legacy_ftrl_clipnorm", lambda: LEGACY.Ftrl(0.2, clipnorm=0.05, **_FTRL)),
  ],
)
def test_keras_fit_with_clipping_matches_dense(name, make):
  batches = list(_batches(every_row=False, steps=8))
  ids = np.concatenate([b[0] for b in batches])
  labels = np.concatenate([b[1] for b in batches])
  table_model, table, dense_model, embedding = _fit_models(make, name)
  for model in (table_model, dense_model):
    model.fit(ids, labels, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
  rows = table.lookup(np.arange(VOCAB)).numpy()
  np.testing.assert_allclose(rows, embedding.embeddings.numpy(), **TOLERANCE)
  np.testing.assert_allclose(
    table_model.layers[-1].kernel.numpy(), dense_model.layers[-1].kernel.numpy(), **TOLERANCE
  )
  assert int(table_model.optimizer.iterations) == 2 * len(batches)


def _l2_loss_ops(concrete_function):
  graph_def = concrete_function.graph.as_graph_def()
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  return sum(node.op == "L2Loss" for node in nodes)


@pytest.mark.parametrize(
  "make", [lambda: K.SGD(0.1, global_clipnorm=0.05), lambda: LEGACY.SGD(0.1, global_clipnorm=0.05)]
)
def test_global_clipnorm_takes_one_norm_over_table_and_dense_gradients(make):
  """tf.clip_by_global_norm takes one L2Loss per gradient: a second clipping of the dense
  gradients by the wrapped optimizer would add more."""
  table = tf_ext.DynamicEmbeddingVariable("one_global_norm", DIM, initializer="zeros")
  w = tf.Variable(tf.ones([DIM, 1]))
  optimizer = tf_ext.DynamicEmbeddingOptimizer(make())

  @tf.function
  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.matmul(table.lookup(ids), w))
    variables = [table.gradient_anchor, w]
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

  step(tf.constant([1, 2, 2], tf.int64))
  assert _l2_loss_ops(step.get_concrete_function(tf.constant([1], tf.int64))) == 2


@pytest.mark.parametrize(
  "make,with_table_step",
  [
    (lambda: K.SGD(0.1, clipnorm=0.01), True),
    (lambda: LEGACY.SGD(0.1, clipnorm=0.01), True),
    (lambda: K.SGD(0.1, global_clipnorm=0.01), False),
    (lambda: LEGACY.SGD(0.1, global_clipnorm=0.01), False),
  ],
)
def test_steps_without_table_gradients_clip_like_keras(make, with_table_step):
  """Dense-only steps (before and after a step with table gradients) are clipped once, as Keras
  clips them. (A table step changes a global norm, so the global cases have dense steps only.)"""
  table = tf_ext.DynamicEmbeddingVariable("clip_dense_only", DIM, initializer="zeros")
  w_table, w_dense = tf.Variable(tf.ones([DIM, 1])), tf.Variable(tf.ones([DIM, 1]))
  opt_table, opt_dense = tf_ext.DynamicEmbeddingOptimizer(make()), make()
  gradient = tf.constant([[1.0], [2.0], [3.0], [4.0]])  # norm 5.5: clipped to 0.01
  slices = tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([5], tf.int64))
  opt_table.apply_gradients([(gradient, w_table)])
  opt_dense.apply_gradients([(gradient, w_dense)])
  if with_table_step:
    opt_table.apply_gradients([(slices, table.gradient_anchor), (gradient, w_table)])
    opt_dense.apply_gradients([(gradient, w_dense)])
  opt_table.apply_gradients([(gradient, w_table)])
  opt_dense.apply_gradients([(gradient, w_dense)])
  np.testing.assert_allclose(w_table.numpy(), w_dense.numpy(), rtol=1e-6)
  steps = 2 + with_table_step
  np.testing.assert_allclose(np.linalg.norm(w_table.numpy() - 1), 0.1 * 0.01 * steps, rtol=1e-4)


def test_ftrl_slots_start_at_the_accumulator_value_and_zero():
  table = tf_ext.DynamicEmbeddingVariable("ftrl_slots", 2, initializer="zeros")
  optimizer = tf_ext.DynamicEmbeddingOptimizer(K.Ftrl(0.1, initial_accumulator_value=0.3))
  optimizer.apply_gradients(
    [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([4], tf.int64)), table.gradient_anchor)]
  )
  table.insert([9], [[1.0, 2.0]])  # a row that has not trained gets the initial slots
  keys, values, slots, counts, _, slot_initial_values = (
    x.numpy() for x in table.export_with_slots()
  )
  np.testing.assert_allclose(slot_initial_values, [0.3, 0.0])
  by_key = dict(zip(keys.tolist(), slots))
  np.testing.assert_allclose(by_key[9], [0.3, 0.3, 0.0, 0.0])
  np.testing.assert_allclose(by_key[4][:2], [1.3, 1.3], rtol=1e-6)  # accumulator + g^2
  assert by_key[4][2] != 0  # linear


def test_the_op_checks_the_hyperparameters_each_optimizer_takes():
  library = _ops_loader.load()
  table = tf_ext.DynamicEmbeddingVariable("hyper_count", 2, initializer="zeros")

  def apply(optimizer, hyperparameters):
    library.tf_ext_table_apply_gradient(
      table.resource_handle,
      tf.constant([3], tf.int64),
      tf.ones([1, 2]),
      0.1,
      0.9,
      0.999,
      1e-7,
      tf.constant(1, tf.int64),
      hyperparameters,
      dim=2,
      optimizer=optimizer,
    )

  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'hyper_count'.*'ftrl' takes 4 hyperparameters, got 1"
  ):
    apply("ftrl", [0.5])
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'hyper_count'.*'momentum' takes 1 hyperparameters, got 0"
  ):
    apply("momentum", [])
  apply("momentum", [0.5])


def test_graphs_written_before_the_new_optimizers_still_load():
  """A TfExtTableApplyGradient node without the attrs added since (tf_ext 0.1's graphs, e.g. in
  .meta files) imports with their defaults: no hyperparameters, no Nesterov."""
  with tf.Graph().as_default() as graph:
    table = tf_ext.get_dynamic_embedding_variable("old_graph", 2, initializer="zeros")
    _ops_loader.load().tf_ext_table_apply_gradient(
      table.resource_handle,
      tf.constant([3], tf.int64),
      tf.ones([1, 2]),
      0.1,
      0.9,
      0.999,
      1e-7,
      tf.constant(1, tf.int64),
      [],
      dim=2,
      optimizer="adam",
      name="apply",
    )
  graph_def = graph.as_graph_def()
  (node,) = [n for n in graph_def.node if n.op == "TfExtTableApplyGradient"]
  for attr in ("num_hyperparameters", "use_nesterov"):
    del node.attr[attr]
  with tf.Graph().as_default() as imported:
    tf.graph_util.import_graph_def(graph_def, name="")
  op = imported.get_operation_by_name("apply")
  assert op.get_attr("num_hyperparameters") == 0 and op.get_attr("use_nesterov") is False

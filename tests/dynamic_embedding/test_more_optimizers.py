"""RMSprop, Adadelta, Adamax, Nadam and TF1's proximal optimizers and AdagradDA on table rows match
the dense tf.Variable + tf.gather model, in every API that has them: TF1 (tf.compat.v1.train),
Keras 2.11+ (tf.keras.optimizers), legacy Keras (tf.keras.optimizers.legacy) and TensorFlow's own
copy of it (tensorflow.python.keras.optimizer_v2).

Table rows are updated lazily and bias-corrected with the optimizer's step, or with each row's own
update count (bias_correction_step; see tf_ext/dynamic_embedding/optimizer.py). Every case is
compared with every row in every batch;
where TensorFlow's sparse update is lazy too and needs no per-row step (TF1's, legacy Keras'
RMSprop with momentum and Adadelta), also on random batches with rows absent from some steps.
"""

import numpy as np
import pytest
import tensorflow as tf
from _twins import graph_twins
from tensorflow.python.keras.optimizer_v2 import adadelta as tf_keras_adadelta
from tensorflow.python.keras.optimizer_v2 import adamax as tf_keras_adamax
from tensorflow.python.keras.optimizer_v2 import nadam as tf_keras_nadam
from tensorflow.python.keras.optimizer_v2 import rmsprop as tf_keras_rmsprop

import tf_ext

VOCAB, DIM, STEPS, BATCH = 16, 4, 6, 10
K, LEGACY, V1 = tf.keras.optimizers, tf.keras.optimizers.legacy, tf.compat.v1.train
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

# Keras 2.11+ optimizers XLA-compile their updates on a GPU, where Nadam's cached momentum product
# then advances once per variable (its counter is a Python int): the dense twins would be wrong.
_NO_JIT = {"jit_compile": False}


class _TfKeras:
  """tensorflow.python.keras.optimizer_v2's classes under the names tf.keras.optimizers has."""

  RMSprop = tf_keras_rmsprop.RMSprop
  Adadelta = tf_keras_adadelta.Adadelta
  Adamax = tf_keras_adamax.Adamax
  Nadam = tf_keras_nadam.Nadam


def _keras_family(api, **extra):
  return {
    "rmsprop": lambda: api.RMSprop(0.01, rho=0.8, **extra),
    "rmsprop_centered": lambda: api.RMSprop(0.01, centered=True, epsilon=1e-4, **extra),
    "rmsprop_momentum": lambda: api.RMSprop(0.01, momentum=0.9, **extra),
    "rmsprop_centered_momentum": lambda: api.RMSprop(
      0.01, momentum=0.5, centered=True, epsilon=1e-4, **extra
    ),
    "adadelta": lambda: api.Adadelta(1.0, rho=0.9, epsilon=1e-3, **extra),
    "adamax": lambda: api.Adamax(0.05, beta_1=0.8, **extra),
    "nadam": lambda: api.Nadam(0.05, **extra),
  }


# name -> (make the optimizer, whether TF's sparse update is lazy with no per-step state)
KERAS = {}
for _prefix, _api, _extra, _lazy in (
  ("keras", K, _NO_JIT, ()),
  ("legacy", LEGACY, {}, ("rmsprop_momentum", "rmsprop_centered_momentum", "adadelta")),
  ("tf_keras", _TfKeras, {}, ("rmsprop_momentum", "rmsprop_centered_momentum", "adadelta")),
):
  for _name, _make in _keras_family(_api, **_extra).items():
    KERAS[f"{_prefix}_{_name}"] = (_make, _name in _lazy)
# Legacy Nadam's momentum schedule decays with its schedule_decay (0.004 by default).
KERAS["legacy_nadam_schedule_decay"] = (lambda: LEGACY.Nadam(0.05, schedule_decay=0.2), False)
KERAS["tf_keras_nadam_schedule_decay"] = (lambda: _TfKeras.Nadam(0.05, schedule_decay=0.2), False)
KERAS["keras_nadam_betas"] = (lambda: K.Nadam(0.05, beta_1=0.7, beta_2=0.9, **_NO_JIT), False)


def _batches(every_row, steps=STEPS, seed=0):
  rng = np.random.default_rng(seed)
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


def _cases(optimizers):
  cases = []
  for name, (_, lazy) in sorted(optimizers.items()):
    cases.append((name, True))
    if lazy:
      cases.append((name, False))
  return cases


def _train_side_by_side(
  make_table, make_dense, every_row, name, compile_steps=False, v1=False, steps=STEPS
):
  """Trains a table and a dense variable from the same rows; returns both rows and both dense w.
  make_*(step variable) makes each side's optimizer; TF1 ones advance their own global step."""
  init = _initial_rows()
  table = tf_ext.DynamicEmbeddingVariable(f"more_{name}", DIM, initializer="zeros")
  table.insert(np.arange(VOCAB), init)
  dense = tf.Variable(init)
  w_table, w_dense = tf.Variable(tf.ones([DIM, 1])), tf.Variable(tf.ones([DIM, 1]))
  step_table, step_dense = (tf.Variable(0, dtype=tf.int64) for _ in range(2))
  opt_table = tf_ext.DynamicEmbeddingOptimizer(make_table(step_table))
  opt_dense = make_dense(step_dense)
  kwargs_table = {"global_step": step_table} if v1 else {}
  kwargs_dense = {"global_step": step_dense} if v1 else {}

  def step(ids, labels):
    with tf.GradientTape(persistent=True) as tape:
      loss_t = _loss(table.lookup(ids), w_table, labels)
      loss_d = _loss(tf.gather(dense, ids), w_dense, labels)
    vars_t = [table.gradient_anchor, w_table]
    opt_table.apply_gradients(zip(tape.gradient(loss_t, vars_t), vars_t), **kwargs_table)
    opt_dense.apply_gradients(
      zip(tape.gradient(loss_d, [dense, w_dense]), [dense, w_dense]), **kwargs_dense
    )

  if compile_steps:
    step = tf.function(step)
  for ids, labels in _batches(every_row, steps):
    step(tf.constant(ids), tf.constant(labels))
  if v1:
    assert int(step_table) == int(step_dense) == steps
  else:
    assert int(opt_table.iterations) == steps
  rows = table.lookup(np.arange(VOCAB)).numpy()
  return rows, dense.numpy(), w_table.numpy(), w_dense.numpy()


def _expect_match(rows, dense, w_table, w_dense):
  assert not np.allclose(rows, _initial_rows(), atol=1e-3)  # the rows trained
  np.testing.assert_allclose(rows, dense, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)


@pytest.mark.parametrize("name,every_row", _cases(KERAS))
def test_keras_optimizers_match_dense_in_eager(name, every_row):
  make, _ = KERAS[name]
  _expect_match(
    *_train_side_by_side(lambda _: make(), lambda _: make(), every_row, f"{name}_{every_row}")
  )


@pytest.mark.parametrize(
  "name", ["keras_rmsprop_centered_momentum", "keras_adamax", "legacy_nadam", "tf_keras_adadelta"]
)
def test_keras_tf_function_steps_match_dense(name):
  make, _ = KERAS[name]
  _expect_match(*_train_side_by_side(lambda _: make(), lambda _: make(), True, f"{name}_fn", True))


@pytest.mark.parametrize(
  "name,make",
  [
    ("legacy_nadam_long", KERAS["legacy_nadam"][0]),
    ("keras_nadam_long", lambda: K.Nadam(0.05, beta_1=0.5, **_NO_JIT)),
  ],
)
def test_nadam_past_the_steps_where_its_momentum_product_matters(name, make):
  """Nadam's momentum product falls below 1e-20 here within 60 steps (legacy: 59, Keras 2.11+ with
  beta_1 0.5: 49), where tf_ext stops multiplying it out and takes it as 0: rows still match."""
  _expect_match(*_train_side_by_side(lambda _: make(), lambda _: make(), True, name, steps=60))


# TF1: every sparse update here is lazy, AdagradDA's with the global step for every row.
V1_OPTIMIZERS = {
  "rmsprop": lambda step: V1.RMSPropOptimizer(0.01, decay=0.8),
  "rmsprop_centered": lambda step: V1.RMSPropOptimizer(0.01, centered=True, epsilon=1e-4),
  "rmsprop_momentum": lambda step: V1.RMSPropOptimizer(0.01, momentum=0.9),
  "rmsprop_centered_momentum": lambda step: V1.RMSPropOptimizer(
    0.01, momentum=0.5, centered=True, epsilon=1e-4
  ),
  "adadelta": lambda step: V1.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-3),
  "proximal_sgd": lambda step: V1.ProximalGradientDescentOptimizer(0.1),
  "proximal_sgd_l1_l2": lambda step: V1.ProximalGradientDescentOptimizer(
    0.1, l1_regularization_strength=0.05, l2_regularization_strength=0.2
  ),
  "proximal_adagrad": lambda step: V1.ProximalAdagradOptimizer(0.3),
  "proximal_adagrad_l1_l2": lambda step: V1.ProximalAdagradOptimizer(
    0.3,
    initial_accumulator_value=0.2,
    l1_regularization_strength=0.05,
    l2_regularization_strength=0.2,
  ),
  "adagrad_da": lambda step: V1.AdagradDAOptimizer(0.3, step),
  "adagrad_da_l1_l2": lambda step: V1.AdagradDAOptimizer(
    0.3,
    step,
    initial_gradient_squared_accumulator_value=0.2,
    l1_regularization_strength=0.01,
    l2_regularization_strength=0.2,
  ),
}


@pytest.mark.parametrize(
  "name,every_row", [(n, e) for n in sorted(V1_OPTIMIZERS) for e in (True, False)]
)
def test_v1_optimizers_match_dense_in_eager(name, every_row):
  make = V1_OPTIMIZERS[name]
  _expect_match(*_train_side_by_side(make, make, every_row, f"v1_{name}_{every_row}", v1=True))


def test_v1_adagrad_da_reads_the_global_step_of_each_step():
  """A tf.function step reads the optimizer's global step when it runs, not when traced."""
  make = V1_OPTIMIZERS["adagrad_da_l1_l2"]
  _expect_match(*_train_side_by_side(make, make, False, "v1_adagrad_da_fn", True, v1=True))


@pytest.mark.parametrize(
  "name", ["rmsprop", "rmsprop_centered_momentum", "adadelta", "proximal_adagrad_l1_l2"]
)
def test_v1_optimizers_match_dense_in_monitored_training_session(name):
  init = _initial_rows()
  with tf.Graph().as_default():
    twins = graph_twins("more_v1_table", init, _loss, lambda: V1_OPTIMIZERS[name](None))
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
      twins.fit(sess, _batches(every_row=False))
      rows, want, w_table, w_dense = sess.run(
        [twins.lookup_all, twins.dense, twins.w_table, twins.w_dense]
      )
  assert not np.allclose(rows, init, atol=1e-3)
  np.testing.assert_allclose(rows, want, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)


def test_v1_adagrad_da_in_a_session_with_its_own_global_step():
  """The table reads AdagradDA's global step before minimize advances it, as TensorFlow does."""
  init = _initial_rows()
  with tf.Graph().as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    table = tf_ext.get_dynamic_embedding_variable("more_v1_da", DIM, initializer="zeros")
    dense = tf.compat.v1.get_variable("dense", initializer=init, use_resource=True)
    w_t = tf.compat.v1.get_variable("w_t", initializer=tf.ones([DIM, 1]), use_resource=True)
    w_d = tf.compat.v1.get_variable("w_d", initializer=tf.ones([DIM, 1]), use_resource=True)
    steps = [
      tf.compat.v1.get_variable(f"step_{s}", initializer=tf.constant(0, tf.int64)) for s in "td"
    ]
    make = V1_OPTIMIZERS["adagrad_da_l1_l2"]
    train_t = tf_ext.DynamicEmbeddingOptimizer(make(steps[0])).minimize(
      _loss(table.lookup(ids), w_t, labels),
      var_list=[table.gradient_anchor, w_t],
      global_step=steps[0],
    )
    train_d = make(steps[1]).minimize(
      _loss(tf.gather(dense, ids), w_d, labels), var_list=[dense, w_d], global_step=steps[1]
    )
    insert = table.insert(np.arange(VOCAB), init)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(insert)
      for batch_ids, batch_labels in _batches(every_row=False):
        sess.run([train_t, train_d], {ids: batch_ids, labels: batch_labels})
      rows, want = sess.run([table.lookup(np.arange(VOCAB)), dense])
      assert sess.run(steps) == [STEPS, STEPS]
  assert not np.allclose(rows, init, atol=1e-3)
  np.testing.assert_allclose(rows, want, **TOLERANCE)


@pytest.mark.parametrize("name", ["legacy_nadam", "legacy_rmsprop_centered"])
def test_legacy_keras_optimizers_match_dense_in_graph_mode(name):
  with tf.Graph().as_default():
    twins = graph_twins("more_graph_keras_table", _initial_rows(), _loss, KERAS[name][0])
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
      twins.fit(sess, _batches(every_row=True))
      rows, want, w_table, w_dense = sess.run(
        [twins.lookup_all, twins.dense, twins.w_table, twins.w_dense]
      )
  np.testing.assert_allclose(rows, want, **TOLERANCE)
  np.testing.assert_allclose(w_table, w_dense, **TOLERANCE)


@pytest.mark.parametrize("name", ["legacy_adam", "tf_keras_adamax", "tf_keras_nadam"])
def test_legacy_keras_optimizers_wrapped_eagerly_train_in_a_graph_built_later(name):
  """TFRA's suite wraps eagerly, then builds a TF1 graph: wrapping must create none of the
  optimizer's variables (eager ones, which the graph cannot read)."""
  make = (lambda: LEGACY.Adam(0.05)) if name == "legacy_adam" else KERAS[name][0]
  wrapped = tf_ext.DynamicEmbeddingOptimizer(make())
  assert not wrapped.variables()
  made = iter([wrapped, make()])
  with tf.Graph().as_default():
    twins = graph_twins(f"more_wrapped_eagerly_{name}", _initial_rows(), _loss, lambda: next(made))
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
      twins.fit(sess, _batches(every_row=True))
      rows, want = sess.run([twins.lookup_all, twins.dense])
  np.testing.assert_allclose(rows, want, **TOLERANCE)


@pytest.mark.parametrize("name", ["keras_adamax", "keras_nadam", "keras_rmsprop_momentum"])
def test_rows_absent_from_a_batch_do_not_move_unlike_keras_dense(name):
  """Keras 2.11+ moves every row of a dense variable for these; table rows are lazy."""
  init = _initial_rows()
  table = tf_ext.DynamicEmbeddingVariable(f"more_lazy_{name}", DIM, initializer="zeros")
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
  # Row 0 was in the first two batches: both agree then. Row 2 was in the second batch, not the
  # third; rows from 3 on were in none.
  np.testing.assert_allclose(table_rows[1][0], dense_rows[1][0], **TOLERANCE)
  np.testing.assert_array_equal(table_rows[2][2], table_rows[1][2])
  np.testing.assert_array_equal(table_rows[2][3:], init[3:])
  assert not np.allclose(dense_rows[2][2], dense_rows[1][2])  # dense Keras moved it


def _late_row_adamax(name, **wrapper):
  """Rows of a table trained on ids [1], [1], [1], [5] by legacy Adamax(0.1)."""
  table = tf_ext.DynamicEmbeddingVariable(name, 2, initializer="zeros")
  optimizer = tf_ext.DynamicEmbeddingOptimizer(LEGACY.Adamax(0.1, epsilon=1e-12), **wrapper)
  for ids in ([1], [1], [1], [5]):
    optimizer.apply_gradients(
      [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant(ids, tf.int64)), table.gradient_anchor)]
    )
  return table.lookup([1, 5]).numpy()


def test_a_row_new_in_a_later_step_is_bias_corrected_as_a_new_row_by_its_own_count():
  """Adamax's first update of a row steps by the learning rate (m / u = sign(g) after 1 - beta1
  corrects m), whatever the optimizer's step; TensorFlow's global step would shrink it."""
  rows = _late_row_adamax("more_adamax_late_row", bias_correction_step="row")
  np.testing.assert_allclose(rows[1], [-0.1, -0.1], rtol=1e-5)


@pytest.mark.parametrize("bias_correction_step", ["auto", "optimizer"])
def test_by_the_optimizers_step_a_late_row_moves_as_legacy_adamaxs_lazy_sparse_update(
  bias_correction_step,
):
  """Legacy Keras Adamax's sparse update is lazy and corrects by the optimizer's step: the table
  matches it row for row, the late row included (its first step: lr (1 - beta1) / (1 - beta1^4))."""
  rows = _late_row_adamax(f"more_adamax_late_{bias_correction_step}")
  dense = tf.Variable(tf.zeros([6, 2]))
  optimizer = LEGACY.Adamax(0.1, epsilon=1e-12)
  for ids in ([1], [1], [1], [5]):
    optimizer.apply_gradients([(tf.IndexedSlices(tf.ones([1, 2]), tf.constant(ids)), dense)])
  np.testing.assert_allclose(rows, dense.numpy()[[1, 5]], rtol=1e-6)
  assert abs(rows[1][0] + 0.1 * 0.1 / (1 - 0.9**4)) < 1e-6


def test_optimizer_step_without_a_tf1_global_step_is_refused_and_auto_counts_rows():
  with tf.Graph().as_default():
    table = tf_ext.DynamicEmbeddingVariable("more_tf1_no_step", 2, initializer="zeros")
    gradient = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3], tf.int64))
    strict = tf_ext.DynamicEmbeddingOptimizer(V1.AdamOptimizer(0.1), "optimizer")
    with pytest.raises(ValueError, match="global_step"):
      strict.apply_gradients([(gradient, table.gradient_anchor)])
    auto = tf_ext.DynamicEmbeddingOptimizer(V1.AdamOptimizer(0.1))
    train = auto.apply_gradients([(gradient, table.gradient_anchor)])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train)
      session.run(train)
      # Row counts: each update a first-and-second row step of lr * sign(g).
      np.testing.assert_allclose(session.run(table.lookup([3])), [[-0.2, -0.2]], rtol=1e-5)


def test_tf1_adam_corrects_by_the_global_step_it_is_given():
  with tf.Graph().as_default():
    table = tf_ext.DynamicEmbeddingVariable("more_tf1_step", 1, initializer="zeros")
    step = tf.compat.v1.train.get_or_create_global_step()
    keys = tf.compat.v1.placeholder(tf.int64, [1])
    gradient = tf.IndexedSlices(tf.ones([1, 1]), keys)
    optimizer = tf_ext.DynamicEmbeddingOptimizer(V1.AdamOptimizer(0.1, epsilon=1e-12))
    train = optimizer.apply_gradients([(gradient, table.gradient_anchor)], global_step=step)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for key in (1, 1, 1, 7):
        session.run(train, {keys: [key]})
      # Row 7's first update at t = 4: lr * sqrt(1 - b2^4) / (1 - b1^4) * 0.1 / sqrt(0.001).
      t = 4
      expected = -0.1 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * 0.1 / np.sqrt(0.001)
      np.testing.assert_allclose(session.run(table.lookup([7])), [[expected]], rtol=1e-5)


def test_the_wrapper_refuses_an_unknown_bias_correction_step():
  with pytest.raises(ValueError, match="bias_correction_step"):
    tf_ext.DynamicEmbeddingOptimizer(K.Adam(0.1), bias_correction_step="global")


def _slots(table):
  keys, _, slots, _, _, slot_initial_values = (x.numpy() for x in table.export_with_slots())
  return dict(zip(keys.tolist(), slots)), slot_initial_values


@pytest.mark.parametrize(
  "make,initial",
  [
    (lambda: V1.RMSPropOptimizer(0.1), [1.0]),
    (lambda: V1.RMSPropOptimizer(0.1, momentum=0.9, centered=True), [1.0, 0.0, 0.0]),
    (lambda: K.RMSprop(0.1, centered=True), [0.0, 0.0]),
    (lambda: LEGACY.RMSprop(0.1, momentum=0.5), [0.0, 0.0]),
    (lambda: V1.ProximalAdagradOptimizer(0.1, initial_accumulator_value=0.3), [0.3]),
    (lambda: V1.ProximalGradientDescentOptimizer(0.1), []),
    (lambda: V1.AdagradDAOptimizer(0.1, tf.Variable(0, dtype=tf.int64)), [0.0, 0.1]),
    (lambda: K.Adadelta(0.1), [0.0, 0.0]),
    (lambda: LEGACY.Adamax(0.1), [0.0, 0.0]),
    (lambda: _TfKeras.Nadam(0.1), [0.0, 0.0]),
  ],
)
def test_slots_start_as_tensorflows(make, initial):
  table = tf_ext.DynamicEmbeddingVariable("more_slots", 2, initializer="zeros")
  optimizer = tf_ext.DynamicEmbeddingOptimizer(make())
  optimizer.apply_gradients(
    [(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([4], tf.int64)), table.gradient_anchor)]
  )
  table.insert([9], [[1.0, 2.0]])  # a row that has not trained gets the initial slots
  by_key, slot_initial_values = _slots(table)
  np.testing.assert_allclose(slot_initial_values, initial)
  np.testing.assert_allclose(by_key[9], np.repeat(initial, 2))


# ---- checkpoints ---------------------------------------------------------------------------------


def _checkpoint_model(name, make):
  table = tf_ext.DynamicEmbeddingVariable(name, DIM, initializer="truncated_normal")
  w = tf.Variable(tf.ones([DIM, 1]), name="w")
  return table, w, tf_ext.DynamicEmbeddingOptimizer(make())


def _checkpoint_step(table, w, optimizer, step):
  rng = np.random.default_rng(step)
  ids = rng.integers(0, 40, 12).astype(np.int64)
  labels = rng.normal(size=(12, 1)).astype(np.float32)
  with tf.GradientTape() as tape:
    loss = _loss(table.lookup(ids), w, labels)
  variables = [table.gradient_anchor, w]
  optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _contents(table):
  keys, values, slots, counts, steps, initial = (x.numpy() for x in table.export_with_slots())
  order = np.argsort(keys)
  return keys[order], values[order], slots[order], counts[order], steps[order], initial


@pytest.mark.parametrize(
  "name,make,num_slots",
  [
    ("centered_momentum", lambda: LEGACY.RMSprop(0.01, momentum=0.5, centered=True), 3),
    ("v1_rmsprop", lambda: V1.RMSPropOptimizer(0.01), 1),
    ("v1_adagrad_da", lambda: V1.AdagradDAOptimizer(0.1, tf.Variable(0, dtype=tf.int64)), 2),
    ("nadam", lambda: K.Nadam(0.02, **_NO_JIT), 2),
    ("adamax", lambda: _TfKeras.Adamax(0.02), 2),
  ],
)
def test_checkpoints_keep_the_new_optimizers_slots_and_training_continues_identically(
  tmp_path, name, make, num_slots
):
  table, w, optimizer = _checkpoint_model(f"more_ckpt_{name}", make)
  for step in range(4):
    _checkpoint_step(table, w, optimizer, step)
  path = tf.train.Checkpoint(table=table, w=w, opt=optimizer).write(str(tmp_path / "ckpt"))
  saved = _contents(table)
  assert saved[2].shape[1] == num_slots * DIM
  assert not np.allclose(saved[2], np.repeat(saved[5], DIM))  # the slots trained
  for step in range(4, 8):
    _checkpoint_step(table, w, optimizer, step)
  uninterrupted = _contents(table)

  # Restored rows carry their slots and update counts (the steps of the bias corrections): training
  # on from them repeats the uninterrupted run.
  table2, w2, optimizer2 = _checkpoint_model(f"more_ckpt_{name}_restored", make)
  _checkpoint_step(table2, w2, optimizer2, 99)  # other rows and slots before the restore
  tf.train.Checkpoint(table=table2, w=w2, opt=optimizer2).read(path).assert_consumed()
  for a, b in zip(saved, _contents(table2)):
    np.testing.assert_array_equal(a, b)
  for step in range(4, 8):
    _checkpoint_step(table2, w2, optimizer2, step)
  for a, b in zip(uninterrupted, _contents(table2)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_unsupported_optimizers_name_the_supported_ones():
  with pytest.raises(tf.errors.InvalidArgumentError, match="Adafactor is not supported;.*RMSprop"):
    tf_ext.DynamicEmbeddingOptimizer(K.Adafactor(0.1))

"""tf_ext.jit.Bucketing: the compilation cache's TF1 Session / Estimator path. Padded batches
train exactly like unpadded ones (losses, dense weights, table rows, predictions), the XLA
clusters of graph_optimizations compile once per bucket shape, and the plan survives a restart."""

import collections
import contextlib
import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext import graph_optimizations, jit

# Batch sizes of a stream: 14 distinct sizes, some repeated.
SIZES = [37, 5, 64, 12, 64, 33, 1, 50, 64, 29, 17, 64, 8, 45, 64, 21, 3, 64, 60, 64]
WIDTH = 3  # ids per row at most
DENSE = 5
_tables = iter(range(10**6))


def stream(sizes, seed=0):
  """(features, label) batches: sparse ids (some rows empty), a ragged id list, dense floats."""
  rng = np.random.default_rng(seed)
  batches = []
  for n in sizes:
    ids = rng.integers(1, 40, (n, WIDTH)) * (rng.random((n, WIDTH)) < 0.6)
    batches.append((ids, rng.normal(size=(n, DENSE)).astype(np.float32), rng.integers(0, 2, n)))

  def generate():
    yield from batches

  signature = (
    tf.TensorSpec([None, WIDTH], tf.int64),
    tf.TensorSpec([None, DENSE], tf.float32),
    tf.TensorSpec([None], tf.int64),
  )

  def to_features(ids, dense, label):
    features = {
      "ids": tf.sparse.from_dense(ids),
      "history": tf.RaggedTensor.from_tensor(ids, padding=0),
      "dense": dense,
    }
    return features, tf.cast(label, tf.float32)

  return tf.data.Dataset.from_generator(generate, output_signature=signature).map(to_features)


def model(features, label, learning_rate=0.1, names=None):
  """Two tf_ext tables (sparse and ragged ids), a dense tower, a masked batch-mean loss."""
  init = tf.constant_initializer(0.05)
  names = names or [f"bucketing_{next(_tables)}" for _ in range(2)]
  tables = [tf_ext.get_dynamic_embedding_variable(n, 4, initializer=init) for n in names]
  embedded = [
    tf_ext.embedding_lookup(tables[0], features["ids"], combiner="mean"),
    tf_ext.embedding_lookup(tables[1], features["history"], combiner="sum"),
  ]
  x = tf.concat(embedded + [features["dense"]], axis=1)
  hidden = tf.nn.relu(dense_layer(x, 8, seed=1))
  logit = tf.squeeze(dense_layer(hidden, 1, seed=2), axis=1)
  predictions = jit.unpad(tf.sigmoid(logit))
  if label is None:  # Estimator predict
    return None, None, predictions, tables
  per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit)
  loss = jit.masked_mean(per_example)
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(learning_rate))
  train = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  return loss, train, predictions, tables


def dense_layer(x, units, seed):
  glorot = tf.compat.v1.glorot_uniform_initializer(seed=seed)
  kernel = tf.compat.v1.get_variable(f"kernel_{seed}", [x.shape[1], units], initializer=glorot)
  bias = tf.compat.v1.get_variable(f"bias_{seed}", [units], initializer=tf.zeros_initializer())
  return tf.matmul(x, kernel) + bias


def run_session(sizes, bucketing=None, cluster=True):
  """Per step: (loss, predictions); then the dense variables and the tables' (keys, rows)."""
  graph = tf.Graph()
  with graph.as_default():
    dataset = stream(sizes)
    if bucketing is not None:
      dataset = bucketing.pad(dataset)
    features, label = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    scope = bucketing.padded(features) if bucketing is not None else contextlib.nullcontext()
    with scope:
      loss, train, predictions, tables = model(features, label)
    exports = [t.export()[:2] for t in tables]
    dense = tf.compat.v1.trainable_variables()
    config = graph_optimizations.config_proto(fuse_embeddings=True, cluster_dense_for_xla=cluster)
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      history = [session.run([loss, predictions, train])[:2] for _ in sizes]
      return history, session.run(dense), session.run(exports)


def sorted_rows(export):
  keys, rows = export
  order = np.argsort(keys)
  return keys[order], rows[order]


def compiles_per_cluster(after):
  return collections.Counter(e["cluster"] for e in jit.compile_log(after))


def test_padded_session_trains_like_the_unpadded_one_and_compiles_per_bucket():
  assert jit.listener_active()
  before = jit.compile_count()
  reference = run_session(SIZES, cluster=False)
  bucketing = jit.Bucketing(name="session", min_observations=4, async_compile=False)
  start = jit.compile_count()
  padded = run_session(SIZES, bucketing)
  assert start >= before

  for (loss_a, pred_a), (loss_b, pred_b), n in zip(reference[0], padded[0], SIZES):
    np.testing.assert_allclose(loss_b, loss_a, rtol=2e-5)
    assert pred_b.shape == (n,)  # unpad: the real rows only
    np.testing.assert_allclose(pred_b, pred_a, rtol=2e-5, atol=1e-6)
  for a, b in zip(reference[1], padded[1]):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
  for export_a, export_b in zip(reference[2], padded[2]):  # padded rows touch no table row
    keys_a, rows_a = sorted_rows(export_a)
    keys_b, rows_b = sorted_rows(export_b)
    np.testing.assert_array_equal(keys_b, keys_a)
    np.testing.assert_allclose(rows_b, rows_a, rtol=1e-4, atol=1e-6)

  shapes = bucketing.buckets()
  assert 1 < len(shapes) <= 8 < len(set(SIZES))
  assert sum(shapes.values()) == len(SIZES)
  assert bucketing.stats["elements"] == sum(SIZES)
  assert bucketing.stats["padding"] == sum(b[0] * n for b, n in shapes.items()) - sum(SIZES)
  compiles = compiles_per_cluster(start)
  assert compiles, "the dense part was not compiled by XLA"
  assert max(compiles.values()) <= len(shapes)
  kinds = [e["event"] for e in bucketing.events]
  assert "plan" in kinds and "bucket" in kinds


def dense_id_model(features, label):
  """Dense id tensors, as most CTR fields are: one id per row (a slice of the padded input), a
  [batch, 3] id list with a mean combiner, and string ids made from the int ones; Adam, whose
  update moves a row even for a zero gradient (momentum), so a looked-up padded id would show."""
  init = tf.constant_initializer(0.05)
  names = [f"dense_ids_{next(_tables)}" for _ in range(3)]
  tables = [tf_ext.get_dynamic_embedding_variable(names[0], 4, initializer=init)]
  tables.append(tf_ext.get_dynamic_embedding_variable(names[1], 4, initializer=init))
  tables.append(
    tf_ext.get_dynamic_embedding_variable(names[2], 4, key_dtype=tf.string, initializer=init)
  )
  ids = features["dense_ids"]
  embedded = [
    tf_ext.embedding_lookup(tables[0], ids[:, 0]),
    tf_ext.embedding_lookup(tables[1], ids, combiner="mean"),
    tf_ext.embedding_lookup(tables[2], tf.strings.as_string(ids[:, 1])),
  ]
  logit = tf.reduce_sum(tf.concat(embedded, axis=1), axis=1)
  loss = jit.masked_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
  train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss)
  return loss, train, tables


# Each size twice: TensorFlow's XLA compiles a shape when it sees it again.
DENSE_ID_SIZES = SIZES * 2


def run_dense_ids(bucketing=None, cluster=False):
  graph = tf.Graph()
  with graph.as_default():
    rng = np.random.default_rng(3)
    batches = [(rng.integers(1, 40, (n, WIDTH)), rng.integers(0, 2, n)) for n in DENSE_ID_SIZES]
    dataset = tf.data.Dataset.from_generator(
      lambda: iter(batches),
      output_signature=(tf.TensorSpec([None, WIDTH], tf.int64), tf.TensorSpec([None], tf.int64)),
    ).map(lambda ids, label: ({"dense_ids": ids}, tf.cast(label, tf.float32)))
    if bucketing is not None:
      dataset = bucketing.pad(dataset)
    features, label = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    scope = bucketing.padded(features) if bucketing is not None else contextlib.nullcontext()
    with scope:
      loss, train, tables = dense_id_model(features, label)
    exports = [t.export()[:2] for t in tables]
    config = graph_optimizations.config_proto(fuse_embeddings=True, cluster_dense_for_xla=cluster)
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      losses = [session.run([loss, train])[0] for _ in DENSE_ID_SIZES]
      return losses, session.run(exports)


def test_padded_dense_ids_look_up_and_update_no_table_row_and_compile_per_bucket():
  # A padded dense id is a 0, a real key: looked up, it would insert row 0 and Adam would move it.
  reference = run_dense_ids()
  bucketing = jit.Bucketing(name="dense_ids", min_observations=4, async_compile=False)
  start = jit.compile_count()
  padded = run_dense_ids(bucketing, cluster=True)
  assert bucketing.stats["padding"] > 0
  # The real rows' lookup is padded back outside the XLA cluster: it compiles per bucket, not
  # per real batch size.
  compiles = compiles_per_cluster(start)
  assert compiles, "the dense part was not compiled by XLA"
  assert max(compiles.values()) <= len(bucketing.buckets()) < len(set(SIZES))
  np.testing.assert_allclose(padded[0], reference[0], rtol=2e-5)
  for export_a, export_b in zip(reference[1], padded[1]):
    keys_a, rows_a = sorted_rows(export_a)
    keys_b, rows_b = sorted_rows(export_b)
    np.testing.assert_array_equal(keys_b, keys_a)  # no key 0 / b"0"
    np.testing.assert_allclose(rows_b, rows_a, rtol=1e-4, atol=1e-6)


def test_padded_extent_follows_casts_and_slices_that_keep_the_padded_axes():
  from tf_ext.jit.function import padded_extent

  seen = {}

  def body(x):
    seen["input"] = sorted(padded_extent(x))
    seen["column"] = sorted(padded_extent(x[:, 1]))
    seen["cast"] = sorted(padded_extent(tf.cast(x[:, :2], tf.int32)))
    seen["cut"] = sorted(padded_extent(x[:3]))  # cuts into the padded axis: not followed
    seen["other"] = sorted(padded_extent(x + 1))
    return jit.masked_sum(tf.cast(x, tf.float32))

  fn = jit.function(body, paddable={"x": "batch"}, min_observations=1)
  fn(tf.ones([5, 3], tf.int64))
  fn.close()
  assert seen == {"input": [0], "column": [0], "cast": [0], "cut": [], "other": []}
  assert padded_extent(tf.ones([2])) == {}  # outside a padded function


def test_async_compilation_is_switched_on_by_a_bucketing():
  previous = jit.set_async_compilation(False)
  try:
    jit.Bucketing(name="async")
    assert jit.set_async_compilation(False) is True
  finally:
    jit.set_async_compilation(bool(previous))


def test_estimator_predicts_the_real_rows_and_a_restart_reuses_the_plan(tmp_path):
  model_dir = str(tmp_path / "model")
  sizes = [30, 7, 30, 19, 30, 2, 30, 25] * 2

  def make_model_fn(bucketing):
    def model_fn(features, labels, mode):
      scope = bucketing.padded(features) if bucketing else contextlib.nullcontext()
      metrics = None
      with scope:
        loss, train, predictions, _ = model(features, labels, names=["ids", "history"])
        if mode == tf.estimator.ModeKeys.EVAL:  # metrics over the real rows: the unpadded ones
          metrics = {
            "mean_probability": tf.compat.v1.metrics.mean(predictions),
            "auc": tf.compat.v1.metrics.auc(jit.unpad(labels), predictions),
          }
      return tf.estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=train,
        predictions={"probability": predictions},
        eval_metric_ops=metrics,
      )

    return model_fn

  def predict(bucketing):
    estimator = tf.estimator.Estimator(make_model_fn(bucketing), model_dir=model_dir)

    def input_fn():
      dataset = stream(sizes, seed=1).map(lambda f, _: f)
      return bucketing.pad(dataset) if bucketing else dataset

    return np.array([p["probability"] for p in estimator.predict(input_fn)])

  trained = jit.Bucketing(name="ctr", plan_path=model_dir, min_observations=4)
  os.makedirs(model_dir)
  estimator = tf.estimator.Estimator(make_model_fn(trained), model_dir=model_dir)
  estimator.train(lambda: trained.pad(stream(sizes)))
  plan_file = os.path.join(model_dir, "tf_ext_jit_plan.ctr.json")
  saved = json.load(open(plan_file))
  assert saved["plans"][0]["dims"] == ["batch"] and saved["plans"][0]["buckets"]

  padded = predict(jit.Bucketing(name="ctr", plan_path=model_dir))
  unpadded = predict(None)
  assert padded.shape == unpadded.shape == (sum(sizes),)
  np.testing.assert_allclose(padded, unpadded, rtol=2e-5, atol=1e-6)

  def evaluate(bucketing):
    estimator = tf.estimator.Estimator(make_model_fn(bucketing), model_dir=model_dir)

    def input_fn():
      dataset = stream(sizes, seed=2)
      return bucketing.pad(dataset) if bucketing else dataset

    return estimator.evaluate(input_fn)

  padded_metrics = evaluate(jit.Bucketing(name="ctr", plan_path=model_dir))
  unpadded_metrics = evaluate(None)
  for key in ("loss", "mean_probability", "auc"):  # batch-mean loss and metrics: as unpadded
    np.testing.assert_allclose(padded_metrics[key], unpadded_metrics[key], rtol=2e-5)

  restarted = jit.Bucketing(name="ctr", plan_path=model_dir, min_observations=1000)
  assert restarted.plan() == trained.plan()  # no observation phase after a restart
  predict(restarted)
  # The saved plan's boundaries, or shapes made before the restart: no observation phase.
  planned = set(trained.plan()[("batch",)][0]) | {b[0] for b in trained.buckets()}
  assert {b[0] for b, used in restarted.buckets().items() if used} <= planned


def test_oversize_batches_are_not_padded_and_warn_once(caplog):
  bucketing = jit.Bucketing(name="oversize", max_size=40, min_observations=2, async_compile=False)
  with caplog.at_level(logging.WARNING, logger="tf_ext.jit"):
    history, _, _ = run_session([10, 12, 50, 60, 11], bucketing, cluster=False)
  assert [len(p) for _, p in history] == [10, 12, 50, 60, 11]
  assert bucketing.stats["oversize"] == 2
  assert sum("TF_EXT_JIT_MAX_SIZE" in r.getMessage() for r in caplog.records) == 1
  assert all(b[0] <= 40 for b in bucketing.buckets())


def test_only_declared_axes_are_padded():
  """A feature whose length is not the batch (here: a per-batch vector) keeps its shape."""
  bucketing = jit.Bucketing(
    ({"x": "batch", "scale": None}, "batch"), name="declared", min_observations=1
  )
  dataset = tf.data.Dataset.from_tensors(
    ({"x": tf.ones([17, 2]), "scale": tf.constant([2.0, 3.0])}, tf.ones([17]))
  )
  features, label = next(iter(bucketing.pad(dataset)))
  assert features["x"].shape == (18, 2) and label.shape == (18,)  # 17 rounded up: 18
  assert features["scale"].shape == (2,)
  np.testing.assert_array_equal(features[jit.SIZES_KEY], [[17], [18]])
  np.testing.assert_array_equal(features["x"][17], [0.0, 0.0])


def test_bad_input_fails_clearly():
  bucketing = jit.Bucketing(name="bad")
  with pytest.raises(TypeError, match="tf.data.Dataset"):
    bucketing.pad([1, 2, 3])
  with pytest.raises(TypeError, match="dict of features"):
    bucketing.pad(tf.data.Dataset.from_tensors(tf.ones([2, 2])))
  with pytest.raises(ValueError, match="tf_ext_jit_sizes"):
    with bucketing.padded({"x": tf.ones([2])}):
      pass
  with pytest.raises(ValueError, match="non-empty string"):
    jit.Bucketing(name="")
  with pytest.raises(ValueError, match="TF_EXT_JIT_MAX_EXECUTABLES"):
    jit.Bucketing(max_executables=0)
  mismatched = jit.Bucketing(name="mismatch", min_observations=1)
  dataset = tf.data.Dataset.from_tensors(({"a": tf.ones([3]), "b": tf.ones([2])}, tf.ones([3])))
  with pytest.raises(tf.errors.InvalidArgumentError, match="'batch' has sizes 3 and 2"):
    next(iter(mismatched.pad(dataset)))


@pytest.mark.parametrize(
  "loss_of, flagged",
  [
    (lambda y, x: tf.reduce_mean(tf.square(y - x[:, 0])), "a mean over the batch"),
    (
      lambda y, x: tf.keras.losses.BinaryCrossentropy(from_logits=True)(y[:, None], x[:, :1]),
      "the batch size used as a value",
    ),
    (
      lambda y, x: jit.masked_mean(tf.keras.layers.BatchNormalization()(x, training=True)[:, 0]),
      "batch_normalization/moments/mean",  # Keras' batch statistics on rank 2: a Mean
    ),
    (
      lambda y, x: tf.reduce_sum(x) / tf.cast(tf.shape(x)[0], tf.float32),
      "the batch size used as a value",
    ),
  ],
)
def test_a_model_whose_results_depend_on_the_batch_size_is_refused(loss_of, flagged):
  """Padding such a model would train on wrong numbers: padded() names the op instead."""
  bucketing = jit.Bucketing(name="dependent", min_observations=1, async_compile=False)
  with tf.Graph().as_default():
    dataset = bucketing.pad(stream([5]))
    features, label = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with pytest.raises(ValueError, match=flagged):
      with bucketing.padded(features):
        loss_of(label, features["dense"])
    with bucketing.padded(features, check=False):  # the user's call: not checked
      loss_of(label, features["dense"])
    with bucketing.padded(features):  # the masked forms pass the check, and their gradients
      weights = tf.compat.v1.get_variable("weights", [DENSE, 1])
      prediction = tf.squeeze(tf.matmul(features["dense"], weights), axis=1)
      loss = jit.masked_mean(tf.square(label - prediction))
      loss += jit.masked_sum(features["dense"]) / tf.cast(jit.size(), tf.float32)
      with tf.name_scope("train"):
        tf.compat.v1.train.AdamOptimizer().minimize(loss)


def test_sessions_close_only_after_the_compilations_in_flight():
  """TensorFlow's asynchronous compilation reads the Session's function library after the step:
  closing the Session under it crashes the process (checked while building this: a segmentation
  fault in the first round). A padded graph's Session waits for them in close()."""
  code = """
import logging, sys
sys.path.insert(0, {tests!r})
import test_bucketing as t
from tf_ext import jit
logging.basicConfig(level=logging.INFO)
for round_ in range(4):  # new bucket shapes up to the last step, then close at once
  bucketing = jit.Bucketing(name=f"race{{round_}}", min_observations=1)
  t.run_session([40 + round_, 90, 200, 7], bucketing)
print("all sessions closed")
""".format(tests=os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "all sessions closed" in proc.stdout
  assert "closing a Session after its" in proc.stderr  # it did wait, at least once


# How long a test waits for a speed-gate verdict: it needs the clusters' executables, which may
# compile in the background (TensorFlow's asynchronous compilation, turned on process-wide by an
# earlier Bucketing) while the steps run on uncompiled; on a loaded machine that takes any number
# of steps, so the wait is bounded in seconds, not steps.
VERDICT_TIMEOUT_S = 120


def gated_session(bucketing, steps=None, verdicts_after=None, timeout_s=VERDICT_TIMEOUT_S):
  """Trains batches of 33-64 rows (one bucket: 64) in a Session of a padded graph: `steps` of
  them, or with `verdicts_after` (a speed_verdicts sequence number) until a newer verdict is out
  (failing the test if none is within `timeout_s` seconds) and then 10 more, the pipeline told of
  it first; then one traced step. Returns (the traced step's executed node names, its partition
  graphs' op types, the losses)."""
  assert (steps is None) != (verdicts_after is None)
  sizes = list(np.random.default_rng(5).integers(33, 65, (steps or 64) + 11))
  graph = tf.Graph()
  with graph.as_default():
    dataset = stream(sizes)
    if verdicts_after is not None:
      dataset = dataset.repeat()  # as many steps as the verdict takes
    features, label = tf.compat.v1.data.make_one_shot_iterator(bucketing.pad(dataset)).get_next()
    with bucketing.padded(features):
      loss, train, _, _ = model(features, label)
    config = graph_optimizations.config_proto(fuse_embeddings=True, cluster_dense_for_xla=True)
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      if verdicts_after is None:
        losses = [session.run([loss, train])[0] for _ in range(steps)]
      else:
        compiles = jit.compile_count()
        start = time.monotonic()
        losses = []
        while not jit.speed_verdicts(verdicts_after):
          if time.monotonic() - start > timeout_s:
            pytest.fail(
              f"the speed gate gave no verdict in {timeout_s} s ({len(losses)} steps); the XLA "
              f"compilations of this Session: {jit.compile_log(compiles)}"
            )
          losses.append(session.run([loss, train])[0])
        bucketing.events  # noqa: B018 (reading the events polls the verdicts)
        losses += [session.run([loss, train])[0] for _ in range(10)]
      options = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True
      )
      metadata = tf.compat.v1.RunMetadata()
      session.run([loss, train], options=options, run_metadata=metadata)
  executed = {n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats}
  op_types = {n.op for g in metadata.partition_graphs for n in g.node}
  return executed, op_types, losses


def test_the_speed_gate_runs_the_clusters_the_way_the_timed_steps_chose():
  """The gate (Bucketing's TF_EXT_JIT_ADAPTIVE) times real steps with the dense clusters compiled
  and uncompiled, and then runs them the faster way; which way wins depends on the machine, so
  the test follows the verdict: after a compiled one the traced step ran _XlaRun; after an
  uncompiled one it ran the clusters' function calls without asking XLA (no _XlaCompile ran),
  and the batches stopped being padded."""
  after = (jit.speed_verdicts() or [{"sequence": 0}])[-1]["sequence"]
  bucketing = jit.Bucketing(
    name="gated", min_observations=10**6, async_compile=False, adaptive=True
  )
  # A verdict needs the executables (compiled when the shape is seen again, or in the
  # background where an earlier test turned asynchronous compilation on: then after any number
  # of steps), 8 ready steps and 12 timed steps each way.
  executed, op_types, losses = gated_session(bucketing, verdicts_after=after)
  assert {"TfExtXlaSpeedGate", "TfExtXlaSpeedGateReady", "_XlaCompile"} <= op_types
  assert np.all(np.isfinite(losses))
  verdicts = jit.speed_verdicts(after)
  assert len(verdicts) == 1, verdicts
  verdict = verdicts[0]
  assert "xla_compile" in verdict["clusters"]
  compiled, uncompiled = verdict["compiled_ns_per_element"], verdict["uncompiled_ns_per_element"]
  assert compiled > 0 and uncompiled > 0
  assert verdict["run_compiled"] == (compiled <= uncompiled * 1.05)
  ran = {
    kind: any(name.endswith(kind) for name in executed)
    for kind in ("/xla_compile", "/xla_run", "partitioned_call")
  }
  events = bucketing.events
  checks = [e for e in events if e["event"] == "speed check"]
  assert [e["clusters"] for e in checks] == [verdict["clusters"]]
  padding = [e["on"] for e in events if e["event"] == "padding"]
  if verdict["run_compiled"]:
    assert ran == {"/xla_compile": True, "/xla_run": True, "partitioned_call": False}, executed
    assert padding == []
  else:
    assert ran == {"/xla_compile": False, "/xla_run": False, "partitioned_call": True}, executed
    assert padding == [False]
    assert sum(bucketing.buckets().values()) < bucketing.stats["batches"]  # some unpadded


def test_the_speed_gate_is_off_without_adaptive():
  bucketing = jit.Bucketing(name="ungated", min_observations=10**6, adaptive=False)
  assert not jit.set_speed_gate(False)  # the Bucketing set it off
  jit.set_speed_gate(False)
  executed, op_types, _ = gated_session(bucketing, 4)
  assert "_XlaCompile" in op_types
  assert not {"TfExtXlaSpeedGate", "TfExtXlaSpeedGateReady"} & op_types

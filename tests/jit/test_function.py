"""tf_ext.jit.function: padded results equal unpadded ones (forward, gradients, a batch-mean loss
and metric, a sequence model, a training run), batch-size dependent functions are not padded,
calls never wait for the compiler, the cache is bounded, the plan survives a restart, oversized
inputs run uncompiled with one warning, and the settings reject bad values."""

import logging
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tf_ext.jit as jit
from tf_ext.jit import speed_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mlp(seed=0, width=16):
  tf.keras.utils.set_random_seed(seed)
  model = tf.keras.Sequential(
    [tf.keras.layers.Dense(width, activation="tanh"), tf.keras.layers.Dense(1)]
  )
  model.build((None, 8))
  return model


def batch(rng, n, features=8):
  x = rng.normal(size=(n, features)).astype("float32")
  y = (rng.normal(size=(n, 1)) > 0).astype("float32")
  return x, y


def loss_and_grads(model):
  """Per-example predictions, a batch-mean loss, a batch-mean metric and the gradients."""

  def fn(x, y):
    with tf.GradientTape() as tape:
      logits = model(x)
      per_example = tf.keras.losses.binary_crossentropy(y, logits, from_logits=True)
      loss = jit.masked_mean(per_example)
    grads = tape.gradient(loss, model.trainable_variables)
    accuracy = jit.masked_mean(tf.cast(tf.equal(y, tf.cast(logits > 0, tf.float32)), tf.float32))
    return {"logits": logits, "loss": loss, "accuracy": accuracy, "grads": grads}

  return fn


def assert_close(actual, expected):
  tf.nest.map_structure(
    lambda a, e: np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=2e-5, atol=2e-6),
    actual,
    expected,
  )


def test_forward_gradients_loss_and_metric_equal_the_unpadded_computation():
  model = mlp()
  fn = loss_and_grads(model)
  reference = tf.function(fn)  # plain TensorFlow on the unpadded batch
  ours = jit.function(fn, paddable={"x": "batch", "y": "batch"}, min_observations=4)
  rng = np.random.default_rng(0)
  sizes = [3, 17, 9, 32, 1, 25, 31, 8, 5, 30, 2, 16]
  for _round in range(2):
    for n in sizes:
      x, y = batch(rng, n)
      got = ours(x, y)
      assert got["logits"].shape == (n, 1)  # sliced back
      assert_close(got, reference(x, y))
    ours.wait_for_compiles()
  # The second round ran compiled (padded into buckets), and results were still equal.
  assert ours.compiles >= 1
  assert ours.stats["compiled"] + ours.stats["larger_bucket"] >= len(sizes)
  assert all(b[-1] == 32 for b in ours.plan()[("batch",)])


def test_training_with_padding_matches_plain_training():
  rng = np.random.default_rng(1)
  data = [batch(rng, int(n)) for n in rng.integers(1, 40, size=40)]

  def train(step_fn_factory):
    model = mlp(seed=3)
    optimizer = tf.keras.optimizers.Adam(0.01)

    def step(x, y):
      with tf.GradientTape() as tape:
        logits = model(x)
        loss = jit.masked_mean(tf.keras.losses.binary_crossentropy(y, logits, from_logits=True))
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    step = step_fn_factory(step)
    losses = []
    for i, (x, y) in enumerate(data):
      losses.append(float(step(x, y)))
      if i == 10 and isinstance(step, jit.Function):
        step.wait_for_compiles()  # so that most steps below run compiled and padded
    return model.get_weights(), losses, step

  expected_weights, expected_losses, _ = train(tf.function)
  weights, losses, ours = train(
    lambda f: jit.function(f, paddable={"x": "batch", "y": "batch"}, min_observations=5)
  )
  assert ours.stats["compiled"] + ours.stats["larger_bucket"] > 15
  np.testing.assert_allclose(losses, expected_losses, rtol=1e-4, atol=1e-5)
  for got, want in zip(weights, expected_weights):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_sequence_model_pads_batch_and_length():
  """DIN-style attention pooling over a padded behaviour sequence, masked with jit.mask."""
  tf.keras.utils.set_random_seed(5)
  embed = tf.keras.layers.Embedding(50, 8)
  score = tf.keras.layers.Dense(1)
  head = tf.keras.layers.Dense(1)

  def fn(history, lengths, target):
    seq = embed(history)  # [B, L, 8]
    real = tf.sequence_mask(lengths, tf.shape(history)[1])  # the caller's own mask
    weights = tf.squeeze(score(tf.concat([seq, seq * embed(target)[:, None]], -1)), -1)
    weights = tf.where(real & jit.mask("seq")[None, :], weights, -1e9)
    pooled = tf.reduce_sum(tf.nn.softmax(weights)[..., None] * seq, 1)
    logits = head(pooled)
    loss = jit.masked_mean(tf.square(logits))
    return logits, tf.nn.softmax(weights), loss

  def with_grads(history, lengths, target):
    with tf.GradientTape() as tape:
      logits, attention, loss = fn(history, lengths, target)
    variables = embed.trainable_variables + score.trainable_variables + head.trainable_variables
    return logits, attention, loss, tape.gradient(loss, variables)

  paddable = {"history": {0: "batch", 1: "seq"}, "lengths": "batch", "target": "batch"}
  # The reference never plans buckets (so never pads), and gives jit.mask its real meaning.
  reference = jit.function(with_grads, paddable=paddable, min_observations=10**9)
  ours = jit.function(with_grads, paddable=paddable, min_observations=3)
  rng = np.random.default_rng(2)
  for _round in range(2):
    for n, length in [(4, 7), (9, 3), (2, 20), (12, 11), (5, 16), (1, 1)]:
      lengths = rng.integers(1, length + 1, size=n).astype("int32")
      lengths[0] = length
      history = rng.integers(1, 50, size=(n, length)).astype("int32")
      target = rng.integers(1, 50, size=n).astype("int32")
      got = ours(history, lengths, target)
      assert got[1].shape == (n, length)  # sliced along both padded axes
      want = reference(history, lengths, target)
      assert_close(got[0], want[0])
      assert_close(got[1], want[1])
      assert_close(got[2], want[2])
      # Embedding gradients come as IndexedSlices: compare them dense.
      assert_close(
        [tf.convert_to_tensor(g) for g in got[3]], [tf.convert_to_tensor(g) for g in want[3]]
      )
    ours.wait_for_compiles()
  assert ours.stats["compiled"] + ours.stats["larger_bucket"] >= 6
  dims = ("batch", "seq")
  assert dims in ours.plan()


def test_a_function_of_the_batch_size_is_detected_and_not_padded(caplog):
  def fn(x):
    return x / tf.cast(tf.shape(x)[0], tf.float32)  # depends on the batch size

  ours = jit.function(fn, paddable={"x": "batch"}, min_observations=2)
  with caplog.at_level(logging.WARNING, logger="tf_ext.jit"):
    for n in [3, 5, 3, 5, 7, 3]:
      x = np.arange(n * 2, dtype="float32").reshape(n, 2)
      np.testing.assert_allclose(ours(x), x / n, rtol=1e-6)
    for _round in range(2):
      ours.wait_for_compiles()
      for n in [3, 5, 7]:
        x = np.ones((n, 2), "float32")
        np.testing.assert_allclose(ours(x), x / n, rtol=1e-6)
  assert any("depends on the size of 'batch'" in r.getMessage() for r in caplog.records)
  assert any(e["event"] == "not padded" for e in ours.events)
  # Compiled per exact shape instead, once a shape comes back (the calls made while the probe
  # ran count as seen): the first round after them queued the compilations, the second ran them.
  assert ours.stats["compiled"] >= 2
  assert all(buckets == () for _, buckets, _ in ours.executables())


def test_without_padded_dimensions_a_shape_compiles_once_it_comes_back():
  ours = jit.function(lambda x: x * 2.0)  # nothing declared paddable: exact shapes only
  for n in range(1, 11):  # ten one-off shapes: nothing to compile
    np.testing.assert_allclose(ours(np.ones((n, 3), "float32")), np.full((n, 3), 2.0))
  ours.wait_for_compiles()
  assert ours.compiles == 0 and not ours.executables()
  for _round in range(2):  # two shapes come back: compiled, then run compiled
    for n in (4, 7):
      np.testing.assert_allclose(ours(np.ones((n, 3), "float32")), np.full((n, 3), 2.0))
    ours.wait_for_compiles()
  assert ours.compiles == 2 and ours.stats["compiled"] == 2
  ours.close()


def test_batch_normalization_in_training_declared_non_paddable_is_exact():
  tf.keras.utils.set_random_seed(7)
  norm = tf.keras.layers.BatchNormalization()
  dense = tf.keras.layers.Dense(3)

  def fn(x):
    return dense(norm(x, training=True))  # batch statistics: depends on every row

  reference = tf.function(fn)
  ours = jit.function(fn)  # nothing declared paddable: exact shapes only
  rng = np.random.default_rng(3)
  for _round in range(2):
    for n in [4, 6, 4]:
      x = rng.normal(size=(n, 5)).astype("float32")
      np.testing.assert_allclose(ours(x), reference(x), rtol=1e-4, atol=1e-5)
    ours.wait_for_compiles()
  assert ours.stats["compiled"] >= 2  # shapes that came back
  assert all(buckets == () for _, buckets, _ in ours.executables())
  # Declared paddable anyway, batch normalization in training is detected and not padded.
  declared = jit.function(fn, paddable="batch", min_observations=1)
  x = rng.normal(size=(6, 5)).astype("float32")
  np.testing.assert_allclose(declared(x), reference(x), rtol=1e-4, atol=1e-5)
  declared.wait_for_compiles()  # the probe that detects it runs in the background
  assert [e["dims"] for e in declared.events if e["event"] == "not padded"] == [("batch",)]


def test_calls_never_wait_for_the_compiler():
  counter = tf.Variable(0, dtype=tf.int64)

  def fn(x):
    counter.assign_add(1)  # a side effect: the compile warm-up must not run it on the real state
    return tf.reduce_sum(x, 1)

  ours = jit.function(fn, paddable="batch", min_observations=2)
  assert ours(np.ones((4, 3), "float32")).shape == (4,)
  ours.wait_for_compiles()  # the probe of the first call, in the compiler's thread
  with ours.compiles_paused():  # the compiler is held: every compile stays queued
    for n in [8, 4, 8, 4, 8]:
      assert ours(np.ones((n, 3), "float32")).shape == (n,)
    assert ours.stats["uncompiled"] == 6 and ours.stats["compiled"] == 0  # none waited
    # The first plan: one bucket (8), holding every size seen.
    assert ours.executables() == [(("batch",), (8,), "queued")]
  ours.wait_for_compiles()
  assert ours.executables() == [(("batch",), (8,), "ready")]
  assert int(counter.numpy()) == 6  # warm-up ran on a shadow variable
  ours(np.ones((8, 3), "float32"))
  assert ours.stats["compiled"] == 1 and int(counter.numpy()) == 7
  # A new bucket (2) while it compiles: served by the smallest ready larger bucket (8).
  for _ in range(8):
    ours(np.ones((2, 3), "float32"))
  with ours.compiles_paused():
    ours.replan()
    assert ours.plan()[("batch",)][0][0] == 2
    np.testing.assert_allclose(ours(np.ones((2, 3), "float32")), [3.0, 3.0])
    assert ours.stats["larger_bucket"] >= 1
  ours.wait_for_compiles()
  before = ours.stats["compiled"]
  ours(np.ones((2, 3), "float32"))
  assert ours.stats["compiled"] == before + 1


def test_every_bucket_compiles_from_one_trace():
  traces = []

  def fn(x):
    traces.append(x.shape.as_list())  # runs once per trace
    return x * 2.0

  ours = jit.function(fn, paddable="batch", min_observations=4, min_gain=0)
  for n in [2, 4, 6, 8]:
    ours(np.ones((n, 1), "float32"))
  ours.wait_for_compiles()
  ours.replan()  # one bucket per size seen
  for n in [2, 4, 6, 8]:
    ours(np.ones((n, 1), "float32"))
  ours.wait_for_compiles()
  before = ours.stats["compiled"]
  for n in [2, 4, 6, 8]:
    np.testing.assert_allclose(ours(np.ones((n, 1), "float32")), np.full((n, 1), 2.0))
  assert ours.compiles == 4 and ours.stats["compiled"] == before + 4
  # The uncompiled function and the probe of the output shapes: every bucket's executable
  # compiles from a wrapper of the uncompiled trace, which does not trace the function again.
  assert len(traces) == 2 and traces.count([None, 1]) == 1, traces


def test_a_trace_that_xla_cannot_compile_is_traced_again_for_xla(caplog):
  # TensorFlow's weighted losses assert their weights' shape with an op that XLA has no kernel
  # for, and leave the assert out of a trace made for XLA: the wrapper of the uncompiled trace
  # fails to compile, and the function is traced for XLA, once for every bucket.
  traces = []

  def fn(x, w):
    traces.append(x.shape.as_list())
    none = tf.compat.v1.losses.Reduction.NONE
    return tf.compat.v1.losses.compute_weighted_loss(x, w[:, None], reduction=none)

  ours = jit.function(fn, paddable="batch", min_observations=2, min_gain=0, adaptive=False)
  with caplog.at_level(logging.INFO, logger="tf_ext.jit"):
    for n in [2, 3, 4, 2, 3, 4]:
      ours(np.ones((n, 3), "float32"), np.full((n,), 2.0, "float32"))
      ours.wait_for_compiles()
  before = ours.stats["compiled"]
  for n in [2, 3, 4]:
    got = ours(np.ones((n, 3), "float32"), np.full((n,), 2.0, "float32"))
    np.testing.assert_allclose(got, np.full((n, 3), 2.0))
  assert ours.stats["compiled"] == before + 3 and ours.compiles == 3
  messages = [r.getMessage() for r in caplog.records]
  assert sum("XLA cannot compile the uncompiled calls' trace" in m for m in messages) == 1
  # The uncompiled function, the probe, and the one trace for XLA.
  assert len(traces) == 3 and traces.count([None, 3]) == 2, traces


def test_the_cache_is_bounded_and_every_compile_is_logged(caplog):
  ours = jit.function(
    lambda x: x * 2.0, paddable={"x": "batch"}, max_executables=2, min_observations=4, min_gain=0
  )
  with caplog.at_level(logging.INFO, logger="tf_ext.jit"):
    for round_ in range(3):
      if round_ == 1:
        ours.replan()  # from the histogram: one bucket per size seen
      for n in [2, 4, 6, 8]:
        np.testing.assert_allclose(ours(np.ones((n, 1), "float32")), np.full((n, 1), 2.0))
        ours.wait_for_compiles()
        assert len(ours.executables()) <= 2
  messages = [r.getMessage() for r in caplog.records]
  compiles = [m for m in messages if "compiled batch=" in m]
  assert len(compiles) == ours.compiles >= 4
  pattern = r"compiled batch=\d+ \((first plan|new plan|new bucket)\) in [\d.]+ s; \d/2 execut"
  assert all(re.search(pattern, m) for m in compiles), compiles
  assert any("dropped the least recently used executable" in m for m in messages)
  assert any("bucket plan batch: [8] (first plan)" in m for m in messages)
  assert any("bucket plan batch: [2, 4, 6, 8] (replan (requested))" in m for m in messages)
  assert sum(1 for e in ours.events if e["event"] == "evict") == ours.compiles - 2
  # XLA's own account of each compile, from its activity listener. A bucket compiled again
  # after its eviction is found in XLA's cache of the shared trace: no XLA compilation.
  events = [e for e in ours.events if e["event"] == "compile"]
  first_time, again = set(), []
  for event, message in zip(events, compiles):
    if event["buckets"] in first_time:
      again.append(event)
      assert event["xla_seconds"] == 0.0 and "XLA's cache still held it" in message, message
    else:
      first_time.add(event["buckets"])
      assert event["xla_seconds"] > 0 and "XLA compiled for" in message, message
  assert again, "an evicted bucket was compiled again"


def test_warm_restart_compiles_the_saved_buckets_at_start(tmp_path, caplog):
  def make():
    model = mlp(seed=1)
    return jit.function(
      lambda x: model(x), paddable={"x": "batch"}, min_observations=4, name="predict"
    )

  first = make()
  rng = np.random.default_rng(4)
  for n in [3, 30, 12, 3, 30, 12, 30]:
    first(rng.normal(size=(n, 8)).astype("float32"))
  first.wait_for_compiles()
  path = first.save_plan(str(tmp_path))
  assert os.path.basename(path) == "tf_ext_jit_plan.predict.json"

  restarted = make()
  with caplog.at_level(logging.INFO, logger="tf_ext.jit"):
    assert restarted.load_plan(str(tmp_path))
  assert restarted.plan() == first.plan()
  restarted(rng.normal(size=(3, 8)).astype("float32"))  # starts the warm-up compiles
  restarted.wait_for_compiles()
  warm = [e for e in restarted.events if e["event"] == "compile"]
  assert sorted(e["buckets"] for e in warm) == sorted(b for _, b, _ in first.executables())
  assert all(e["reason"] == "warm restart" for e in warm)
  for n in [3, 30, 12]:
    restarted(rng.normal(size=(n, 8)).astype("float32"))
  assert restarted.stats["compiled"] == 3 and restarted.compiles == len(warm)
  # plan_path= at construction does the same; a missing file is a first run.
  assert jit.function(lambda x: x, plan_path=str(tmp_path / "none.json")).plan() == {}
  # The plan_path rule of Bucketing too: a .json path is the file; another path a directory,
  # made when needed (e.g. a model_dir before the first checkpoint).
  assert first.save_plan(tmp_path / "given.json") == str(tmp_path / "given.json")
  made = first.save_plan(tmp_path / "model_dir")
  assert made == str(tmp_path / "model_dir" / "tf_ext_jit_plan.predict.json")
  assert make().load_plan(tmp_path / "model_dir") and make().load_plan(tmp_path / "given.json")


def test_too_large_inputs_run_uncompiled_with_one_warning(caplog):
  ours = jit.function(lambda x: x + 1.0, paddable="batch", max_size=16, min_observations=1)
  with caplog.at_level(logging.WARNING, logger="tf_ext.jit"):
    for n in [4, 20, 40, 4, 33]:
      np.testing.assert_allclose(ours(np.zeros((n, 2), "float32")), np.ones((n, 2)))
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "TF_EXT_JIT_MAX_SIZE" in warnings[0].getMessage()
  assert ours.stats["oversize"] == 3
  ours.wait_for_compiles()  # the probe, which then plans
  assert ours.plan()[("batch",)] == ((4,),)  # oversized sizes are not planned for


def test_sync_mode_decorators_and_methods():
  @jit.function
  def double(x):
    return 2 * x

  assert double(tf.ones([3])).numpy().tolist() == [2.0, 2.0, 2.0]

  @jit.function(paddable="batch", async_compile=False, min_observations=1)
  def total(x):
    return jit.masked_sum(x), jit.size()

  s, n = total(np.ones((5, 2), "float32"))
  assert float(s) == 10.0 and int(n) == 5
  s, n = total(np.ones((3, 2), "float32"))  # compiled in the call (sync), padded to 5
  assert float(s) == 6.0 and int(n) == 3 and total.stats["compiled"] == 1

  class Model:
    def __init__(self):
      self.scale = tf.Variable(3.0)

    @jit.function(paddable={"x": "batch"})
    def __call__(self, x):
      return x * self.scale

  assert Model()(tf.ones([2])).numpy().tolist() == [3.0, 3.0]
  with pytest.raises(RuntimeError, match="only inside a function made by tf_ext.jit.function"):
    jit.size()
  with pytest.raises(ValueError, match="has no argument 'y'"):
    jit.function(lambda x: x, paddable={"y": "batch"})


def test_the_speed_check_picks_the_faster_way_and_results_stay_equal():
  """Once an executable is ready, a function times compiled and uncompiled calls, interleaved,
  and runs the faster way; whichever way a call runs, its results equal plain TensorFlow's."""
  model = mlp(seed=4, width=32)
  fn = loss_and_grads(model)
  reference = tf.function(fn)
  ours = jit.function(fn, paddable={"x": "batch", "y": "batch"}, min_observations=4, adaptive=True)
  ours._new_speed_check = lambda: speed_check.SpeedCheck(settle_calls=2, samples=4)
  rng = np.random.default_rng(5)
  # Observed uncompiled, then one bucket; then 2 calls to settle and 4 of each kind (calls while
  # the compiler is busy, e.g. after the plan grows, are not timed: that would be unfair). The
  # bucket compiles in the background, on a loaded machine for any number of calls: the calls go
  # on until the check is out, for at most 120 s.
  checks = []
  start = time.monotonic()
  while not checks:
    assert time.monotonic() - start < 120, f"no speed check in 120 s: {ours.events}"
    x, y = batch(rng, int(rng.integers(1, 33)))
    assert_close(ours(x, y), reference(x, y))
    checks = [e for e in ours.events if e["event"] == "speed check"]
  assert len(checks) == 1, ours.events
  check = checks[0]
  per_element = check["compiled_us_per_element"]
  per_padded = check["compiled_us_per_padded_element"]
  unpadded = check["compiled_us_per_element_unpadded"]
  uncompiled = check["uncompiled_us_per_element"]
  # Padding only adds elements: the fitted compiled time covers more of them, and is no smaller.
  assert 0 < per_padded <= per_element and 0 < unpadded <= per_element and uncompiled > 0
  assert check["compiled_faster"] == (per_element <= 1.05 * uncompiled)
  assert check["xla_faster"] == (unpadded <= 1.05 * uncompiled)
  assert ours.stats["speed_check_uncompiled"] >= 4
  ours.wait_for_compiles()
  ours._speed_checks.clear()  # a long check again: the calls below follow the verdict
  ours._new_speed_check = lambda: speed_check.SpeedCheck(settle_calls=1000)
  before = dict(ours.stats)
  top = ours.plan()[("batch",)][0][-1]  # (a larger size would wait for a verdict, uncompiled)
  for n in rng.integers(1, top + 1, size=6):
    x, y = batch(rng, int(n))
    assert_close(ours(x, y), reference(x, y))
  ran_compiled = ours.stats["compiled"] + ours.stats["larger_bucket"]
  ran_compiled -= before["compiled"] + before.get("larger_bucket", 0)
  assert ran_compiled == 6, (before, ours.stats)  # no verdict yet: compiled
  ours.close()


def test_when_xla_is_slower_calls_run_uncompiled_and_nothing_more_is_compiled():
  ours = jit.function(
    lambda x: tf.reduce_sum(x, axis=1), paddable="batch", min_observations=2, adaptive=True
  )
  for n in (3, 7, 5):
    ours(np.ones((n, 4), "float32"))
  ours.wait_for_compiles()
  compiles = ours.compiles
  assert compiles >= 1
  (check,) = ours._speed_checks.values()
  # The verdicts of a check that measured XLA slower, even per padded element.
  check.compiled_faster = check.xla_faster = False
  check.executables_changed = lambda: None  # no new check
  check._next_check = 10**9
  for n in (3, 7, 100, 300):  # 100 and 300 need a larger bucket: not compiled now
    np.testing.assert_allclose(ours(np.ones((n, 4), "float32")).numpy(), np.full(n, 4.0))
  ours.wait_for_compiles()
  assert ours.compiles == compiles
  assert ours.stats["speed_check_uncompiled"] == 2  # 3 and 7 had a ready bucket
  assert ours.stats["compiled"] == 0
  ours.close()


def row_sums_awaiting_a_verdict(**options):
  """A jit function of row sums whose speed check gives no verdict until told, with its first plan
  ([8]) made and compiled, and a call of it on n rows (checked)."""
  ours = jit.function(
    lambda x: tf.reduce_sum(x, axis=1),
    paddable="batch",
    min_observations=4,
    adaptive=True,
    **options,
  )
  ours._new_speed_check = lambda: speed_check.SpeedCheck(settle_calls=10**9)

  def call(n):
    np.testing.assert_allclose(ours(np.ones((n, 3), "float32")).numpy(), np.full(n, 3.0))

  for n in [2, 8] * 2:
    call(n)
  ours.wait_for_compiles()
  return ours, call


def say_xla_is_faster(ours):
  (check,) = ours._speed_checks.values()
  check.compiled_faster = check.xla_faster = True
  check.last = {"compiled": 1e-6, "padded": 1e-6, "uncompiled": 2e-6}


def test_with_the_speed_check_a_plan_grows_only_after_a_verdict():
  ours, call = row_sums_awaiting_a_verdict(min_gain=0)
  for n in [2, 8] * 8:  # two doublings due, but nothing has timed the compiled calls
    call(n)
  assert ours.plan() == {("batch",): ((8,),)} and ours.compiles == 1
  say_xla_is_faster(ours)
  call(2)
  ours.wait_for_compiles()
  assert ours.plan() == {("batch",): ((2, 8),)} and ours.compiles == 2
  ours.close()


def test_with_the_speed_check_a_size_above_the_plan_waits_for_a_verdict():
  ours, call = row_sums_awaiting_a_verdict()
  for _ in range(3):  # above the plan, before any verdict: run uncompiled, nothing compiled
    call(12)
  ours.wait_for_compiles()
  assert ours.plan() == {("batch",): ((8,),)} and ours.compiles == 1
  say_xla_is_faster(ours)
  call(12)
  ours.wait_for_compiles()
  assert ours.plan() == {("batch",): ((8, 12),)} and ours.compiles == 2
  ours.close()


def test_speed_check_verdicts():
  check = speed_check.SpeedCheck(settle_calls=2, samples=3, margin=0.05, recheck_every=10)
  assert [check.run_compiled() for _ in range(2)] == [True, True]  # settling: compiled
  assert not check.record(True, 1.0, 10, 16)  # not checking yet: ignored
  kinds = []
  for _ in range(6):
    compiled = check.run_compiled()
    kinds.append(compiled)
    # Uncompiled: 1 ms per 100 elements. Compiled: 1.5 ms for 100 elements padded to 200, so
    # XLA's code is faster (0.75 ms per 100 padded elements), but not with this much padding.
    done = check.record(compiled, 0.0015 if compiled else 0.001, 100, 200)
  assert kinds == [True, False, True, False, True, False]  # interleaved
  assert done and check.compiled_faster is False and check.xla_faster is True
  # Calls of one size: time per element is all there is to compare.
  expected = {"compiled": 1.5e-5, "padded": 7.5e-6, "unpadded": 7.5e-6, "uncompiled": 1e-5}
  assert check.last == pytest.approx(expected)
  assert not any(check.run_compiled() for _ in range(5))  # uncompiled for now
  check.executables_changed()  # a smaller bucket is ready: check again after 2 calls
  assert not any(check.run_compiled() for _ in range(2))
  kinds = []
  for _ in range(6):
    compiled = check.run_compiled()
    kinds.append(compiled)
    done = check.record(compiled, 0.00102 if compiled else 0.001, 100, 110)  # within the margin
  assert done and check.compiled_faster is True and kinds.count(True) == 3
  assert all(check.run_compiled() for _ in range(10))  # until the re-check, 10 calls later
  assert check.run_compiled() and check.checking
  assert not check.record(True, 0.5, 0, 0)  # empty calls are not timed
  assert not check.record(True, 0.003, 100, 110)  # one compiled sample ...
  assert check.run_compiled(timed=False)  # untimed calls (compiler busy) follow the verdict
  assert not check.run_compiled(timed=True)  # ... so an uncompiled one is next
  check.record(False, 0.001, 100, 110)
  for _ in range(4):
    compiled = check.run_compiled()
    done = check.record(compiled, 0.003 if compiled else 0.001, 100, 110)
  assert done and check.compiled_faster is False and check.xla_faster is False


def test_speed_check_weighs_each_calls_fixed_cost():
  """Calls of many sizes: a call costs a fixed 0.4 ms plus 24 us per element uncompiled, or
  0.6 ms plus 10 us per padded element compiled (one bucket of 512). Over these calls compiled is
  faster (0.75x the time), but the compiled ones happen to include six small calls, whose time
  per element is mostly the fixed cost: medians of time per element would call compiled 2.7x
  slower. The fitted lines get both verdicts right."""
  check = speed_check.SpeedCheck(settle_calls=0, samples=12)
  sizes = {
    True: [8, 16, 24, 32, 40, 48, 400, 440, 480, 500, 510, 512],
    False: [100, 150, 200, 250, 300, 350, 400, 450, 480, 500, 510, 512],
  }
  elements = sum(sizes[True]) + sum(sizes[False])
  check.run_compiled()  # past the settling calls
  done = False
  while not done:
    compiled = check.run_compiled()
    n = sizes[compiled].pop()
    seconds = 0.0006 + 10e-6 * 512 if compiled else 0.0004 + 24e-6 * n
    done = check.record(compiled, seconds, n, 512)
  assert check.compiled_faster is True and check.xla_faster is True
  # Uncompiled: 0.4 ms + 24 us per element, fitted exactly; compiled at the true sizes: its
  # fixed cost taken as the uncompiled one's (one bucket: no slope to fit).
  uncompiled = (24 * 0.0004 + 24e-6 * elements) / elements
  assert check.last["uncompiled"] == pytest.approx(uncompiled)
  assert check.last["compiled"] == pytest.approx(24 * (0.0006 + 10e-6 * 512) / elements)
  assert check.last["compiled"] == pytest.approx(0.751 * uncompiled, rel=1e-3)
  # A stalled call (a pause 10x its time) among them moves no verdict.
  check = speed_check.SpeedCheck(settle_calls=0, samples=12)
  check.run_compiled()
  for index in range(24):
    compiled = check.run_compiled()
    n = 32 + 20 * index
    seconds = 0.0006 + 10e-6 * 512 if compiled else 0.0004 + 24e-6 * n
    done = check.record(compiled, seconds * (10 if index == 5 else 1), n, 512)
  assert done and check.compiled_faster is True
  elements = 24 * 32 + 20 * sum(range(24))
  assert check.last["uncompiled"] * 1e6 == pytest.approx(24 + 24 * 400 / elements)  # the line


SETTINGS = {
  "TF_EXT_JIT_MAX_EXECUTABLES": ("max_executables", "0"),
  "TF_EXT_JIT_MAX_BUCKETS": ("max_buckets", "-1"),
  "TF_EXT_JIT_MAX_SIZE": ("max_size", "zero"),
  "TF_EXT_JIT_MIN_OBSERVATIONS": ("min_observations", "0"),
  "TF_EXT_JIT_MIN_GAIN": ("min_gain", "-0.5"),
  "TF_EXT_JIT_REPLAN_GAIN": ("replan_gain", "inf"),
  "TF_EXT_JIT_ASYNC": ("async_compile", "maybe"),
  "TF_EXT_JIT_ADAPTIVE": ("adaptive", "sometimes"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_settings_reject_invalid_values(name, monkeypatch):
  keyword, bad = SETTINGS[name]
  monkeypatch.setenv(name, bad)
  with pytest.raises(ValueError, match=f"^{name}='{bad}' is invalid"):
    jit.function(lambda x: x)
  monkeypatch.delenv(name)
  with pytest.raises(ValueError, match=f"^{name}='{bad}' is invalid"):
    jit.function(lambda x: x, **{keyword: bad})


def test_settings_are_read_from_the_environment():
  code = (
    "import tf_ext.jit as j; f = j.function(lambda x: x); print(f.max_executables, f.max_buckets)"
  )
  env = dict(os.environ, TF_EXT_JIT_MAX_EXECUTABLES="3", TF_EXT_JIT_MAX_BUCKETS="2")
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  out = subprocess.run(
    [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
  )
  assert out.stdout.split() == ["3", "2"]

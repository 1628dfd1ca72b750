"""tf_ext.mixed_precision.LossAwareOptimizer: the half graph runs half kernels, its gradients match
fp32, each trigger falls back and returns, a non-finite step changes nothing, switching works in
Session, Estimator, Keras and GradientTape without a new trace, the state is checkpointed, and bad
input is refused clearly."""

import glob
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import tf_ext  # noqa: E402
import tf_ext.mixed_precision as amp  # noqa: E402

RNG = np.random.default_rng(3)
X = RNG.normal(size=(64, 16)).astype(np.float32)
Y = (X[:, :1] + 0.5 * X[:, 1:2] > 0).astype(np.float32)

# A policy that reacts at once: every trigger is reachable in a few steps.
QUICK = amp.PolicyConfig(
  initial_loss_scale=1024.0,
  max_nonfinite_streak=2,
  spike_warmup_steps=3,
  spike_sigmas=4.0,
  return_after_steps=2,
  max_return_after_steps=8,
)
# The probe of bf16 always sees some error: a tiny tolerance falls back at every probe.
ALWAYS_FALL_BACK_ON_PROBE = amp.PolicyConfig(
  probe_tolerance=1e-9, return_after_steps=2, max_return_after_steps=2
)


def values(report):
  return {k: v.numpy() if hasattr(v, "numpy") else v for k, v in report.items()}


def v1_tower(x, labels):
  """x -> Dense(32, relu) -> Dense(16, relu) -> Dense(1) -> sigmoid cross-entropy."""
  init = tf.compat.v1.glorot_uniform_initializer(seed=1)
  h = tf.compat.v1.layers.dense(x, 32, tf.nn.relu, kernel_initializer=init, name="d1")
  h = tf.compat.v1.layers.dense(h, 16, tf.nn.relu, kernel_initializer=init, name="d2")
  logits = tf.compat.v1.layers.dense(h, 1, kernel_initializer=init, name="out")
  return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


def keras_tower(seed=1):
  init = tf.keras.initializers.GlorotUniform(seed=seed)
  return tf.keras.Sequential(
    [
      tf.keras.layers.Dense(32, "relu", kernel_initializer=init, input_shape=(16,)),
      tf.keras.layers.Dense(16, "relu", kernel_initializer=init),
      tf.keras.layers.Dense(1, kernel_initializer=init),
    ]
  )


def executed_and_half_nodes(sess, fetches, feed):
  """(names of the nodes a run executed, names of its MatMul nodes typed half: MatMul, or what
  Grappler's remapper and oneDNN make of it, e.g. _MklNativeFusedMatMul with its BiasAdd and
  Relu, on CPUs with AVX512_BF16)."""
  options = tf.compat.v1.RunOptions(
    trace_level=tf.compat.v1.RunOptions.FULL_TRACE, output_partition_graphs=True
  )
  metadata = tf.compat.v1.RunMetadata()
  result = sess.run(fetches, feed, options=options, run_metadata=metadata)
  executed = {s.node_name for d in metadata.step_stats.dev_stats for s in d.node_stats}
  half_matmuls = {
    n.name
    for g in metadata.partition_graphs
    for n in g.node
    if n.op.endswith("MatMul")
    and n.attr["T"].type in (tf.bfloat16.as_datatype_enum, tf.float16.as_datatype_enum)
  }
  return result, executed, half_matmuls


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_half_graph_runs_half_kernels_and_gradients_match_fp32(half):
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 16])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    loss = v1_tower(x, y)
    variables = tf.compat.v1.trainable_variables()
    reference = tf.gradients(loss, variables)
    optimizer = amp.LossAwareOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.0), half)
    pairs = optimizer.compute_gradients(loss, variables)
    train = optimizer.apply_gradients(pairs)
    policy = amp.policy_of(optimizer)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      feed = {x: X, y: Y}
      want = sess.run(reference, feed)
      (got, _), executed, half_matmuls = executed_and_half_nodes(
        sess, ([g for g, _ in pairs], train), feed
      )
      # Forward and backward matmuls of all three layers have half versions, which ran; the
      # fp32 originals did not.
      assert len(half_matmuls) >= 6, half_matmuls
      assert half_matmuls <= executed
      assert not any(n.endswith("MatMul") and "tf_ext_amp" not in n for n in executed), executed
      # bf16 keeps 8 significant bits, fp16 11: relative gradient error bounds of 5 % and 0.5 %.
      tolerance = 5e-2 if half == "bfloat16" else 5e-3
      for g, w in zip(got, want):
        assert np.linalg.norm(g - w) <= tolerance * np.linalg.norm(w), (g, w)
      # In full precision the originals run and the gradients are fp32's.
      sess.run(policy.state[0].assign(0.0))
      (got, _), executed, _ = executed_and_half_nodes(sess, ([g for g, _ in pairs], train), feed)
      assert not any("tf_ext_amp_half" in n for n in executed)
      want = sess.run(reference, feed)
      for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def run_v1_steps(config, feeds, half="bfloat16", probe_interval=0):
  """Trains the v1 tower on each feed in turn; returns the report after each step."""
  reports = []
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 16])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    loss = v1_tower(x, y)
    optimizer = amp.LossAwareOptimizer(
      tf.compat.v1.train.AdamOptimizer(1e-3), half, config=config, probe_interval=probe_interval
    )
    train = optimizer.minimize(loss)
    report = amp.report(optimizer)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for xs in feeds:
        sess.run(train, {x: xs, y: Y})
        reports.append(sess.run(report))
  return reports


def test_forced_overflow_falls_back_to_fp32_and_returns():
  # Inputs of 1e6 overflow fp16 in the forward pass: every half step is non-finite.
  huge = X * 1e6
  feeds = [huge] * 3 + [X] * 6
  reports = run_v1_steps(QUICK, feeds, half="float16")
  assert [r["half"] for r in reports[:2]] == [True, False]  # 2 non-finite steps: fall back
  assert reports[1]["last_fallback"] == b"nonfinite_streak"
  assert reports[0]["loss_scale"] == 512.0  # the first overflow halved the scale
  # Full precision trains on the huge inputs, then returns to half after 2 applied steps.
  assert any(r["half"] for r in reports[3:])
  assert reports[-1]["switches"] >= 2
  assert reports[-1]["skipped_steps"] == 2


def test_probe_mismatch_falls_back_and_returns():
  reports = run_v1_steps(ALWAYS_FALL_BACK_ON_PROBE, [X] * 8, probe_interval=2)
  assert b"probe" in [r["last_fallback"] for r in reports]
  assert reports[1]["half"] is np.False_ or not reports[1]["half"]  # the 2nd step probed
  assert reports[1]["last_probe_error"] > 0
  modes = [bool(r["half"]) for r in reports]
  assert modes.index(False) < len(modes) - 1 and True in modes[modes.index(False) :]


def test_probe_within_tolerance_stays_half():
  reports = run_v1_steps(amp.PolicyConfig(probe_tolerance=0.05), [X] * 6, probe_interval=2)
  assert all(r["half"] for r in reports)
  assert 0 < reports[-1]["last_probe_error"] < 0.05


def test_loss_spike_falls_back_and_returns():
  spike = X * 300.0  # finite in bf16, but a loss far above its running mean
  reports = run_v1_steps(QUICK, [X] * 5 + [spike] + [X] * 4)
  assert all(r["half"] for r in reports[:5])
  assert not reports[5]["half"]
  assert reports[5]["last_fallback"] == b"loss_spike"
  assert reports[5]["skipped_steps"] == 1
  assert reports[-1]["half"]


def test_nonfinite_step_changes_no_variable_and_no_table_row():
  with tf.Graph().as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    x = tf.compat.v1.placeholder(tf.float32, [None, 16])
    emb = tf_ext.dynamic_embedding(ids, 16, name="amp_table", combiner="mean")
    loss = v1_tower(x + emb, Y[:8])
    optimizer = amp.LossAwareOptimizer(
      tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)), "bfloat16"
    )
    train = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    table = tf_ext.get_dynamic_embedding_variable("amp_table", 16)
    exported = table.export()
    dense = tf.compat.v1.trainable_variables()
    report = amp.report(optimizer)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      some_ids = np.arange(16).reshape(8, 2)
      sess.run(train, {ids: some_ids, x: X[:8]})
      before = sess.run([exported, dense])
      bad = X[:8].copy()
      bad[3, 4] = np.nan
      sess.run(train, {ids: some_ids, x: bad})
      after = sess.run([exported, dense])
      assert sess.run(report)["skipped_steps"] == 1
  (keys0, rows0), dense0 = before
  (keys1, rows1), dense1 = after
  order0, order1 = np.argsort(keys0), np.argsort(keys1)
  np.testing.assert_array_equal(keys0[order0], keys1[order1])
  np.testing.assert_array_equal(rows0[order0], rows1[order1])
  for a, b in zip(dense0, dense1):
    np.testing.assert_array_equal(a, b)


def test_switching_in_keras_fit_needs_no_retrace():
  model = keras_tower()
  optimizer = amp.LossAwareOptimizer(
    tf.keras.optimizers.Adam(1e-3), "bfloat16", config=ALWAYS_FALL_BACK_ON_PROBE, probe_interval=3
  )
  model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True))
  modes = []
  record = tf.keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda b, logs: modes.append(bool(amp.report(optimizer)["half"]))
  )
  model.fit(X[:8], Y[:8], batch_size=8, epochs=1, verbose=0, callbacks=[record])
  traces = model.train_function.experimental_get_tracing_count()
  model.fit(X, Y, batch_size=8, epochs=2, verbose=0, callbacks=[record])
  assert model.train_function.experimental_get_tracing_count() == traces
  report = values(amp.report(optimizer))
  assert report["switches"] >= 4, (modes, report)
  assert True in modes and False in modes
  assert 0 < report["half_fraction"] < 1


def test_switching_in_a_gradient_tape_loop_runs_the_chosen_version_without_retracing():
  model = keras_tower()
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.SGD(0.0), "bfloat16", probe_interval=0)
  policy = amp.policy_of(optimizer)

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
    tape = amp.LossAwareGradientTape(tape, optimizer)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return logits

  half_logits = step(X, Y).numpy()
  traces = step.experimental_get_tracing_count()
  policy.state[0].assign(0.0)  # the policy's next step in full precision
  full_logits = step(X, Y).numpy()
  policy.state[0].assign(1.0)
  half_again = step(X, Y).numpy()
  assert step.experimental_get_tracing_count() == traces
  want = model(X).numpy()  # fp32, eagerly
  np.testing.assert_allclose(full_logits, want, rtol=1e-6, atol=1e-6)
  assert not np.allclose(half_logits, want, rtol=1e-6, atol=1e-6)  # bf16 rounding shows
  np.testing.assert_allclose(half_logits, want, rtol=0.05, atol=0.05)
  np.testing.assert_array_equal(half_logits, half_again)


def test_fp16_loss_scaling_in_a_tape_loop_matches_fp32_gradients():
  model = keras_tower()
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.SGD(0.0), "float16", probe_interval=0)
  captured = {}

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=model(x)))
    grads = amp.LossAwareGradientTape(tape, optimizer).gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return grads

  captured["half"] = [g.numpy() for g in step(X, Y)]
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=Y, logits=model(X)))
  want = tape.gradient(loss, model.trainable_variables)
  # Unscaled once: a wrong unscale is off by 32768x. (Relu masks of pre-activations within fp16
  # rounding of zero may flip, so single layers differ by up to a few percent.)
  for g, w in zip(captured["half"], want):
    assert np.linalg.norm(g - w) <= 5e-2 * np.linalg.norm(w)
  assert values(amp.report(optimizer))["loss_scale"] == 32768.0


def test_switching_in_monitored_training_session_and_summary_hook(tmp_path):
  with tf.Graph().as_default():
    x = tf.constant(X)
    loss = v1_tower(x, Y)
    optimizer = amp.LossAwareOptimizer(
      tf.compat.v1.train.AdamOptimizer(1e-3),
      "bfloat16",
      config=ALWAYS_FALL_BACK_ON_PROBE,
      probe_interval=2,
    )
    step = tf.compat.v1.train.get_or_create_global_step()
    train = optimizer.minimize(loss, global_step=step)
    report = amp.report(optimizer)
    modes = []
    hooks = [amp.SummaryHook(str(tmp_path), every_n_steps=1)]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
      for _ in range(8):
        sess.run(train)
        modes.append(bool(sess.run(report)["half"]))
  assert True in modes and False in modes, modes
  tags = set()
  for path in glob.glob(str(tmp_path / "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  assert {"amp/half", "amp/loss_scale", "amp/switches", "amp/last_probe_error"} <= tags


def test_summary_hook_writes_every_n_global_steps_from_the_session_start(tmp_path):
  with tf.Graph().as_default():
    optimizer = amp.LossAwareOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3), "bfloat16")
    step = tf.compat.v1.train.get_or_create_global_step()
    train = optimizer.minimize(v1_tower(tf.constant(X), Y), global_step=step)
    hooks = [amp.SummaryHook(str(tmp_path), every_n_steps=3)]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
      for _ in range(7):
        sess.run(train)
  written = set()
  for path in glob.glob(str(tmp_path / "events.*")):
    written.update(e.step for e in tf.compat.v1.train.summary_iterator(path) if e.summary.value)
  assert written == {3, 6}  # the steps tf_ext.train.DeltaCheckpointHook(every_n_steps=3) saves at


def estimator_model_fn(features, labels, mode):
  loss = v1_tower(features["x"], labels)
  optimizer = amp.LossAwareOptimizer(
    tf.compat.v1.train.AdamOptimizer(1e-3),
    "bfloat16",
    config=ALWAYS_FALL_BACK_ON_PROBE,
    probe_interval=2,
  )
  train = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def policy_state_in(model_dir):
  names = [
    n for n, _ in tf.train.list_variables(model_dir) if n.endswith("loss_aware_precision/state")
  ]
  assert len(names) == 1, tf.train.list_variables(model_dir)
  return tf.train.load_variable(model_dir, names[0])


def test_switching_in_an_estimator_and_its_state_survives_restarts(tmp_path):
  def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": X}, Y)).batch(16).repeat()

  estimator = tf.estimator.Estimator(estimator_model_fn, model_dir=str(tmp_path))
  estimator.train(input_fn, steps=6)
  state = dict(zip(amp.STATE_FIELDS, policy_state_in(str(tmp_path))))
  assert state["steps"] == 6 and state["switches"] >= 2, state
  # A second train() restores the state from the checkpoint and goes on counting.
  estimator.train(input_fn, steps=4)
  again = dict(zip(amp.STATE_FIELDS, policy_state_in(str(tmp_path))))
  assert again["steps"] == 10
  assert again["switches"] > state["switches"]


def test_keras_checkpoint_holds_and_restores_the_amp_state(tmp_path):
  model = keras_tower()
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.Adam(1e-3), "float16", config=QUICK)
  model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True))
  model.fit(X * 1e6, Y, batch_size=16, epochs=1, verbose=0)  # overflows: falls back
  saved = values(amp.report(optimizer))
  assert not saved["half"] and saved["skipped_steps"] >= 2
  path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

  fresh_model = keras_tower(seed=2)
  fresh = amp.LossAwareOptimizer(tf.keras.optimizers.Adam(1e-3), "float16", config=QUICK)
  fresh_model.compile(fresh, tf.keras.losses.BinaryCrossentropy(from_logits=True))
  tf.train.Checkpoint(model=fresh_model, optimizer=fresh).restore(path)
  restored = values(amp.report(fresh))
  for key in ("half", "loss_scale", "switches", "steps", "skipped_steps", "last_fallback"):
    assert restored[key] == saved[key], key


def test_tf1_saver_holds_and_restores_the_amp_state(tmp_path):
  def build():
    loss = v1_tower(tf.constant(X), Y)
    optimizer = amp.LossAwareOptimizer(
      tf.compat.v1.train.AdamOptimizer(1e-3),
      "bfloat16",
      config=ALWAYS_FALL_BACK_ON_PROBE,
      probe_interval=2,
    )
    return optimizer.minimize(loss), amp.report(optimizer)

  with tf.Graph().as_default():
    train, report = build()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for _ in range(5):
        sess.run(train)
      saved = sess.run(report)
      path = saver.save(sess, str(tmp_path / "model"))
  with tf.Graph().as_default():
    train, report = build()
    with tf.compat.v1.Session() as sess:
      tf.compat.v1.train.Saver().restore(sess, path)
      assert sess.run(report) == saved


def test_keras_callback_writes_the_scalars(tmp_path):
  model = keras_tower()
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.Adam(1e-3), "bfloat16")
  model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True))
  model.fit(
    X,
    Y,
    batch_size=16,
    epochs=1,
    verbose=0,
    callbacks=[amp.TensorBoardCallback(str(tmp_path), every_n_steps=2)],
  )
  steps, tags = set(), set()
  for path in glob.glob(str(tmp_path / "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        tags.add(value.tag)
        steps.add(event.step)
  assert {"amp/half", "amp/half_fraction", "amp/skipped_steps"} <= tags
  assert steps == {2, 4}


@pytest.mark.parametrize("order", ["amp_outside", "amp_inside"])
def test_composes_with_dynamic_embedding_optimizer_in_keras(order):
  ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
  emb = tf_ext.keras.layers.DynamicEmbedding(16, combiner="mean", name=f"emb_{order}")(ids)
  tower = keras_tower()
  model = tf.keras.Model(ids, tower(emb))
  base = tf.keras.optimizers.Adagrad(0.1)
  if order == "amp_outside":
    optimizer = amp.LossAwareOptimizer(tf_ext.DynamicEmbeddingOptimizer(base), "bfloat16")
  else:
    optimizer = tf_ext.DynamicEmbeddingOptimizer(amp.LossAwareOptimizer(base, "bfloat16"))
  assert optimizer is base
  model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True))
  some_ids = np.random.default_rng(4).integers(0, 50, size=(64, 2))
  labels = (some_ids[:, :1] % 2).astype(np.float32)  # learnable from the ids' rows
  history = model.fit(some_ids, labels, batch_size=16, epochs=3, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]
  report = values(amp.report(optimizer))
  assert report["half"] and report["steps"] == 12
  assert model.get_layer(f"emb_{order}").table.size().numpy() > 0


def test_bad_input_is_refused_clearly(monkeypatch):
  with pytest.raises(ValueError, match="half must be one of"):
    amp.LossAwareOptimizer(tf.keras.optimizers.SGD(), half="fp8")
  with pytest.raises(TypeError, match="cannot wrap"):
    amp.LossAwareOptimizer(object(), half="bfloat16")
  with pytest.raises(TypeError, match="already does loss scaling"):
    amp.LossAwareOptimizer(
      tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD()), "float16"
    )
  with pytest.raises(ValueError, match="probe_interval"):
    amp.LossAwareOptimizer(tf.keras.optimizers.SGD(), "bfloat16", probe_interval=-1)
  with pytest.raises(TypeError, match="PolicyConfig"):
    amp.LossAwareOptimizer(tf.keras.optimizers.SGD(), "bfloat16", config={"a": 1})
  with pytest.raises(TypeError, match="not made by"):
    amp.report(tf.keras.optimizers.SGD())
  with pytest.raises(TypeError, match="not made by"):
    amp.LossAwareGradientTape(tf.GradientTape(), tf.keras.optimizers.SGD())
  monkeypatch.setenv("TF_EXT_AMP_DENY_OPS", "MatMul,1bad")
  with pytest.raises(ValueError, match="TF_EXT_AMP_DENY_OPS"):
    with tf.Graph().as_default():
      opt = amp.LossAwareOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), "bfloat16")
      opt.minimize(v1_tower(tf.constant(X), Y))
  tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    with pytest.raises(ValueError, match="global dtype policy"):
      amp.LossAwareOptimizer(tf.keras.optimizers.SGD(), "bfloat16")
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")


def test_deny_setting_keeps_ops_in_fp32(monkeypatch):
  monkeypatch.setenv("TF_EXT_AMP_DENY_OPS", "MatMul")
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 16])
    optimizer = amp.LossAwareOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), "bfloat16")
    train = optimizer.minimize(v1_tower(x, Y))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      _, executed, half_matmuls = executed_and_half_nodes(sess, train, {x: X})
  assert not half_matmuls
  assert not any("tf_ext_amp_half" in n and "MatMul" in n for n in executed)


def test_auto_picks_by_hardware_and_runs_full_precision_without_it(caplog):
  flags = set()
  with open("/proc/cpuinfo") as f:
    for line in f:
      if line.startswith("flags"):
        flags.update(line.split(":")[1].split())
  expected = tf.bfloat16 if flags & {"avx512_bf16", "amx_bf16"} else None
  assert amp.auto_half_dtype() == expected
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.SGD(0.1), "auto")
  model = keras_tower()
  model.compile(optimizer, "mse")
  model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
  report = values(amp.report(optimizer))
  assert report["steps"] == 4
  assert bool(report["half"]) == (expected is not None)


def test_report_gives_python_values_eagerly_and_tensors_in_graphs():
  optimizer = amp.LossAwareOptimizer(tf.keras.optimizers.SGD(0.1), "bfloat16", config=QUICK)
  model = keras_tower()
  model.compile(optimizer, "mse")
  model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
  model.fit(X * np.nan, Y, batch_size=16, epochs=1, verbose=0)  # bf16: falls back at once
  eager = amp.report(optimizer)
  types = {name: type(value) for name, value in eager.items()}
  assert types == {
    "half": bool,
    "loss_scale": float,
    "switches": int,
    "steps": int,
    "half_fraction": float,
    "skipped_steps": int,
    "last_probe_error": float,
    "last_fallback": str,
  }
  assert eager["steps"] == 8 and not eager["half"]
  assert eager["last_fallback"] == "nonfinite"

  @tf.function
  def in_a_function():
    return amp.report(optimizer)

  traced = in_a_function()
  assert all(isinstance(value, tf.Tensor) for value in traced.values())
  assert traced["last_fallback"].numpy() == b"nonfinite"

  (session_report,) = run_v1_steps(QUICK, [X])  # a Session runs the report's tensors
  assert session_report["last_fallback"] == b"none"

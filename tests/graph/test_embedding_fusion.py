"""Embedding subgraph fusion (kernels/graph/embedding_fusion_pass.cc): every lookup of a step
becomes one fused op and the table updates one fused apply, in a TF1 Session, Estimator,
tf.function and Keras, with results equal to the bit to the unfused graph."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext import graph_optimizations

_names = itertools.count()
FUSE_ONLY = {"fuse_embeddings": True, "cluster_dense_for_xla": False}
UNFUSED = {"fuse_embeddings": False, "cluster_dense_for_xla": False}


def unique(prefix):
  return f"{prefix}_{next(_names)}"


@pytest.fixture
def process_switches():
  """enable()/disable() change the process; every test leaves them off."""
  yield
  graph_optimizations.disable()


def sparse_value(rng, batch, width, vocab, empty_rows=True):
  indices, values = [], []
  for row in range(batch):
    count = rng.integers(0 if empty_rows else 1, width + 1)
    for col in range(count):
      indices.append([row, col])
      values.append(rng.integers(0, vocab))
  return tf.compat.v1.SparseTensorValue(
    np.array(indices, np.int64).reshape(-1, 2), np.array(values, np.int64), [batch, width]
  )


def _executed_ops(session, fetch, feed):
  metadata = tf.compat.v1.RunMetadata()
  options = tf.compat.v1.RunOptions(output_partition_graphs=True)
  session.run(fetch, feed, options=options, run_metadata=metadata)
  return [node.op for graph in metadata.partition_graphs for node in graph.node]


class SessionModel:
  """Sparse fields with each combiner (one with a row-less table shared by two lookups), one
  dense single-id field and one string field, a linear layer and a logistic loss."""

  def __init__(self, optimizer_fn, batch=16, clip_norm=None, num_shards=None):
    self.graph = tf.Graph()
    self.batch = batch
    with self.graph.as_default():
      tf.compat.v1.set_random_seed(1)
      init = tf.random_normal_initializer(0.0, 0.1)
      self.sparse = [tf.compat.v1.sparse_placeholder(tf.int64) for _ in range(3)]
      self.dense_ids = tf.compat.v1.placeholder(tf.int64, [None])
      self.words = tf.compat.v1.placeholder(tf.string, [None])
      self.label = tf.compat.v1.placeholder(tf.float32, [None])
      table = lambda prefix, dim, key_dtype=tf.int64: tf_ext.get_dynamic_embedding_variable(  # noqa: E731
        unique(prefix), dim, key_dtype=key_dtype, initializer=init, num_shards=num_shards
      )
      self.tables = [table("sparse", 4) for _ in range(3)]
      self.tables += [table("dense", 4), table("words", 3, tf.string), table("shared", 2)]
      lookup = tf_ext.embedding_lookup
      embeddings = [
        lookup(t, ids, combiner=c)
        for t, ids, c in zip(self.tables, self.sparse, ("mean", "sum", "sqrtn"))
      ]
      embeddings += [
        lookup(self.tables[3], self.dense_ids),
        lookup(self.tables[4], self.words),
        # One table, two lookups: TensorFlow concatenates their gradients into one update, which
        # the fused apply takes over as two fields of that update.
        lookup(self.tables[5], self.sparse[0], combiner="mean"),
        lookup(self.tables[5], self.sparse[1], combiner="sum"),
      ]
      self.embeddings = embeddings
      features = tf.concat(embeddings, axis=1)
      logit = tf.squeeze(tf.keras.layers.Dense(1)(features), axis=1)
      self.loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=self.label, logits=logit)
      )
      optimizer = tf_ext.DynamicEmbeddingOptimizer(optimizer_fn())
      if clip_norm is None:
        self.train = optimizer.minimize(self.loss)
      else:  # every gradient clipped by their global norm before the updates
        gradients, variables = zip(*optimizer.compute_gradients(self.loss))
        clipped, _ = tf.clip_by_global_norm(gradients, clip_norm)
        self.train = optimizer.apply_gradients(zip(clipped, variables))
      self.exports = [t.export() for t in self.tables]
      self.statistics = [t.statistics() for t in self.tables]
      # (Shards' gradient anchors are local variables.)
      self.initialize = tf.group(
        tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()
      )

  def feeds(self, steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
      feed = {ids: sparse_value(rng, self.batch, 4, 30) for ids in self.sparse}
      feed[self.dense_ids] = rng.integers(0, 30, self.batch)
      feed[self.words] = np.array([f"w{i}" for i in rng.integers(0, 20, self.batch)], object)
      feed[self.label] = rng.integers(0, 2, self.batch).astype(np.float32)
      yield feed

  def train_steps(self, switches, steps=4):
    """(per step: loss and embeddings), the tables' final exports, the executed op types, and the
    tables' statistics."""
    config = graph_optimizations.config_proto(**switches)
    with tf.compat.v1.Session(graph=self.graph, config=config) as session:
      session.run(self.initialize)
      history = []
      feeds = list(self.feeds(steps))
      for feed in feeds:
        loss, embeddings, _ = session.run([self.loss, self.embeddings, self.train], feed)
        history.append((loss, embeddings))
      ops = _executed_ops(session, self.train, feeds[0])
      return history, session.run(self.exports), ops, session.run(self.statistics)


def assert_bit_equal(a, b):
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def assert_same_training(unfused, fused):
  (history_a, tables_a, *_), (history_b, tables_b, *_) = unfused, fused
  for (loss_a, emb_a), (loss_b, emb_b) in zip(history_a, history_b):
    assert loss_a == loss_b
    for x, y in zip(emb_a, emb_b):
      assert_bit_equal(x, y)
  for export_a, export_b in zip(tables_a, tables_b):
    order_a, order_b = np.argsort(export_a[0]), np.argsort(export_b[0])
    for x, y in zip(export_a, export_b):  # keys, rows, slots, counts, steps, slot init
      if len(x) == len(export_a[0]):
        x, y = x[order_a], y[order_b]
      assert_bit_equal(x, y)


def fused_against_unfused(model, absent):
  """Trains `model` unfused, then fused: bit-equal training, one fused lookup and one fused apply
  in the fused step, and none of the `absent` ops. Returns (unfused, fused, the stats the fused
  run added)."""
  unfused = model.train_steps(UNFUSED)
  before = graph_optimizations.stats()
  fused = model.train_steps(FUSE_ONLY)
  after = graph_optimizations.stats()
  assert_same_training(unfused, fused)
  fused_ops = fused[2]
  assert fused_ops.count("TfExtFusedEmbeddingLookup") == 1
  assert fused_ops.count("TfExtFusedEmbeddingApply") == 1
  for op in absent:
    assert op not in fused_ops
  return unfused, fused, {name: after[name] - before[name] for name in after}


@pytest.mark.parametrize(
  "optimizer_fn",
  [
    lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.05, momentum=0.5, centered=True),
    # Its global step is one tensor for all updates: they still fuse.
    lambda: tf.compat.v1.train.AdagradDAOptimizer(
      0.1, tf.compat.v1.train.get_or_create_global_step(), l1_regularization_strength=0.01
    ),
  ],
  ids=["adam", "adagrad", "ftrl", "nesterov", "rmsprop", "adagrad_da"],
)
def test_session_training_is_bit_equal_and_fused(optimizer_fn):
  # All 7 lookups in one op, all 6 updates (the shared table's of two fields) in another: no
  # unfused find, update or dedup is left.
  model = SessionModel(optimizer_fn)
  absent = ("TfExtTableFind", "TfExtTableApplyGradient", "Unique")
  unfused, fused, added = fused_against_unfused(model, absent)
  # The 6 int64 fields of the fused apply take the fused lookup's distinct slots (not the string
  # field), in each graph the Session builds.
  assert added["slots_shared"] >= 6 and added["updates_fused"] >= 6
  assert unfused[2].count("TfExtTableFind") == 7
  assert unfused[2].count("TfExtTableApplyGradient") == 6
  assert len(fused[2]) < 0.75 * len(unfused[2])
  # The fused lookup looks each distinct id of a batch up once, but counts every id, as the
  # unfused lookups do.
  for stats_a, stats_b in zip(unfused[3], fused[3]):
    assert stats_a["lookups"] == stats_b["lookups"] and stats_a["lookups"] > 0
    assert stats_a["lookup_hits"] == stats_b["lookup_hits"]


def test_clipped_gradients_update_in_the_fused_apply():
  """Gradients clipped by their global norm reach the updates transformed, not from the lookups'
  markers: the updates still fuse (from the clipped rows, as TensorFlow computed them) and
  training stays bit-equal; the lookups fuse as before."""
  model = SessionModel(lambda: tf.compat.v1.train.AdamOptimizer(0.05), clip_norm=0.05)
  _, _, added = fused_against_unfused(model, ("TfExtTableApplyGradient", "Unique"))
  assert added["updates_fused"] >= 6
  # The clipped rows keep their lookups' ids in order: the int64 fields take the lookup's slots.
  assert added["slots_shared"] >= 6


def test_sharded_tables_fuse_shard_by_shard():
  """Every table in 3 shards: each shard's find and update is a field of the fused ops (the
  partition, stitch and combiners stay TensorFlow's), and training stays bit-equal."""
  model = SessionModel(lambda: tf.compat.v1.train.AdagradOptimizer(0.1), num_shards=3)
  absent = ("TfExtTableFind", "TfExtTableApplyGradient")
  unfused, fused, added = fused_against_unfused(model, absent)
  assert unfused[2].count("TfExtTableFind") == 7 * 3
  assert added["lookups_fused"] >= 7 * 3 and added["updates_fused"] >= 6 * 3
  for stats_a, stats_b in zip(unfused[3], fused[3]):
    assert stats_a["lookups"] == stats_b["lookups"] and stats_a["lookups"] > 0


class WideSessionModel:
  """20 single-id fields and a dense feature through one tf.concat (more than 16 inputs, so
  TensorFlow's gradient splits it with a SplitV), a small tower and Adam."""

  def __init__(self, fields=20, batch=24):
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.compat.v1.set_random_seed(2)
      init = tf.random_normal_initializer(0.0, 0.1)
      self.ids = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in range(fields)]
      self.dense = tf.compat.v1.placeholder(tf.float32, [None, 3])
      self.label = tf.compat.v1.placeholder(tf.float32, [None])
      tables = [
        tf_ext.get_dynamic_embedding_variable(unique("wide"), 2 + f % 3, initializer=init)
        for f in range(fields)
      ]
      embeddings = [tf_ext.embedding_lookup(t, x) for t, x in zip(tables, self.ids)]
      hidden = tf.keras.layers.Dense(4, "relu")(tf.concat(embeddings + [self.dense], 1))
      logit = tf.squeeze(tf.keras.layers.Dense(1)(hidden), 1)
      self.loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=self.label, logits=logit)
      )
      optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))
      self.train = optimizer.minimize(self.loss)
      self.probe = [t.lookup(tf.range(12, dtype=tf.int64)) for t in tables]
      self.initialize = tf.compat.v1.global_variables_initializer()
    rng = np.random.default_rng(4)
    self.feeds = []
    for _ in range(3):
      feed = {x: rng.integers(0, 12, batch) for x in self.ids}
      feed[self.dense] = rng.normal(size=(batch, 3)).astype(np.float32)
      feed[self.label] = rng.integers(0, 2, batch).astype(np.float32)
      self.feeds.append(feed)

  def train_steps(self, switches):
    """The losses, the rows of keys 0-11 of every table afterwards, the executed op types."""
    config = graph_optimizations.config_proto(**switches)
    with tf.compat.v1.Session(graph=self.graph, config=config) as session:
      session.run(self.initialize)
      losses = [session.run([self.loss, self.train], feed)[0] for feed in self.feeds]
      ops = _executed_ops(session, self.train, self.feeds[0])
      return losses, session.run(self.probe), ops


def test_a_split_gradient_is_read_in_place_and_training_stays_bit_equal():
  model = WideSessionModel()
  unfused = model.train_steps(UNFUSED)
  before = graph_optimizations.stats()
  fused = model.train_steps(FUSE_ONLY)
  after = graph_optimizations.stats()
  assert unfused[0] == fused[0]
  for a, b in zip(unfused[1], fused[1]):
    assert_bit_equal(a, b)
  assert "SplitV" in unfused[2]
  assert "SplitV" not in fused[2]  # the fused apply reads every field's piece of its input
  assert fused[2].count("TfExtFusedEmbeddingApply") == 1
  assert after["splits_read"] - before["splits_read"] >= 20
  assert after["concats_written"] - before["concats_written"] >= 1


def test_fetching_a_lookup_after_a_step_that_did_not_reads_its_values():
  """A Session keeps stateful kernels by node name across the graphs of its fetches: the graph of
  `train` alone (the lookup only concatenated, its own output left unwritten) and the graph that
  also fetches the lookup must not share a fused lookup. One field, so that both graphs list the
  same fields in the same order."""
  graph = tf.Graph()
  with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    dense = tf.compat.v1.placeholder(tf.float32, [None, 2])
    table = tf_ext.get_dynamic_embedding_variable(
      unique("fetched"), 3, initializer=tf.random_normal_initializer(0.0, 0.1)
    )
    embedding = tf_ext.embedding_lookup(table, ids)
    logit = tf.keras.layers.Dense(1)(tf.concat([embedding, dense], 1))
    train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
      tf.reduce_sum(tf.square(logit))
    )
    initialize = tf.compat.v1.global_variables_initializer()
  feed = {ids: [1, 2, 3, 1], dense: np.ones([4, 2], np.float32)}
  fetched = []
  for switches in (UNFUSED, FUSE_ONLY):
    config = graph_optimizations.config_proto(**switches)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(initialize)
      session.run(train, feed)
      fetched.append(session.run([embedding, train], feed)[0])
  assert_bit_equal(fetched[0], fetched[1])


def test_a_concatenation_that_depends_on_a_lookup_is_left_to_tensorflow():
  """concat([e1, 2 * e2]) cannot be written by the fused lookup (one of its inputs needs the
  lookup's result): it stays, the lookups still fuse, and training stays bit-equal."""
  graph = tf.Graph()
  with graph.as_default():
    init = tf.random_normal_initializer(0.0, 0.1)
    ids = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in range(2)]
    tables = [
      tf_ext.get_dynamic_embedding_variable(unique("dependent"), 3, initializer=init) for _ in ids
    ]
    e1, e2 = [tf_ext.embedding_lookup(t, x) for t, x in zip(tables, ids)]
    loss = tf.reduce_sum(tf.square(tf.concat([e1, 2.0 * e2], 1) - 0.5))
    train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
      loss
    )
    probe = [t.lookup(tf.range(6, dtype=tf.int64)) for t in tables]
    initialize = tf.compat.v1.global_variables_initializer()
  feed = {ids[0]: [0, 1, 1, 2], ids[1]: [3, 4, 5, 3]}

  def run(switches):
    config = graph_optimizations.config_proto(**switches)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(initialize)
      losses = [session.run([loss, train], feed)[0] for _ in range(3)]
      return losses, session.run(probe), _executed_ops(session, train, feed)

  unfused = run(UNFUSED)
  before = graph_optimizations.stats()
  fused = run(FUSE_ONLY)
  after = graph_optimizations.stats()
  assert unfused[0] == fused[0]
  for a, b in zip(unfused[1], fused[1]):
    assert_bit_equal(a, b)
  assert fused[2].count("TfExtFusedEmbeddingLookup") == 1
  assert "ConcatV2" in fused[2]
  assert after["concats_written"] == before["concats_written"]


def test_session_stats_count_the_fusions():
  model = SessionModel(lambda: tf.compat.v1.train.AdagradOptimizer(0.1))
  before = graph_optimizations.stats()
  model.train_steps(FUSE_ONLY, steps=1)
  after = graph_optimizations.stats()
  assert after["graphs_fused"] > before["graphs_fused"]
  assert after["lookups_fused"] - before["lookups_fused"] >= 7
  assert after["updates_fused"] - before["updates_fused"] >= 5
  assert after["concats_written"] - before["concats_written"] >= 1


def test_config_proto_extends_a_given_config_and_replaces_its_own_entry():
  base = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2)
  proto = graph_optimizations.config_proto(base, fuse_embeddings=False)
  proto = graph_optimizations.config_proto(proto, fuse_embeddings=True)
  assert proto.intra_op_parallelism_threads == 2
  customs = [c for c in proto.graph_options.rewrite_options.custom_optimizers]
  assert [c.name for c in customs] == [graph_optimizations.CONFIG_NAME]
  assert customs[0].parameter_map["fuse_embeddings"].b
  assert not base.graph_options.rewrite_options.custom_optimizers  # the given one is unchanged


def test_bad_arguments_are_named():
  with pytest.raises(TypeError, match="ConfigProto"):
    graph_optimizations.config_proto({"fuse_embeddings": True})
  with pytest.raises(TypeError, match="fuse_embeddings"):
    graph_optimizations.enable(fuse_embeddings="yes")
  with pytest.raises(TypeError, match="cluster_dense_for_xla"):
    graph_optimizations.config_proto(cluster_dense_for_xla=1)


def test_unknown_switch_in_a_session_config_fails_clearly():
  proto = graph_optimizations.config_proto()
  proto.graph_options.rewrite_options.custom_optimizers[0].parameter_map["fuse_all"].b = True
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable(unique("bad_switch"), 2)
    out = tf_ext.embedding_lookup(table, tf.constant([1, 2], tf.int64))
    initialize = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(config=proto) as session:
      for fetch in (initialize, out):  # every graph the session runs is checked
        with pytest.raises(tf.errors.InvalidArgumentError, match="fuse_all"):
          session.run(fetch)


def _settings_subprocess(env_value):
  code = (
    "from tf_ext import graph_optimizations as g\n"
    "print(g.enable()['fuse_embeddings'], g.config_proto().graph_options.rewrite_options"
    ".custom_optimizers[0].parameter_map['fuse_embeddings'].b)\n"
  )
  env = dict(os.environ, TF_EXT_GRAPH_FUSE_EMBEDDINGS=env_value, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_setting_turns_fusion_off_and_rejects_bad_values():
  off = _settings_subprocess("0")
  assert off.returncode == 0, off.stderr
  assert off.stdout.split() == ["False", "False"]
  bad = _settings_subprocess("maybe")
  assert bad.returncode != 0
  assert "TF_EXT_GRAPH_FUSE_EMBEDDINGS" in bad.stderr


def _keras_model(prefix, fields=3):
  tf.keras.utils.set_random_seed(3)
  ragged = tf.keras.Input(shape=(None,), dtype=tf.int64, ragged=True, name="ragged")
  single = tf.keras.Input(shape=(), dtype=tf.int64, name="single")
  init = tf.random_normal_initializer(0.0, 0.1)
  embeddings = [
    tf_ext.keras.layers.DynamicEmbedding(
      4, combiner="mean", initializer=init, name=f"{prefix}r{i}"
    )(ragged)
    for i in range(fields)
  ]
  embeddings.append(
    tf_ext.keras.layers.DynamicEmbedding(4, initializer=init, name=f"{prefix}s")(single)
  )
  hidden = tf.keras.layers.Dense(8, "relu")(tf.concat(embeddings, axis=1))
  model = tf.keras.Model({"ragged": ragged, "single": single}, tf.keras.layers.Dense(1)(hidden))
  model.compile(
    optimizer=tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)),
    loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
  )
  return model


def _keras_data(batch=32, steps=4):
  rng = np.random.default_rng(5)
  lengths = rng.integers(0, 5, batch * steps)
  ragged = tf.RaggedTensor.from_row_lengths(rng.integers(0, 40, lengths.sum()), lengths)
  single = rng.integers(0, 40, batch * steps)
  label = rng.integers(0, 2, batch * steps).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(({"ragged": ragged, "single": single}, label)).batch(
    batch
  )


@pytest.mark.parametrize(
  "fields", [3, 16], ids=["4 inputs", "17 inputs: the gradient splits them with a SplitV"]
)
def test_keras_fit_is_bit_equal_and_fused(process_switches, fields):
  graph_optimizations.disable()
  unfused = _keras_model(unique("kunfused"), fields)
  history_a = unfused.fit(_keras_data(), epochs=2, verbose=0).history["loss"]
  graph_optimizations.enable(**FUSE_ONLY)
  before = graph_optimizations.stats()
  fused = _keras_model(unique("kfused"), fields)
  history_b = fused.fit(_keras_data(), epochs=2, verbose=0).history["loss"]
  after = graph_optimizations.stats()
  assert history_a == history_b
  for a, b in zip(unfused.get_weights(), fused.get_weights()):
    assert_bit_equal(a, b)
  assert after["lookups_fused"] - before["lookups_fused"] >= fields + 1
  assert after["updates_fused"] - before["updates_fused"] >= fields + 1
  # More than 16 concatenated inputs: the fused apply reads each gradient in the SplitV's input.
  splits_read = after["splits_read"] - before["splits_read"]
  assert splits_read >= fields + 1 if fields + 1 > 16 else splits_read == 0
  assert after["concats_written"] - before["concats_written"] >= 1
  probe = {"ragged": tf.ragged.constant([[1, 2], [3]], tf.int64), "single": tf.constant([1, 39])}
  assert_bit_equal(unfused.predict(probe, verbose=0), fused.predict(probe, verbose=0))


def test_tf_function_tape_loop_is_bit_equal_and_fused(process_switches):
  def train(prefix):
    table = tf_ext.get_dynamic_embedding_variable(unique(prefix), 3)
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.5))

    @tf.function
    def step(ids):
      with tf.GradientTape() as tape:
        rows = tf_ext.embedding_lookup(table, ids, combiner="sqrtn")
        loss = tf.reduce_sum(tf.square(rows - 1.0))
      variables = [table.gradient_anchor]
      optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
      return loss

    ids = tf.sparse.from_dense(tf.constant([[1, 2, 2], [3, 0, 0], [2, 5, 1]], tf.int64))
    losses = [float(step(ids)) for _ in range(3)]
    return losses, table.lookup(tf.constant([0, 1, 2, 3, 5], tf.int64)).numpy()

  graph_optimizations.disable()
  losses_a, rows_a = train("tape_unfused")
  graph_optimizations.enable(**FUSE_ONLY)
  before = graph_optimizations.stats()
  losses_b, rows_b = train("tape_fused")
  after = graph_optimizations.stats()
  assert losses_a == losses_b
  assert_bit_equal(rows_a, rows_b)
  assert after["lookups_fused"] > before["lookups_fused"]
  assert after["updates_fused"] > before["updates_fused"]


def _updates_per_lookup(before, after):
  return (after["updates_fused"] - before["updates_fused"]) / (
    after["lookups_fused"] - before["lookups_fused"]
  )


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=["int64 ids", "string ids"])
def test_a_table_looked_up_twice_updates_in_the_fused_apply(process_switches, key_dtype):
  """DIN-style sharing: one table serves a behaviour history (mean), a target id and candidates
  (sum). TensorFlow concatenates the three lookups' gradients into one update, which the fused
  apply takes over as three fields of one update: bit-equal training, and every update fused (2
  updates for 4 lookups; before, the shared table's stayed unfused)."""

  def ids(values):
    return tf.constant(values if key_dtype == tf.int64 else [f"i{v}" for v in values])

  history = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]], ids([4, 7, 7, 2, 9]), [3, 2])
  candidates = tf.SparseTensor([[0, 0], [1, 0], [1, 1], [2, 0]], ids([5, 9, 7, 3]), [3, 2])
  target, user = ids([7, 5, 4]), tf.constant([1, 2, 1], tf.int64)

  def train(prefix):
    init = tf.random_normal_initializer(0.0, 0.1, seed=3)
    items = tf_ext.get_dynamic_embedding_variable(
      unique(prefix), 3, key_dtype=key_dtype, initializer=init
    )
    users = tf_ext.get_dynamic_embedding_variable(unique(prefix), 3, initializer=init)
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))

    @tf.function
    def step():
      with tf.GradientTape() as tape:
        rows = [
          tf_ext.embedding_lookup(items, history, combiner="mean"),
          tf_ext.embedding_lookup(items, target),
          tf_ext.embedding_lookup(items, candidates, combiner="sum"),
          tf_ext.embedding_lookup(users, user),
        ]
        loss = tf.reduce_sum(tf.square(tf.concat(rows, 1) - 0.5))
      variables = [items.gradient_anchor, users.gradient_anchor]
      optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
      return loss

    losses = [float(step()) for _ in range(3)]
    return losses, items.lookup(ids([2, 3, 4, 5, 7, 9])).numpy(), users.lookup(user).numpy()

  graph_optimizations.disable()
  unfused = train("shared_unfused")
  graph_optimizations.enable(**FUSE_ONLY)
  before = graph_optimizations.stats()
  fused = train("shared_fused")
  after = graph_optimizations.stats()
  assert unfused[0] == fused[0]
  for a, b in zip(unfused[1:], fused[1:]):
    assert_bit_equal(a, b)
  assert _updates_per_lookup(before, after) == pytest.approx(2 / 4)


def test_keras_layer_called_twice_updates_in_the_fused_apply(process_switches):
  """One DynamicEmbedding layer on a query item and a clicked item (a shared item table), and a
  second one: fit is bit-equal, and both tables' updates are fused."""

  def model(prefix):
    tf.keras.utils.set_random_seed(2)
    query = tf.keras.Input(shape=(), dtype=tf.int64, name="query")
    clicked = tf.keras.Input(shape=(), dtype=tf.int64, name="clicked")
    user = tf.keras.Input(shape=(), dtype=tf.int64, name="user")
    items = tf_ext.keras.layers.DynamicEmbedding(4, name=unique(prefix + "_items"))
    users = tf_ext.keras.layers.DynamicEmbedding(4, name=unique(prefix + "_users"))
    features = tf.concat([items(query), items(clicked), users(user)], axis=1)
    inputs = {"query": query, "clicked": clicked, "user": user}
    net = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(features))
    net.compile(
      optimizer=tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.2)),
      loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return net

  rng = np.random.default_rng(8)
  x = {name: rng.integers(0, 30, 96) for name in ("query", "clicked", "user")}
  y = (x["query"] == x["clicked"] % 7).astype(np.float32)
  graph_optimizations.disable()
  unfused = model("kshared_unfused")
  history_a = unfused.fit(x, y, batch_size=32, epochs=2, verbose=0).history["loss"]
  graph_optimizations.enable(**FUSE_ONLY)
  before = graph_optimizations.stats()
  fused = model("kshared_fused")
  history_b = fused.fit(x, y, batch_size=32, epochs=2, verbose=0).history["loss"]
  after = graph_optimizations.stats()
  assert history_a == history_b
  probe = {name: values[:8] for name, values in x.items()}
  assert_bit_equal(unfused.predict(probe, verbose=0), fused.predict(probe, verbose=0))
  assert _updates_per_lookup(before, after) == pytest.approx(2 / 3)


def test_graphs_without_tables_are_unchanged(process_switches):
  graph_optimizations.enable()
  before = graph_optimizations.stats()

  @tf.function
  def dense(x):
    return tf.reduce_sum(tf.matmul(x, x))

  assert float(dense(tf.ones([3, 3]))) == 27.0
  assert graph_optimizations.stats() == before


def test_lookups_in_a_loop_or_cond_stay_unfused_and_correct():
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable(
      unique("loop"), 2, initializer=tf.constant_initializer(0.5)
    )
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
    outside = tf_ext.embedding_lookup(table, ids, combiner="sum")
    inside = tf.while_loop(
      lambda i, acc: i < 2,
      lambda i, acc: (i + 1, acc + tf_ext.embedding_lookup(table, ids, combiner="sum")),
      (0, tf.zeros([2, 2])),
    )[1]
    take = tf.compat.v1.placeholder_with_default(True, [])  # not constant: Grappler keeps the cond
    cond = tf.compat.v1.cond(
      take,
      lambda: tf_ext.embedding_lookup(table, ids, combiner="mean"),
      lambda: tf.zeros([2, 2]),
    )
    initialize = tf.compat.v1.global_variables_initializer()
    config = graph_optimizations.config_proto(**FUSE_ONLY)
    with tf.compat.v1.Session(config=config) as session:
      session.run(initialize)
      got = session.run([outside, inside, cond])
      ops = _executed_ops(session, [outside, inside, cond], None)
  # ids 0 (from_dense drops zeros) -> [[1, 1], [0.5, 0.5]] summed, [[0.5]*2, [0.5]*2] mean
  np.testing.assert_allclose(got[0], [[1.0, 1.0], [0.5, 0.5]])
  np.testing.assert_allclose(got[1], 2 * got[0])
  np.testing.assert_allclose(got[2], [[0.5, 0.5], [0.5, 0.5]])
  assert ops.count("TfExtFusedEmbeddingLookup") == 1  # only the lookup outside the loop and cond
  assert ops.count("TfExtTableFind") == 2


def test_estimator_trains_with_fused_lookups(tmp_path):
  name = unique("estimator")

  def model_fn(features, labels, mode):
    rows = tf_ext.dynamic_embedding(features["ids"], 4, name, combiner="mean")
    logit = tf.squeeze(tf.keras.layers.Dense(1)(rows), axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logit))
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    train = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

  def input_fn():
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0], [4, 4]], tf.int64))
    return tf.data.Dataset.from_tensors(({"ids": ids}, tf.constant([1.0, 0.0, 1.0]))).repeat(5)

  config = tf.estimator.RunConfig(
    model_dir=str(tmp_path), session_config=graph_optimizations.config_proto(**FUSE_ONLY)
  )
  before = graph_optimizations.stats()
  tf.estimator.Estimator(model_fn, config=config).train(input_fn)
  after = graph_optimizations.stats()
  assert after["lookups_fused"] > before["lookups_fused"]
  assert after["updates_fused"] > before["updates_fused"]


def test_canned_estimator_with_feature_columns_fuses_and_learns(tmp_path):
  """The label is the user id's parity: only trained user rows can predict it."""
  fcol = tf_ext.feature_column
  user = fcol.categorical_column_with_dynamic_vocabulary(unique("fc_user"), tf.int64)
  city = fcol.categorical_column_with_dynamic_vocabulary(unique("fc_city"), tf.string)
  columns = [fcol.dynamic_embedding_column(user, 4), fcol.dynamic_embedding_column(city, 4)]
  estimator = tf.compat.v1.estimator.DNNClassifier(
    [8],
    columns,
    optimizer=tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3)),
    config=tf.estimator.RunConfig(
      model_dir=str(tmp_path), session_config=graph_optimizations.config_proto(**FUSE_ONLY)
    ),
  )
  rng = np.random.default_rng(1)
  features = {
    user.key: rng.integers(10**12, 10**12 + 50, (512, 1)),
    city.key: rng.choice(np.array([b"a", b"b", b"c"]), (512, 1)),
  }
  labels = (features[user.key][:, 0] % 2).astype(np.int64)

  def input_fn():
    return tf.data.Dataset.from_tensor_slices((features, labels)).repeat(4).batch(32)

  before = graph_optimizations.stats()
  estimator.train(input_fn)
  after = graph_optimizations.stats()
  assert after["lookups_fused"] - before["lookups_fused"] >= 2
  assert after["updates_fused"] - before["updates_fused"] >= 2
  assert estimator.evaluate(input_fn, steps=4)["auc"] > 0.95


def test_fused_ops_reject_bad_inputs_with_the_table_named():
  ops = tf_ext._ops_loader.load()
  table = tf_ext.get_dynamic_embedding_variable(unique("direct"), 2)
  keys = tf.constant([1, 2, 3], tf.int64)

  def lookup(segment_ids, num_segments, dims=(2,), combiners=("mean",), field_keys=keys):
    return ops.tf_ext_fused_embedding_lookup(
      [table.resource_handle],
      [field_keys],
      [tf.constant(segment_ids, tf.int64)],
      [tf.constant(num_segments, tf.int64)],
      [],
      dims=list(dims),
      combiners=list(combiners),
    )

  rows = table.lookup(keys).numpy()
  np.testing.assert_array_equal(
    lookup([0, 0, 1], 2).embeddings[0].numpy(), [(rows[0] + rows[1]) / 2, rows[2]]
  )
  with pytest.raises(tf.errors.InvalidArgumentError, match="direct.*segment_ids\\[2\\] = 5"):
    lookup([0, 0, 5], 2)
  with pytest.raises(tf.errors.InvalidArgumentError, match="direct.*num_segments is -1"):
    lookup([0, 0, 0], -1)
  with pytest.raises(tf.errors.InvalidArgumentError, match="direct.*expects int64 keys and dim 3"):
    lookup([0, 0, 0], 1, dims=(3,))
  with pytest.raises(tf.errors.InvalidArgumentError, match="direct.*must be 1-D"):
    lookup([0, 0, 0], 1, field_keys=tf.constant([[1, 2, 3]], tf.int64))
  with pytest.raises(tf.errors.InvalidArgumentError, match="unknown combiner 'max'"):
    lookup([0, 0, 0], 1, combiners=("max",))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="direct.*output gradient has 6 elements"
  ):
    # 2 segments, not 3 rows
    fused_apply(table, keys, tf.constant([0, 0, 1], tf.int64), 2, tf.ones([3, 2]), "mean", "sgd")
  assert int(table.size()) == 0  # nothing was written


def test_fused_lookup_writes_a_concatenation_and_rejects_pieces_that_do_not_fit():
  """The fused lookup's concatenated output equals tf.concat of its fields and extras along any
  axis, whether a field goes straight into its window or through its own output; unread fields
  keep their shapes; pieces that do not fit and bad layouts are named."""
  ops = tf_ext._ops_loader.load()
  tables = [tf_ext.get_dynamic_embedding_variable(unique("concat"), 2) for _ in range(3)]
  keys = [
    tf.constant([1, 2, 3], tf.int64),  # one row each: [3, 2]
    tf.constant([4, 5, 6, 7], tf.int64),  # mean over 3 segments: [3, 2]
    tf.constant([[1, 8], [9, 2], [3, 3]], tf.int64),  # one row each: [3, 2, 2]
  ]

  def lookup(extras=(), layout=(), axis=0, unread=()):
    return ops.tf_ext_fused_embedding_lookup(
      [t.resource_handle for t in tables],
      keys,
      [tf.zeros([3], tf.int64), tf.constant([0, 2, 2, 0], tf.int64), tf.zeros([6], tf.int64)],
      [tf.constant(0, tf.int64), tf.constant(3, tf.int64), tf.constant(0, tf.int64)],
      list(extras),
      dims=[2, 2, 2],
      combiners=["none", "mean", "none"],
      concat_layout=list(layout),
      concat_axis=axis,
      unread_fields=list(unread),
    )

  fields = lookup().embeddings
  assert lookup().concatenated.shape == [0]
  dense = tf.reshape(tf.range(3, dtype=tf.float32), [3, 1])
  for unread in [(), (0, 1)]:
    out = lookup([dense], [1, -1, 0, 1], 1, unread)
    assert_bit_equal(out.concatenated, tf.concat([fields[1], dense, fields[0], fields[1]], 1))
    assert [f.shape for f in out.embeddings] == [f.shape for f in fields]
  cube = tf.reshape(tf.range(12, dtype=tf.float32), [3, 2, 2])
  for axis, extra in [(-1, cube[:, :, :1]), (1, cube[:, :1]), (0, cube)]:  # in place, copied
    out = lookup([extra], [2, -1], axis, unread=[2])
    assert_bit_equal(out.concatenated, tf.concat([fields[2], extra], axis))
  with pytest.raises(tf.errors.InvalidArgumentError, match="piece 1 has shape \\[4,1\\]"):
    lookup([tf.zeros([4, 1])], [0, -1], 1)
  with pytest.raises(tf.errors.InvalidArgumentError, match="does not fit"):
    lookup([], [0, 2], 1)  # a matrix and a rank-3 field
  with pytest.raises(tf.errors.InvalidArgumentError, match="entry 3 names neither"):
    lookup([], [0, 3], 1)
  with pytest.raises(tf.errors.InvalidArgumentError, match="unread_fields entry 5"):
    lookup([dense], [0, -1], 1, unread=[5])


def fused_apply(table, keys, segments, num_segments, gradient, combiner, optimizer, **attrs):
  """The raw fused apply of one field of dim 2, with learning rate 0.1 and Adam's defaults, at
  step 1; attrs: split_sizes (list), distinct_slots (int32 values, empty: none) and the op's
  attributes."""
  return tf_ext._ops_loader.load().tf_ext_fused_embedding_apply(
    [table.resource_handle],
    [keys],
    [segments],
    [tf.constant(num_segments, tf.int64)],
    [gradient],
    0.1,
    0.9,
    0.999,
    1e-7,
    tf.constant(1, tf.int64),
    [],
    attrs.pop("split_sizes", []),
    [tf.constant(attrs.pop("distinct_slots", np.zeros([0], np.int32)), tf.int32)],
    dims=[2],
    combiners=[combiner],
    optimizer=optimizer,
    **attrs,
  )


def test_fused_apply_sums_the_fields_of_one_update_and_rejects_bad_groupings():
  """field_updates: two fields of one table in one update equal one field of their concatenated
  ids (bit for bit, with and without the lookup's slots); groupings that are not consecutive,
  or that join fields of different tables, are rejected with nothing written."""
  keys = [tf.constant([3, 1, 3], tf.int64), tf.constant([1, 4], tf.int64)]
  gradients = [tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([[0.5, 0.25], [8.0, 1.0]])]
  segments = [tf.constant([0, 1, 1], tf.int64), tf.constant([0, 1], tf.int64)]

  def apply(tables, field_updates, slots=None):
    slots = slots or [np.zeros([0], np.int32)] * 2
    return tf_ext._ops_loader.load().tf_ext_fused_embedding_apply(
      [t.resource_handle for t in tables],
      keys,
      segments,
      [tf.constant(2, tf.int64)] * 2,
      gradients,
      0.1,
      0.9,
      0.999,
      1e-7,
      tf.constant(1, tf.int64),
      [],
      [],
      [tf.constant(s, tf.int32) for s in slots],
      dims=[2, 2],
      combiners=["mean", "none"],
      optimizer="adam",
      field_updates=field_updates,
    )

  def table(prefix):
    return tf_ext.get_dynamic_embedding_variable(
      unique(prefix), 2, initializer=tf.constant_initializer(0.5)
    )

  # The concatenation as one field: the mean field's rows are its gradient rows divided by
  # their segments' sizes (1 and 2), then the second field's rows.
  whole = table("whole")
  rows = tf.concat([tf.gather(gradients[0] / [[1.0], [2.0]], segments[0]), gradients[1]], 0)
  fused_apply(whole, tf.concat(keys, 0), tf.range(5, dtype=tf.int64), 5, rows, "none", "adam")
  ids = tf.constant([1, 3, 4], tf.int64)
  for slots in (None, [np.array([0, 1, 0], np.int32), np.array([0, 1], np.int32)]):
    grouped = table("grouped")
    apply([grouped, grouped], [0, 0], slots)
    assert_bit_equal(grouped.lookup(ids), whole.lookup(ids))
    assert int(grouped.size()) == 3
  separate = [table("first"), table("second")]
  apply(separate, [0, 1])  # two updates, as without field_updates
  assert int(separate[0].size()) == 2 and int(separate[1].size()) == 2

  untouched = [table("bad_a"), table("bad_b")]
  for field_updates, match in [
    ([1, 1], "field_updates\\[0\\] is 1"),
    ([0, 2], "field_updates\\[1\\] is 2"),
    ([0], "field_updates has 1 entries for N = 2"),
  ]:
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
      apply([untouched[0], untouched[0]], field_updates)
  with pytest.raises(tf.errors.InvalidArgumentError, match="not of its table"):
    apply(untouched, [0, 0])
  assert int(untouched[0].size()) == 0 and int(untouched[1].size()) == 0


def test_fused_apply_reads_a_split_piece_and_rejects_bad_splits():
  """The fused apply reads field gradients as pieces of a SplitV's input: the same update as the
  piece itself, and a clear error for sizes, indices or axes that do not fit."""
  keys = tf.constant([1, 2, 3], tf.int64)
  block = tf.reshape(tf.range(15, dtype=tf.float32), [3, 5])  # pieces of widths 1, 2, 2

  def apply(table, gradient, split_sizes=(), splits=None, axes=None):
    extra = {} if splits is None else {"gradient_splits": splits, "gradient_split_axes": axes}
    sizes = [tf.constant(s, dtype) for s, dtype in split_sizes]
    return fused_apply(
      table, keys, tf.zeros([3], tf.int64), 0, gradient, "none", "sgd", split_sizes=sizes, **extra
    )

  piece = tf_ext.get_dynamic_embedding_variable(unique("piece"), 2)
  split = tf_ext.get_dynamic_embedding_variable(unique("split"), 2)
  apply(piece, block[:, 3:5])
  apply(split, block, [([1, 2, -1], tf.int32)], splits=[2], axes=[1])
  assert_bit_equal(piece.lookup(keys), split.lookup(keys))
  bad = tf_ext.get_dynamic_embedding_variable(unique("bad_split"), 2)
  for sizes, index, axis, message in [
    ([1, 2, 1], 2, 1, "do not add up"),
    ([1, 2, -1, -1], 2, 1, "negative size"),
    ([1, 2, 2], 3, 1, "split 3 of 3"),
    ([1, 2, 2], 1, 2, "axis 2 is out of range"),
    ([1, 2, 2], 0, 1, "has 3 elements"),  # a piece of width 1 cannot hold 3 rows of 2
  ]:
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"bad_split.*{message}"):
      apply(bad, block, [(sizes, tf.int64)], splits=[index], axes=[axis])
  with pytest.raises(tf.errors.InvalidArgumentError, match="bad_split.*no split_sizes entry"):
    apply(bad, block, [], splits=[1], axes=[1])
  with pytest.raises(tf.errors.InvalidArgumentError, match="gradient_splits and gradient_split"):
    apply(bad, block, [([3, 2], tf.int64)], splits=[1, 0], axes=[1, 1])
  assert int(bad.size()) == 0  # nothing was written


def test_fused_apply_takes_the_lookups_distinct_slots_and_rejects_bad_ones():
  """The fused lookup gives each int64 id its position among the field's distinct ids; the fused
  apply takes them instead of hashing the ids again: the same update, and a clear error, with
  nothing written, for slots that are not those of the ids."""
  ops = tf_ext._ops_loader.load()
  keys = tf.constant([5, 7, 5, 9, 7], tf.int64)
  segments = tf.constant([0, 0, 1, 1, 2], tf.int64)
  gradient = tf.reshape(tf.range(6, dtype=tf.float32), [3, 2])  # mean over 3 segments

  def lookup(table):
    return ops.tf_ext_fused_embedding_lookup(
      [table.resource_handle],
      [keys],
      [segments],
      [tf.constant(3, tf.int64)],
      [],
      dims=[2],
      combiners=["mean"],
    )

  def apply(table, slots):
    return fused_apply(table, keys, segments, 3, gradient, "mean", "adam", distinct_slots=slots)

  hashed = tf_ext.get_dynamic_embedding_variable(unique("hashed"), 2)
  given = tf_ext.get_dynamic_embedding_variable(unique("given"), 2)
  slots = lookup(given).distinct_slots[0]
  np.testing.assert_array_equal(slots.numpy(), [0, 1, 0, 2, 1])
  apply(hashed, np.zeros([0], np.int32))
  apply(given, slots)
  for a, b in zip(hashed.export(), given.export()):  # keys, rows, Adam slots, counts, steps
    assert_bit_equal(a, b)
  bad = tf_ext.get_dynamic_embedding_variable(unique("bad_slots"), 2)
  for bad_slots, message in [
    ([0, 1, 0], "3 entries for 5 keys"),
    ([0, 2, 0, 1, 2], "slot 2 of id 1 is out of order"),
    ([0, 1, 1, 2, 1], "slot 1 of id 2 belongs to another id"),
    ([0, 1, 0, 2, -1], "slot -1 of id 4 is out of order"),
  ]:
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"bad_slots.*{message}"):
      apply(bad, bad_slots)
  assert int(bad.size()) == 0  # nothing was written
  strings = tf_ext.get_dynamic_embedding_variable(unique("words_slots"), 2, key_dtype=tf.string)
  words = ops.tf_ext_fused_embedding_lookup(
    [strings.resource_handle],
    [tf.constant(["a", "b", "a"])],
    [tf.zeros([3], tf.int64)],
    [tf.constant(0, tf.int64)],
    [],
    dims=[2],
    combiners=["none"],
  )
  assert words.distinct_slots[0].shape == [0]  # string ids: the apply hashes them itself


def test_ids_behind_an_identity_or_reshape_still_share_their_slots():
  """The pass matches a lookup's ids and its update's ids through Identity and Reshape on both
  sides: ids fed through tf.identity and a reshape still give the update the lookup's slots."""

  def train_once(switches):
    graph = tf.Graph()
    with graph.as_default():
      ids = tf.compat.v1.placeholder(tf.int64, [None])
      table = tf_ext.get_dynamic_embedding_variable(unique("behind"), 3)
      rows = tf_ext.embedding_lookup(table, tf.reshape(tf.identity(ids), [-1]))
      loss = tf.reduce_sum(rows * rows)
      train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss)
      export = table.export()
    config = graph_optimizations.config_proto(**switches)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train, {ids: [4, 9, 4, 2]})
      return session.run(export)

  unfused = train_once(UNFUSED)
  before = graph_optimizations.stats()
  fused = train_once(FUSE_ONLY)
  assert graph_optimizations.stats()["slots_shared"] - before["slots_shared"] == 1
  for a, b in zip(unfused, fused):
    assert_bit_equal(a, b)

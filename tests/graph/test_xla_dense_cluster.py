"""XLA around the tables (kernels/graph/xla_dense_cluster_pass.cc): with cluster_dense_for_xla on,
the dense part of a model with tf_ext tables is compiled by XLA while the table ops stay outside,
in TF1 Sessions, tf.function and Keras fit, and trains as the unclustered
model does; graphs without tables, and sessions with the switch off, are left alone."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext import graph_optimizations

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
XLA_OPS = {"_XlaCompile", "_XlaRun", "XlaLaunch"}
STEPS = 5


def _sparse_ids(rng, batch):
  indices = [[row, col] for row in range(batch) for col in range(rng.integers(1, 4))]
  ids = rng.integers(0, 50, len(indices)).astype(np.int64)
  return tf.compat.v1.SparseTensorValue(indices, ids, [batch, 3])


def _session_model(with_tables):
  """A CTR-like model: two mean-combined lookups (if `with_tables`), dense features, a tower,
  Adagrad for tables and dense weights."""
  graph = tf.Graph()
  with graph.as_default():
    dense = tf.compat.v1.placeholder(tf.float32, [None, 3], name="dense")
    labels = tf.compat.v1.placeholder(tf.float32, [None], name="labels")
    features, sparse = [dense], []
    if with_tables:
      for name, init in (("user", 0.1), ("item", -0.05)):
        ids = tf.compat.v1.sparse_placeholder(tf.int64, name=f"{name}_ids")
        sparse.append(ids)
        features.append(tf_ext.dynamic_embedding(ids, 4, name=name, initializer=init))
    kernel_init = tf.compat.v1.glorot_uniform_initializer(seed=1)
    hidden = tf.compat.v1.layers.dense(
      tf.concat(features, 1), 16, tf.nn.relu, kernel_initializer=kernel_init
    )
    logits = tf.compat.v1.layers.dense(hidden, 1, kernel_initializer=kernel_init)[:, 0]
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.3)
    train = tf_ext.DynamicEmbeddingOptimizer(optimizer).minimize(loss)
    init = tf.compat.v1.global_variables_initializer()
  return graph, (dense, labels, sparse), loss, train, init


def _train_in_session(config, with_tables=True):
  """Losses of STEPS training steps, and the op types of the first step's partition graphs."""
  graph, (dense, labels, sparse), loss, train, init = _session_model(with_tables)
  options = tf.compat.v1.RunOptions(output_partition_graphs=True)
  metadata = tf.compat.v1.RunMetadata()
  losses = []
  with tf.compat.v1.Session(graph=graph, config=config) as session:
    session.run(init)
    for step in range(STEPS):
      rng = np.random.default_rng(step)
      batch = 8
      feed = {dense: rng.normal(size=(batch, 3)), labels: rng.random(batch) > 0.5}
      feed.update({ids: _sparse_ids(rng, batch) for ids in sparse})
      first = step == 0
      value, _ = session.run(
        [loss, train],
        feed,
        options=options if first else None,
        run_metadata=metadata if first else None,
      )
      losses.append(value)
  nodes = [node for partition in metadata.partition_graphs for node in partition.node]
  return np.array(losses), nodes


@pytest.mark.parametrize("fuse_embeddings", [False, True])
def test_session_compiles_the_dense_part_and_trains_as_without(fuse_embeddings):
  plain, plain_nodes = _train_in_session(None)
  config = graph_optimizations.config_proto(
    fuse_embeddings=fuse_embeddings, cluster_dense_for_xla=True
  )
  clustered, nodes = _train_in_session(config)
  types = {node.op for node in nodes}
  assert not XLA_OPS & {node.op for node in plain_nodes}
  assert XLA_OPS & types, "XLA compiled nothing"
  # The tables run as ordinary TensorFlow ops, outside every cluster.
  table_ops = [node for node in nodes if node.op.startswith("TfExt")]
  assert {"TfExtFusedEmbeddingLookup" if fuse_embeddings else "TfExtTableFind"} <= types
  assert all("_XlaCompile" not in node.attr for node in table_ops)
  # The tower and the dense weights' updates run in clusters (the gradient of the embeddings, on
  # the tables' side, stays a TensorFlow MatMul).
  assert not {"_FusedMatMul", "Relu", "ResourceApplyAdagrad"} & types
  np.testing.assert_allclose(clustered, plain, rtol=1e-5)


def test_graph_without_tables_is_left_unchanged():
  plain, _ = _train_in_session(None, with_tables=False)
  config = graph_optimizations.config_proto(cluster_dense_for_xla=True)
  clustered, nodes = _train_in_session(config, with_tables=False)
  assert not XLA_OPS & {node.op for node in nodes}
  np.testing.assert_array_equal(clustered, plain)


def test_switch_off_leaves_the_graph_to_tensorflow(monkeypatch):
  config = graph_optimizations.config_proto(cluster_dense_for_xla=False)
  _, nodes = _train_in_session(config)
  assert not XLA_OPS & {node.op for node in nodes}
  monkeypatch.setenv("TF_EXT_GRAPH_CLUSTER_DENSE", "0")  # the setting, when no argument says
  _, nodes = _train_in_session(graph_optimizations.config_proto())
  assert not XLA_OPS & {node.op for node in nodes}


# enable() is process-wide and XLA's dump folder is set once per process: a subprocess of its own.
# It trains twice, before and after enable(), and checks that XLA compiled only after.
_TF2_SCRIPT = textwrap.dedent(
  """
  import os, sys
  import numpy as np
  import tensorflow as tf
  import tf_ext
  from tf_ext import graph_optimizations

  dump = os.environ["XLA_DUMP"]
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 100, (64, 3)).astype(np.int64)
  dense = rng.normal(size=(64, 2)).astype(np.float32)
  labels = (rng.random(64) > 0.5).astype(np.float32)

  def keras_losses(name):
    tf.keras.utils.set_random_seed(0)
    ids_in = tf.keras.Input(shape=(3,), dtype=tf.int64)
    dense_in = tf.keras.Input(shape=(2,))
    layer = tf_ext.keras.layers.DynamicEmbedding(4, combiner="mean", initializer=0.1, name=name)
    emb = layer(ids_in)
    hidden = tf.keras.layers.Dense(8, activation="relu")(tf.concat([emb, dense_in], 1))
    model = tf.keras.Model([ids_in, dense_in], tf.keras.layers.Dense(1)(hidden))
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.Adagrad(0.3))
    model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit([ids, dense], labels, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"]

  def function_losses(name):
    tf.keras.utils.set_random_seed(0)
    table = tf_ext.get_dynamic_embedding_variable(name, 4, initializer=0.1)
    hidden, out = tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)
    hidden.build((None, 6)), out.build((None, 8))
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.Adagrad(0.3))
    variables = hidden.trainable_variables + out.trainable_variables + [table.gradient_anchor]

    @tf.function
    def step(ids, x, y):
      emb = tf_ext.embedding_lookup(table, ids, combiner="mean")
      logits = out(hidden(tf.concat([emb, x], 1)))[:, 0]
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
      optimizer.apply_gradients(zip(tf.gradients(loss, variables), variables))
      return loss

    batches = [slice(start, start + 16) for start in range(0, 64, 16)]
    return [float(step(ids[b], dense[b], labels[b])) for b in batches]

  train = {"function": function_losses, "keras": keras_losses}[sys.argv[1]]
  plain = train("plain")
  assert not os.listdir(dump), os.listdir(dump)  # without enable(): no XLA
  graph_optimizations.enable(fuse_embeddings=False, cluster_dense_for_xla=True)
  clustered = train("clustered")
  graph_optimizations.disable()
  modules = [f for f in os.listdir(dump) if f.endswith(".txt")]
  assert modules, "XLA compiled nothing"
  np.testing.assert_allclose(clustered, plain, rtol=1e-5)
  print("ok", len(modules), "XLA dump files")
  """
)


def _run_tf2(kind, tmp_path):
  dump = tmp_path / "xla_dump"
  dump.mkdir()
  env = dict(os.environ, XLA_DUMP=str(dump), XLA_FLAGS=f"--xla_dump_to={dump}")
  env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
  result = subprocess.run(
    [sys.executable, "-c", _TF2_SCRIPT, kind], env=env, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0, result.stdout + result.stderr[-4000:]
  assert "ok" in result.stdout


def test_tf_function_with_enable_compiles_and_trains_as_without(tmp_path):
  _run_tf2("function", tmp_path)


def test_keras_fit_with_enable_compiles_and_trains_as_without(tmp_path):
  _run_tf2("keras", tmp_path)

"""Rank program: tf_ext.DynamicEmbeddingOptimizer and LightCC's DistributedOptimizer /
DistributedGradientTape compose in either order, in TF1 (Session), Keras (fit) and GradientTape
(tf.function) training, with LIGHT_* settings off (Horovod's own wrappers) or on (2D + TOPK at
ratio 1.0, so still exact).

Every rank trains on its own quarter of the data; the result must equal, on every rank, the
same model trained in one process on all of it (the mean of the ranks' mean gradients is the
gradient of the mean loss), and all ranks must hold identical tables and weights.

main(light): 0 for Horovod's wrappers, 1 for 2D + TOPK (run as a script: $LIGHT).
"""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _rank_checks import finish, ranks_differ  # noqa: E402

import tf_ext  # noqa: E402
import tf_ext.lightcc as hvd  # noqa: E402
import tf_ext.lightcc.keras as hvd_keras  # noqa: E402


def main(light):
  LIGHT = int(light)
  if LIGHT:
    hvd.init(
      light_2d_allreduce=1,
      light_intra_size=2,
      light_topk_allreduce=1,
      light_topk_ratio=1.0,
      light_topk_threshold=0,
    )
  else:
    hvd.init()
  rank, size = hvd.rank(), hvd.size()
  ROWS, STEPS, LR = 8, 4, 0.2
  rng = np.random.default_rng(7)
  ALL_IDS = rng.integers(0, 12, size=(ROWS * size, 2)).astype(np.int64)
  ALL_LABELS = rng.normal(size=(ROWS * size, 1)).astype(np.float32)
  MINE = slice(rank * ROWS, (rank + 1) * ROWS)

  def table_state(table):
    keys, values = (t.numpy() for t in table.export())
    order = np.argsort(keys)
    return keys[order], values[order]

  # Admission counts the same updates on every rank (each applies the reduced gradients of all).
  ADMISSION = tf_ext.FrequencyAdmission(2)

  def keras_model(name, optimizer, admission=None):
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    emb = tf_ext.keras.layers.DynamicEmbedding(
      4, combiner="mean", name=f"{name}_emb", admission=admission
    )(ids)
    out = tf.keras.layers.Dense(1, kernel_initializer="ones", name=f"{name}_dense")(emb)
    model = tf.keras.Model(ids, out)
    model.compile(optimizer, "mse")
    return model

  def keras_state(model, name):
    keys, values = table_state(model.get_layer(f"{name}_emb").table)
    return [keys, values] + model.get_layer(f"{name}_dense").get_weights()

  def run_keras(name, wrap, admission=None):
    model = keras_model(name, wrap(tf.keras.optimizers.SGD(LR)), admission)
    model.fit(ALL_IDS[MINE], ALL_LABELS[MINE], batch_size=ROWS, epochs=STEPS, verbose=0)
    return keras_state(model, name)

  def reference_keras(name, admission=None):
    model = keras_model(
      name, tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(LR)), admission
    )
    model.fit(ALL_IDS, ALL_LABELS, batch_size=len(ALL_IDS), epochs=STEPS, verbose=0)
    return keras_state(model, name)

  def run_tape(name, wrap_optimizer, distributed_tape, fusable=False):
    """`fusable`: SparseTensor ids (which the embedding fusion pass fuses; the rank-2 Tensor ids of
    the other runs it leaves alone) and a seeded initializer (so that runs under two table names
    start equal)."""
    init = tf.random_normal_initializer(0.0, 0.1, seed=1) if fusable else None
    table = tf_ext.get_dynamic_embedding_variable(f"{name}_table", 4, initializer=init)
    dense = tf.Variable(tf.ones([4, 1]), name=f"{name}_w")
    optimizer = wrap_optimizer(tf.keras.optimizers.SGD(LR))
    ids, labels = tf.constant(ALL_IDS[MINE]), tf.constant(ALL_LABELS[MINE])
    if fusable:
      ids = tf.sparse.from_dense(ids + 1)  # 0 would be an absent entry

    @tf.function
    def step():
      with tf.GradientTape() as tape:
        rows = tf_ext.embedding_lookup(table, ids, combiner="mean")
        loss = tf.reduce_mean(tf.square(tf.matmul(rows, dense) - labels))
      variables = [table.gradient_anchor, dense]
      if distributed_tape:
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
      else:
        optimizer.minimize(loss, variables, tape=tape)

    for _ in range(STEPS):
      step()
    return list(table_state(table)) + [dense.numpy()]

  def run_tf1(name, wrap, ids, labels):
    with tf.Graph().as_default():
      emb = tf_ext.dynamic_embedding(tf.constant(ids), 4, name=f"{name}_table", combiner="mean")
      w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
      loss = tf.reduce_mean(tf.square(tf.matmul(emb, w) - labels))
      step = tf.compat.v1.train.get_or_create_global_step()
      train = wrap(tf.compat.v1.train.GradientDescentOptimizer(LR)).minimize(loss, global_step=step)
      table = tf_ext.get_dynamic_embedding_variable(f"{name}_table", 4)
      export = table.export()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(STEPS):
          sess.run(train)
        keys, values = sess.run(export)
        order = np.argsort(keys)
        assert sess.run(step) == STEPS
        return [keys[order], values[order], sess.run(w)]

  def de(optimizer):
    return tf_ext.DynamicEmbeddingOptimizer(optimizer)

  def dist(optimizer):
    return hvd.DistributedOptimizer(optimizer)

  def dist_keras(optimizer):
    return hvd_keras.DistributedOptimizer(optimizer)

  results = {
    "tf1 Dist(DE(opt))": run_tf1("t1", lambda o: dist(de(o)), ALL_IDS[MINE], ALL_LABELS[MINE]),
    "tf1 DE(Dist(opt))": run_tf1("t2", lambda o: de(dist(o)), ALL_IDS[MINE], ALL_LABELS[MINE]),
    "tf1 DE(Dist(DE(opt)))": run_tf1(
      "t3", lambda o: de(dist(de(o))), ALL_IDS[MINE], ALL_LABELS[MINE]
    ),
    "keras Dist(DE(opt))": run_keras("k1", lambda o: dist_keras(de(o))),
    "keras DE(Dist(opt))": run_keras("k2", lambda o: de(dist_keras(o))),
    "keras DE(hvd.Dist(opt))": run_keras("k3", lambda o: de(dist(o))),
    "keras_admission DE(Dist(opt))": run_keras("k4", lambda o: de(dist_keras(o)), ADMISSION),
    "tape DistributedGradientTape + DE(opt)": run_tape("g1", de, distributed_tape=True),
    "tape Dist(DE(opt)).minimize": run_tape("g2", lambda o: dist_keras(de(o)), False),
    "tape DE(Dist(opt)).minimize": run_tape("g3", lambda o: de(dist_keras(o)), False),
  }
  # The embedding fusion pass: the updates of the allgathered gradients fuse too (from the rows as
  # TensorFlow gathered them), and training is bit-equal to the unfused runs.
  FUSABLE = {
    "tape DistributedGradientTape + DE(opt)": (de, True),
    "tape Dist(DE(opt)).minimize": (lambda o: dist_keras(de(o)), False),
  }
  unfused = {c: run_tape(f"u{i}", *how, fusable=True) for i, (c, how) in enumerate(FUSABLE.items())}
  tf_ext.graph_optimizations.enable(fuse_embeddings=True, cluster_dense_for_xla=False)
  before = tf_ext.graph_optimizations.stats()
  fused = {c: run_tape(f"f{i}", *how, fusable=True) for i, (c, how) in enumerate(FUSABLE.items())}
  after = tf_ext.graph_optimizations.stats()
  tf_ext.graph_optimizations.disable()
  expected = {
    "tf1": run_tf1("ref", de, ALL_IDS, ALL_LABELS),
    "keras": reference_keras("ref"),
    "keras_admission": reference_keras("ref_admission", ADMISSION),
  }
  expected["tape"] = expected["tf1"]  # the same model and steps, written with a tape

  failures = []
  for case, arrays in results.items():
    want = expected[case.split()[0]]
    for index, (got, ref) in enumerate(zip(arrays, want)):
      if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-5, atol=1e-6):
        failures.append(f"{case}: array {index} differs from one-process training:\n{got}\n{ref}")
    if ranks_differ(hvd, arrays):
      failures.append(f"{case}: ranks differ")
  for case, arrays in fused.items():
    for index, (got, ref) in enumerate(zip(arrays, unfused[case])):
      if not np.array_equal(got, ref):
        failures.append(f"fused {case}: array {index} differs from the unfused run:\n{got}\n{ref}")
  for stat in ("lookups_fused", "updates_fused"):
    if after[stat] - before[stat] < len(fused):
      failures.append(f"{stat}: {after[stat] - before[stat]} in {len(fused)} fused runs")
  finish(rank, len(results) + len(fused), failures)


if __name__ == "__main__":
  main(os.environ["LIGHT"])

"""Rank program: tf_ext.mixed_precision.LossAwareOptimizer composes with LightCC's
DistributedOptimizer / DistributedGradientTape and tf_ext.DynamicEmbeddingOptimizer in any order,
in TF1 (Session), Keras (fit) and GradientTape (tf.function) training.

Every rank trains on its own data, and only rank 1 sees a loss spike (step SPIKE_STEP). The policy
decides on the mean over ranks, so every rank must fall back at that step, skip it, and return to
half precision together; all ranks must end with identical weights, table rows and AMP state.

main(light): 0 for Horovod's wrappers (LIGHT_* off), 1 for LightCC's 2D (run as a script: $LIGHT).
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
import tf_ext.mixed_precision as amp  # noqa: E402


def main(light):
  if int(light):
    hvd.init(light_2d_allreduce=1, light_intra_size=1, light_topk_allreduce=0)
  else:
    hvd.init()
  rank = hvd.rank()
  ROWS, STEPS, SPIKE_STEP = 16, 12, 6
  CONFIG = amp.PolicyConfig(spike_warmup_steps=3, spike_sigmas=4.0, return_after_steps=2)
  rng = np.random.default_rng(11 + rank)
  IDS = rng.integers(0, 30, size=(STEPS, ROWS, 2)).astype(np.int64)
  DENSE = rng.normal(size=(STEPS, ROWS, 8)).astype(np.float32)
  LABELS = (DENSE[..., :1] > 0).astype(np.float32)
  if rank == 1:
    DENSE[SPIKE_STEP] *= 300.0  # finite in bf16, a loss far above the running mean

  def amp_wrap(optimizer):
    return amp.LossAwareOptimizer(optimizer, "bfloat16", config=CONFIG, probe_interval=4)

  def de(optimizer):
    return tf_ext.DynamicEmbeddingOptimizer(optimizer)

  def tower(rows, dense):
    x = tf.concat([rows, dense], axis=1)
    h = tf.keras.layers.Dense(16, "relu", kernel_initializer="glorot_uniform", name="h")(x)
    return tf.keras.layers.Dense(1, kernel_initializer="glorot_uniform", name="logit")(h)

  def amp_state(report):
    return np.array([float(report[k]) for k in ("half", "switches", "steps", "skipped_steps")])

  def run_tf1(wrap):
    tf.keras.utils.set_random_seed(5)  # the same initial weights on every rank
    with tf.Graph().as_default():
      ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
      dense = tf.compat.v1.placeholder(tf.float32, [None, 8])
      labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
      rows = tf_ext.dynamic_embedding(ids, 4, name="tf1_table", combiner="mean")
      logits = tower(rows, dense)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
      optimizer = wrap(tf.compat.v1.train.AdagradOptimizer(0.1))
      train = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
      report = amp.report(optimizer)
      table = tf_ext.get_dynamic_embedding_variable("tf1_table", 4)
      export = table.export()
      modes = []
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(hvd.broadcast_global_variables(0))
        for step in range(STEPS):
          sess.run(train, {ids: IDS[step], dense: DENSE[step], labels: LABELS[step]})
          modes.append(bool(sess.run(report)["half"]))
        keys, values = sess.run(export)
        weights = sess.run(tf.compat.v1.trainable_variables())
        state = amp_state(sess.run(report))
    order = np.argsort(keys)
    return modes, [keys[order], values[order], *weights, state]

  def run_keras(wrap):
    tf.keras.utils.set_random_seed(5)
    ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
    dense = tf.keras.Input(shape=(8,))
    rows = tf_ext.keras.layers.DynamicEmbedding(4, combiner="mean", name="keras_table")(ids)
    model = tf.keras.Model([ids, dense], tower(rows, dense))
    optimizer = wrap(tf.keras.optimizers.Adagrad(0.1))
    model.compile(optimizer, tf.keras.losses.BinaryCrossentropy(from_logits=True))
    modes = []
    record = tf.keras.callbacks.LambdaCallback(
      on_train_batch_end=lambda b, logs: modes.append(bool(amp.report(optimizer)["half"]))
    )
    model.fit(
      [IDS.reshape(-1, 2), DENSE.reshape(-1, 8)],
      LABELS.reshape(-1, 1),
      batch_size=ROWS,
      shuffle=False,
      verbose=0,
      callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0), record],
    )
    keys, values = (t.numpy() for t in model.get_layer("keras_table").table.export())
    order = np.argsort(keys)
    state = amp_state(amp.report(optimizer))
    return modes, [keys[order], values[order], *model.get_weights(), state]

  def run_tape():
    tf.keras.utils.set_random_seed(5)
    table = tf_ext.get_dynamic_embedding_variable("tape_table", 4)
    layers = [tf.keras.layers.Dense(16, "relu"), tf.keras.layers.Dense(1)]
    layers[0].build((None, 12))
    layers[1].build((None, 16))
    dense_vars = [v for layer in layers for v in layer.trainable_variables]
    optimizer = amp_wrap(de(tf.keras.optimizers.Adagrad(0.1)))
    for v in dense_vars:
      v.assign(hvd.broadcast(v, 0))

    @tf.function
    def step(ids, dense, labels):
      with tf.GradientTape() as tape:
        rows = tf_ext.embedding_lookup(table, ids, combiner="mean")
        logits = layers[1](layers[0](tf.concat([rows, dense], axis=1)))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
      variables = [table.gradient_anchor] + dense_vars
      tape = amp.LossAwareGradientTape(hvd.DistributedGradientTape(tape), optimizer)
      grads = tape.gradient(loss, variables)
      optimizer.apply_gradients(zip(grads, variables))

    modes = []
    for s in range(STEPS):
      step(IDS[s], DENSE[s], LABELS[s])
      modes.append(amp.report(optimizer)["half"])
    keys, values = (t.numpy() for t in table.export())
    order = np.argsort(keys)
    state = amp_state(amp.report(optimizer))
    return modes, [keys[order], values[order], *[v.numpy() for v in dense_vars], state]

  results = {
    "tf1 AMP(Dist(DE(opt)))": run_tf1(lambda o: amp_wrap(hvd.DistributedOptimizer(de(o)))),
    "tf1 DE(Dist(AMP(opt)))": run_tf1(lambda o: de(hvd.DistributedOptimizer(amp_wrap(o)))),
    "keras AMP(Dist(DE(opt)))": run_keras(
      lambda o: amp_wrap(hvd_keras.DistributedOptimizer(de(o)))
    ),
    "keras Dist(DE(AMP(opt)))": run_keras(
      lambda o: hvd_keras.DistributedOptimizer(de(amp_wrap(o)))
    ),
    "tape DistributedGradientTape + AMP(DE(opt))": run_tape(),
  }

  failures = []
  for case, (modes, arrays) in results.items():
    # The spike on rank 1 makes every rank fall back at that step, then return.
    if modes[SPIKE_STEP] or not all(modes[:SPIKE_STEP]) or not modes[-1]:
      failures.append(f"{case}: modes {modes}")
    if arrays[-1][3] != 1:
      failures.append(f"{case}: skipped steps {arrays[-1][3]}, expected 1 (the spike)")
    if ranks_differ(hvd, arrays):
      failures.append(f"{case}: ranks differ")
  finish(rank, len(results), failures, shown=6)


if __name__ == "__main__":
  main(os.environ["LIGHT"])

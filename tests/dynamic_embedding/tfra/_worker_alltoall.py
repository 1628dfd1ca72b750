"""Rank program of test_tfra_alltoall.py (horovodrun --gloo -np 2): a TFRA Keras model whose
HvdAllToAllEmbedding splits its table across the ranks trains, each rank on its part of every
global batch, as one process trains the same model with a plain de.keras.layers.Embedding on the
whole batch. Prints "rank R: N cases, F failures"."""

import os
import sys

sys.path.insert(0, os.environ["TF_EXT_ROOT"])

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402
import tf_ext.lightcc.keras as hvd_keras  # noqa: E402
import tf_ext.tfra as de  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
ROWS, STEPS, DIM, IDS = 6, 3, 4, 3
rng = np.random.default_rng(5)
GLOBAL_IDS = rng.integers(0, 20, size=(STEPS * ROWS * size, IDS)).astype(np.int64)
GLOBAL_LABELS = rng.normal(size=(STEPS * ROWS * size, 1)).astype(np.float32)
MINE = np.concatenate(
  [
    np.arange(s * ROWS * size + rank * ROWS, s * ROWS * size + (rank + 1) * ROWS)
    for s in range(STEPS)
  ]
)
failures, cases = [], 0


def check(label, ok, detail=""):
  global cases
  cases += 1
  if not ok:
    failures.append(f"rank {rank}: {label} {detail}")


def model_of(layer):
  ids = tf.keras.Input(shape=(IDS,), dtype=tf.int64)
  pooled = tf.reduce_sum(layer(ids), axis=1)
  out = tf.keras.layers.Dense(1, kernel_initializer="ones")(pooled)
  return tf.keras.Model(ids, out)


split_layer = de.keras.layers.HvdAllToAllEmbedding(
  embedding_size=DIM, initializer=tf.keras.initializers.Constant(0.1), name="split"
)
reference_layer = de.keras.layers.Embedding(
  DIM, initializer=tf.keras.initializers.Constant(0.1), name="reference"
)
split, reference = model_of(split_layer), model_of(reference_layer)
split.compile(
  hvd_keras.DistributedOptimizer(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))),
  "mse",
)
reference.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), "mse")
split.fit(GLOBAL_IDS[MINE], GLOBAL_LABELS[MINE], batch_size=ROWS, shuffle=False, verbose=0)
reference.fit(GLOBAL_IDS, GLOBAL_LABELS, batch_size=ROWS * size, shuffle=False, verbose=0)

table = split_layer.params.tables[0]
keys, values = (t.numpy() for t in split_layer.params.export())
ref_keys = reference_layer.params.export()[0].numpy()
owned = table.owner_of(ref_keys).numpy() == rank
check("each rank holds the ids it owns", sorted(keys.tolist()) == sorted(ref_keys[owned].tolist()))
expected = reference_layer.params.lookup(keys).numpy()
check(
  "its rows are one process's",
  np.allclose(values, expected, atol=1e-5),
  np.abs(values - expected).max() if len(keys) else "",
)
every = GLOBAL_IDS[:4]
check(
  "a lookup through the layer reads every rank's rows",
  np.allclose(split_layer(every).numpy(), reference_layer(every).numpy(), atol=1e-5),
)
check(
  "the dense weights are one process's",
  all(
    np.allclose(a, b, atol=1e-5)
    for a, b in zip(split.layers[-1].get_weights(), reference.layers[-1].get_weights())
  ),
)
check(
  "the layer's trainable weight is the table's anchor",
  split_layer.trainable_weights == [table.gradient_anchor],
)
try:
  de.keras.layers.HvdAllToAllEmbedding(mpi_size=size + 1, embedding_size=DIM, name="wrong")
  check("a wrong mpi_size is refused", False)
except ValueError as error:
  check("a wrong mpi_size is refused", "mpi_size" in str(error), error)

# DEHvdBroadcastGlobalVariablesCallback: the dense weights start from root's, the table's anchor
# (different rows on every rank) is left alone.
ids = tf.keras.Input(shape=(IDS,), dtype=tf.int64)
own = de.keras.layers.HvdAllToAllEmbedding(embedding_size=DIM, name="broadcast")
dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.Constant(float(rank)))
model = tf.keras.Model(ids, dense(tf.reduce_sum(own(ids), axis=1)))
model.compile(de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.0)), "mse")
model.fit(
  GLOBAL_IDS[MINE][:ROWS],
  GLOBAL_LABELS[MINE][:ROWS],
  batch_size=ROWS,
  verbose=0,
  callbacks=[de.keras.callbacks.DEHvdBroadcastGlobalVariablesCallback(root_rank=0)],
)
kernels = hvd.allgather(tf.reshape(dense.kernel, [1, -1])).numpy()
check("the callback gave every rank root's dense weights", np.all(kernels == 0.0), kernels)

# TFRA's initial rows: each owner calls the initializer for the distinct ids it received, and an
# update starts from the row a new id read (a custom eager loop: the owners keep what they read
# under the tape until the update).
drawn = de.keras.layers.HvdAllToAllEmbedding(
  embedding_size=DIM, initializer=tf.keras.initializers.RandomUniform(1.0, 2.0), name="drawn"
)
check("the drawn layer's rows are TFRA's", drawn.params.reads_default_rows)
mine = tf.constant(GLOBAL_IDS[MINE][:ROWS] + 100)
drawn_sgd = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
with tf.GradientTape() as tape:
  read = drawn(mine)
  loss = tf.reduce_sum(read)
drawn_sgd.apply_gradients(
  zip(tape.gradient(loss, drawn.trainable_weights), drawn.trainable_weights)
)
after = drawn(mine).numpy()
every_id = hvd.allgather(tf.reshape(mine, [-1])).numpy()
counts = np.array([[np.sum(every_id == i)] for i in mine.numpy().reshape(-1)], np.float32)
read = read.numpy().reshape(-1, DIM)
drawn_keys = drawn.params.export()[0].numpy()
check(
  "each rank holds the ids TFRA's partitioner gives it",
  len(drawn_keys) > 0 and np.all(drawn_keys % size == rank),
  drawn_keys,
)
check("new ids read the initializer's rows", np.all((read >= 1.0) & (read < 2.0)), read)
check(
  "an update starts from the row a new id read",
  np.allclose(after.reshape(-1, DIM), read - 0.5 * counts, atol=1e-5),
  np.abs(after.reshape(-1, DIM) - (read - 0.5 * counts)).max(),
)

# synchronous=True: the dense gradients are summed over the ranks (TFRA's rule), the table's stay.
weight = tf.Variable([[1.0]])
sync = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1), synchronous=True)
with tf.GradientTape() as tape:
  loss = tf.reduce_sum(weight * float(rank + 1))  # this rank's gradient: rank + 1
sync.apply_gradients([(tape.gradient(loss, weight), weight)])
summed = sum(r + 1 for r in range(size))
check(
  "synchronous=True sums the dense gradients",
  np.allclose(weight.numpy(), 1.0 - 0.1 * summed),
  weight.numpy(),
)

print(f"rank {rank}: {cases} cases, {len(failures)} failures")
for failure in failures:
  print(failure)
sys.exit(1 if failures else 0)

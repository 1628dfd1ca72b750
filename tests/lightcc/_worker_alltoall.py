"""Rank program: dynamic embedding tables split across ranks (distribution="alltoall").

Each rank trains on its part of every global batch; on every rank, the result must equal a plain
table and the same dense weights trained in this one process on the whole global batch (the
reference, computed here too), for SGD, Adagrad, Adam and FTRL:
  - each rank holds exactly the reference's rows of the ids it owns (values to float tolerance),
  - a lookup of every id, through the exchange, gives the reference's rows,
  - the dense weights equal the reference's.

MODE=tape (tape4: fewer cases, for 4 ranks): tf.function + tf_ext.lightcc.DistributedGradientTape
(Horovod's, LIGHT_* off), int64 and string keys, ragged ids with a combiner, and Horovod's own tape
(which allgathers the table gradients: slower, same result). MODE=keras: Keras fit with
tf_ext.lightcc.keras's DistributedOptimizer, and Horovod's own. MODE=lightcc: the tape with
LIGHT_FUSION on (LightCC's reduce stage). MODE=tf1: a TF1 Session with Horovod's v1
DistributedOptimizer, outside and inside the tables' wrapper, a Saver's checkpoint, and a
dynamic_embedding_column. MODE=checkpoint: each rank saves; split tables and a plain one restore.
MODE=reshard: those checkpoints restored on other ranks. MODE=mismatch: the ranks create the table
with different dims: a ValueError on every rank. MODE=policies: admission, eviction, different
optimizers per rank, LossAwareOptimizer. MODE=serving (serving_one: one rank): serving exports.
MODE=estimator: Estimators. MODE=delta: delta checkpoints (delta_reshard: restored by other ranks).
MODE=die: a rank dies mid-step (replaced: the restore after it).

main(mode, checkpoint_dir) runs one MODE (run as a script: $MODE, $CHECKPOINT_DIR); MODE=tf1
disables eager execution: in a shared run, the last case of its process.
"""

import os
import signal
import sys
import time

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import horovod.tensorflow as horovod  # noqa: E402
import horovod.tensorflow.keras as horovod_keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _rank_checks import finish  # noqa: E402

import tf_ext  # noqa: E402
import tf_ext.lightcc as hvd  # noqa: E402
import tf_ext.lightcc.keras as hvd_keras  # noqa: E402
import tf_ext.mixed_precision as amp  # noqa: E402
from tf_ext.dynamic_embedding.live_tables import tables as live_tables  # noqa: E402

ROWS, STEPS, DIM, IDS_PER_ROW = 6, 3, 4, 3
OPTIMIZERS = {
  "sgd": lambda: tf.keras.optimizers.SGD(0.5),
  "adagrad": lambda: tf.keras.optimizers.Adagrad(0.3),
  "adam": lambda: tf.keras.optimizers.Adam(0.05),
  "ftrl": lambda: tf.keras.optimizers.Ftrl(0.3, l1_regularization_strength=0.001),
}
# This run's: set by main() (the functions below read them).
MODE = rank = size = GLOBAL_IDS = GLOBAL_LABELS = MINE = PROBE = None
failures, cases = [], 0


def start(mode):
  """hvd.init for `mode`, and this run's ranks, data and checks."""
  global MODE, rank, size, GLOBAL_IDS, GLOBAL_LABELS, MINE, PROBE, failures, cases
  MODE = mode
  if MODE == "tf1":
    tf.compat.v1.disable_eager_execution()
  hvd.init(light_fusion=1 if MODE == "lightcc" else 0)
  rank, size = hvd.rank(), hvd.size()
  rng = np.random.default_rng(11)
  # [steps, global batch, ids]: few distinct ids, so ranks share ids and rows repeat in a batch.
  GLOBAL_IDS = rng.integers(0, 20, size=(STEPS, ROWS * size, IDS_PER_ROW)).astype(np.int64)
  GLOBAL_LABELS = rng.normal(size=(STEPS, ROWS * size, 1)).astype(np.float32)
  MINE = slice(rank * ROWS, (rank + 1) * ROWS)
  # Ids of the first global batch, the same for any number of ranks (the first rows of the
  # stream).
  PROBE = [GLOBAL_IDS[0][:ROWS], as_keys(GLOBAL_IDS[0][:ROWS], tf.string)]
  failures, cases = [], 0


def check(label, ok, detail=""):
  global cases
  cases += 1
  if not ok:
    failures.append(f"rank {rank}: {label} {detail}")


def as_keys(ids, key_dtype):
  if key_dtype == tf.int64:
    return ids
  # Bytes that are not text, an empty key and a shared prefix: keys travel whole.
  return np.vectorize(lambda i: b"" if i == 0 else b"k\x00\xff" + bytes([i]) * (i % 4))(ids)


def check_tables(label, table, reference, key_dtype, tolerance=1e-5):
  keys, values = (t.numpy() for t in table.export())
  ref_keys = reference.export()[0].numpy()
  owned = table.owner_of(ref_keys).numpy() == rank
  check(f"{label}: owned ids", sorted(keys.tolist()) == sorted(ref_keys[owned].tolist()))
  check(
    f"{label}: owned rows",
    np.allclose(values, reference.lookup(keys).numpy(), atol=tolerance),
    np.abs(values - reference.lookup(keys).numpy()).max() if len(keys) else "",
  )
  every_id = as_keys(GLOBAL_IDS[0], key_dtype)
  check(
    f"{label}: lookup through the exchange",
    np.allclose(table.lookup(every_id).numpy(), reference.lookup(every_id).numpy(), atol=tolerance),
  )
  fewer = every_id[: 2 * rank]  # rank 0 looks up no id
  check(
    f"{label}: a lookup in which a rank has no ids",
    np.allclose(table.lookup(fewer).numpy(), reference.lookup(fewer).numpy(), atol=tolerance),
  )
  whole = table.statistics(aggregate=True)
  check(f"{label}: aggregated size", whole["size"].numpy() == len(ref_keys), whole["size"])
  check(f"{label}: this rank's size", table.statistics()["size"].numpy() == len(keys))


def train_with_tape(
  label,
  optimizer_name,
  key_dtype=tf.int64,
  ragged=False,
  tape_of=None,
  table_options=None,
  amp_wrap=None,
  tolerance=1e-5,
):
  """Trains an all-to-all table and a reference; compares them; returns the two tables.
  table_options: more arguments of both tables (admission, eviction). amp_wrap: a wrapper of both
  optimizers (LossAwareOptimizer), whose tape wrapper then wraps both tapes."""
  tape_of = tape_of or hvd.DistributedGradientTape
  tables = {
    which: tf_ext.get_dynamic_embedding_variable(
      f"{label}_{which}",
      DIM,
      key_dtype=key_dtype,
      distribution="alltoall" if which == "split" else None,
      **(table_options or {}),
    )
    for which in ("split", "reference")
  }
  start = np.linspace(-0.5, 0.5, DIM, dtype=np.float32)[:, None]
  weights = {which: tf.Variable(start) for which in tables}
  optimizers = {
    which: tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS[optimizer_name]()) for which in tables
  }
  if amp_wrap:
    optimizers = {which: amp_wrap(optimizer) for which, optimizer in optimizers.items()}
    tape_of = (
      lambda wrap: lambda tape: amp.LossAwareGradientTape(wrap(tape), optimizers["split"])
    )(tape_of)

  def loss_of(which, ids, labels):
    if ragged:
      ids = tf.RaggedTensor.from_tensor(ids, lengths=tf.fill([tf.shape(ids)[0]], 2))
    embedded = tf_ext.embedding_lookup(tables[which], ids, combiner="mean")
    return tf.reduce_mean(tf.square(embedded @ weights[which] - labels))

  @tf.function
  def split_step(ids, labels):
    with tf.GradientTape() as tape:
      loss = loss_of("split", ids, labels)
    tape = tape_of(tape)
    variables = [tables["split"].gradient_anchor, weights["split"]]
    optimizers["split"].apply_gradients(zip(tape.gradient(loss, variables), variables))

  @tf.function
  def reference_step(ids, labels):
    with tf.GradientTape() as tape:
      loss = loss_of("reference", ids, labels)
    if amp_wrap:
      tape = amp.LossAwareGradientTape(tape, optimizers["reference"])
    variables = [tables["reference"].gradient_anchor, weights["reference"]]
    optimizers["reference"].apply_gradients(zip(tape.gradient(loss, variables), variables))

  for step in range(STEPS):
    ids = as_keys(GLOBAL_IDS[step], key_dtype)
    split_step(ids[MINE], GLOBAL_LABELS[step][MINE])
    reference_step(ids, GLOBAL_LABELS[step])
  graph = split_step.get_concrete_function(ids[MINE], GLOBAL_LABELS[0][MINE]).graph
  # (Horovod reduces in functions of its own, nested in the step's graph.)
  graph_def = graph.as_graph_def()
  op_types = [n.op for n in graph_def.node]
  op_types += [n.op for f in graph_def.library.function for n in f.node_def]
  allgathers = sum("Allgather" in op_type for op_type in op_types)
  # Horovod's own tape allgathers the table's gradients (each owner keeps its part: the result
  # is the same); tf_ext's wrappers leave them to the all-to-all.
  horovods_own = tape_of is horovod.DistributedGradientTape
  check(f"{label}: allgathers", (allgathers > 0) == horovods_own, allgathers)
  # The owners keep their part of an allgathered gradient (TfExtShardOf picks it); a gradient
  # straight from the lookup's all-to-all is all theirs, and the update skips that mask.
  masks = op_types.count("TfExtShardOf")
  check(f"{label}: owner masks", (masks > 0) == horovods_own, masks)
  check_tables(label, tables["split"], tables["reference"], key_dtype, tolerance)
  check(
    f"{label}: dense weights",
    np.allclose(weights["split"].numpy(), weights["reference"].numpy(), atol=tolerance),
  )
  if amp_wrap:
    reports = {which: amp.report(optimizer) for which, optimizer in optimizers.items()}
    check(f"{label}: trained in half precision", reports["split"]["steps"] == STEPS, reports)
    check(
      f"{label}: the same precision decisions as one process",
      all(reports["split"][k] == reports["reference"][k] for k in ("half", "switches")),
      reports,
    )
  return tables["split"], tables["reference"]


def restore_checkpoints(directory):
  """Each rank saves its part (a checkpoint of its own); split tables restore their rank's ids
  from their own rank's checkpoint, from rank 0's (whose manifest names every rank's part) and from
  one process's (the reference's); one process's table restores every part from rank 0's; and a
  .keras-style import keeps the rank's ids."""
  split, reference = train_with_tape("saved", "adam")
  tf.train.Checkpoint(table=split).write(f"{directory}/rank_{rank}/ckpt")
  if rank == 0:
    tf.train.Checkpoint(table=reference).write(f"{directory}/reference/ckpt")
  hvd.allreduce(tf.constant(0.0))  # (every checkpoint is written)
  check_restored(directory, "own rank's", f"{directory}/rank_{rank}/ckpt")
  imported = tf_ext.get_dynamic_embedding_variable("imported", DIM, distribution="alltoall")
  imported.import_with_slots(*reference.export_with_slots())
  ref_keys = reference.export()[0].numpy()
  owned = imported.owner_of(ref_keys).numpy() == rank
  check("imported: ids", sorted(imported.export()[0].numpy()) == sorted(ref_keys[owned]))


def check_restored(directory, label, *extra_prefixes):
  """Split tables restored from rank 0's checkpoint, the one process's and `extra_prefixes` hold
  this rank's ids of the reference with its rows; a plain table restored from rank 0's holds them
  all."""
  reference = tf_ext.get_dynamic_embedding_variable("reference_restored", DIM)
  tf.train.Checkpoint(table=reference).read(f"{directory}/reference/ckpt").assert_consumed()
  ref_keys = reference.export()[0].numpy()
  sources = [("rank 0's", f"{directory}/rank_0/ckpt")]
  sources += [("one process's", f"{directory}/reference/ckpt")]
  sources += [(label, prefix) for prefix in extra_prefixes]
  for index, (source, prefix) in enumerate(sources):
    restored = tf_ext.get_dynamic_embedding_variable(
      f"restored_{index}", DIM, distribution="alltoall"
    )
    tf.train.Checkpoint(table=restored).read(prefix).assert_consumed()
    owned = restored.owner_of(ref_keys).numpy() == rank
    keys, values = (t.numpy() for t in restored.export())
    check(f"restored from {source}: ids", sorted(keys) == sorted(ref_keys[owned]))
    check(
      f"restored from {source}: rows",
      np.allclose(values, reference.lookup(keys).numpy(), atol=1e-5),
    )
  whole = tf_ext.get_dynamic_embedding_variable("one_process", DIM)
  tf.train.Checkpoint(table=whole).read(f"{directory}/rank_0/ckpt").assert_consumed()
  keys, values = (t.numpy() for t in whole.export())
  check("one process restored every rank's part: ids", sorted(keys) == sorted(ref_keys))
  check(
    "one process restored every rank's part: rows",
    np.allclose(values, reference.lookup(keys).numpy(), atol=1e-5),
  )


def train_with_fit(label, optimizer_name, wrapper=hvd_keras.DistributedOptimizer):
  """Keras fit: every rank fits its part of each global batch; the reference fits them all.
  `wrapper`: LightCC's Keras DistributedOptimizer, or Horovod's own."""

  def model_of(distribution):
    ids = tf.keras.Input(shape=(IDS_PER_ROW,), dtype=tf.int64)
    embedded = tf_ext.keras.layers.DynamicEmbedding(
      DIM, combiner="sum", distribution=distribution, name=f"{label}_{distribution}"
    )(ids)
    out = tf.keras.layers.Dense(1, kernel_initializer="ones", name=f"{label}_dense")(embedded)
    return tf.keras.Model(ids, out)

  split, reference = model_of("alltoall"), model_of(None)
  optimizer = tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS[optimizer_name]())
  split.compile(wrapper(optimizer), "mse")
  reference.compile(tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS[optimizer_name]()), "mse")
  split.fit(
    np.concatenate([GLOBAL_IDS[s][MINE] for s in range(STEPS)]),
    np.concatenate([GLOBAL_LABELS[s][MINE] for s in range(STEPS)]),
    batch_size=ROWS,
    shuffle=False,
    verbose=0,
  )
  reference.fit(
    np.concatenate(list(GLOBAL_IDS)),
    np.concatenate(list(GLOBAL_LABELS)),
    batch_size=ROWS * size,
    shuffle=False,
    verbose=0,
  )
  check_tables(label, split.layers[1].table, reference.layers[1].table, tf.int64)
  anchor = split.layers[1].table.gradient_anchor
  check(f"{label}: the anchor is local to Horovod", anchor.ref() in split.optimizer._local_vars)
  check(
    f"{label}: dense weights",
    all(
      np.allclose(a, b, atol=1e-5)
      for a, b in zip(split.layers[2].get_weights(), reference.layers[2].get_weights())
    ),
  )


def train_in_a_session(label, make_optimizer, distributed_outside, column=False, saved_in=None):
  """TF1 graph mode: Saver-era optimizers, hvd.DistributedOptimizer outside or inside the
  tables' wrapper; rows and weights compared after training, in the session. column=True: the
  table is a dynamic_embedding_column's, looked up by input_layer. saved_in: a directory where
  every rank saves with a Saver, then restores rank 0's checkpoint (which names every part)."""
  ids = tf.compat.v1.placeholder(tf.int64, [None, IDS_PER_ROW])
  labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
  train_ops, tables, weights = {}, {}, {}
  for which in ("split", "reference"):
    distribution = "alltoall" if which == "split" else None
    weights[which] = tf.compat.v1.get_variable(
      f"{label}_{which}_w", initializer=np.linspace(-0.5, 0.5, DIM, dtype=np.float32)[:, None]
    )
    if column:
      embedding_column = tf_ext.feature_column.dynamic_embedding_column(
        tf.feature_column.categorical_column_with_identity("id", 20),
        DIM,
        combiner="sqrtn",
        distribution=distribution,
      )
      with tf.compat.v1.variable_scope(f"{label}_{which}"):
        embedded = tf.compat.v1.feature_column.input_layer({"id": ids}, [embedding_column])
      (tables[which],) = [t for t in live_tables() if t.name.startswith(f"{label}_{which}/")]
    else:
      tables[which] = tf_ext.get_dynamic_embedding_variable(
        f"{label}_{which}", DIM, distribution=distribution
      )
      embedded = tf_ext.embedding_lookup(tables[which], ids, combiner="sqrtn")
    loss = tf.reduce_mean(tf.square(embedded @ weights[which] - labels))
    optimizer = make_optimizer()
    if which == "split":
      if distributed_outside:
        optimizer = hvd.DistributedOptimizer(tf_ext.DynamicEmbeddingOptimizer(optimizer))
      else:
        optimizer = tf_ext.DynamicEmbeddingOptimizer(hvd.DistributedOptimizer(optimizer))
    else:
      optimizer = tf_ext.DynamicEmbeddingOptimizer(optimizer)
    train_ops[which] = optimizer.minimize(loss)
  probe = tf.constant(GLOBAL_IDS[0])
  found = {which: tables[which].lookup(probe) for which in tables}
  exported = tables["split"].export()
  saver = tf.compat.v1.train.Saver() if saved_in else None
  cleared = tables["split"].clear()
  barrier = hvd.allreduce(tf.constant(0.0), name=f"{label}_saved")
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.global_variables_initializer())
    for step in range(STEPS):
      session.run(
        train_ops["split"], {ids: GLOBAL_IDS[step][MINE], labels: GLOBAL_LABELS[step][MINE]}
      )
      session.run(train_ops["reference"], {ids: GLOBAL_IDS[step], labels: GLOBAL_LABELS[step]})
    keys, values = session.run(exported)
    mine = session.run(tables["reference"].lookup(keys))
    check(f"{label}: owned rows", len(keys) > 0 and np.allclose(values, mine, atol=1e-5))
    split_rows, reference_rows = session.run([found["split"], found["reference"]])
    check(
      f"{label}: lookup through the exchange", np.allclose(split_rows, reference_rows, atol=1e-5)
    )
    w_split, w_reference = session.run([weights["split"], weights["reference"]])
    check(f"{label}: dense weights", np.allclose(w_split, w_reference, atol=1e-5))
    if saver:
      saver.save(session, f"{saved_in}/rank_{rank}/model")
      session.run(barrier)  # (every rank has saved)
      session.run(cleared)
      saver.restore(session, f"{saved_in}/rank_0/model")
      restored_keys, restored_values = session.run(exported)
      order, restored_order = np.argsort(keys), np.argsort(restored_keys)
      check(
        f"{label}: restored by a Saver",
        np.array_equal(keys[order], restored_keys[restored_order])
        and np.allclose(values[order], restored_values[restored_order]),
      )


def train_with_policies(label):
  """Admission and eviction on the owners: each rank's part has the reference's admitted ids,
  update counts and last steps; the aggregated statistics are the reference's; evicting by TTL
  removes the same ids."""
  options = {
    "admission": tf_ext.FrequencyAdmission(2, exact=True),
    "eviction": tf_ext.EvictionPolicy(ttl_steps=1),
  }
  split, reference = train_with_tape(label, "adagrad", table_options=options)
  keys, _, _, counts, last_steps, _ = (t.numpy() for t in split.export_with_slots())
  ref_keys, _, _, ref_counts, ref_last_steps, _ = (t.numpy() for t in reference.export_with_slots())
  owned = split.owner_of(ref_keys).numpy() == rank
  ref_facts = {
    k: (c, s) for k, c, s in zip(ref_keys[owned], ref_counts[owned], ref_last_steps[owned])
  }
  check(
    f"{label}: update counts and last steps",
    ref_facts == {k: (c, s) for k, c, s in zip(keys, counts, last_steps)},
    (ref_facts, keys, counts, last_steps),
  )
  whole, ref_stats = split.statistics(aggregate=True), reference.statistics()
  for name in ("admitted", "rejected"):
    check(f"{label}: {name}", whole[name].numpy() == ref_stats[name].numpy(), (whole, ref_stats))
  check(f"{label}: some ids wait for admission", ref_stats["rejected"].numpy() > 0)
  evicted, ref_evicted = split.evict(), reference.evict()
  check(
    f"{label}: evicted",
    hvd.allreduce(evicted, op=hvd.Sum).numpy() == ref_evicted.numpy() > 0,
    (evicted, ref_evicted),
  )
  check_tables(f"{label} after evicting", split, reference, tf.int64)


def check_mismatched_optimizers():
  """Ranks that train one split table with different optimizers: an error naming the ranks."""
  table = tf_ext.get_dynamic_embedding_variable("mixed_optimizers", DIM, distribution="alltoall")
  optimizer = tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS["adam" if rank else "sgd"]())
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(table.lookup(GLOBAL_IDS[0][MINE]))
  try:
    optimizer.apply_gradients([(tape.gradient(loss, table.gradient_anchor), table.gradient_anchor)])
    check("mismatched optimizers", False, "no error")
  except ValueError as error:
    print(f"rank {rank}: {error}", flush=True)
    check(
      "mismatched optimizers",
      "'mixed_optimizers'" in str(error)
      and "ranks [0]" in str(error)
      and "ranks [1]" in str(error),
      error,
    )


def check_refused_horovod_settings():
  """Horovod's wrappers with settings that cannot train the split table: a ValueError naming the
  setting, not a silently wrong update."""
  table = tf_ext.get_dynamic_embedding_variable("refused", DIM, distribution="alltoall")
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(table.lookup(GLOBAL_IDS[0][MINE]))
  tape = hvd.DistributedGradientTape(tape, scale_local_gradients=False)
  try:
    tape.gradient(loss, [table.gradient_anchor])
    check("scale_local_gradients=False", False, "no error")
  except ValueError as error:
    check("scale_local_gradients=False", "scale_local_gradients=False" in str(error), error)
  ids = tf.keras.Input(shape=(IDS_PER_ROW,), dtype=tf.int64)
  layer = tf_ext.keras.layers.DynamicEmbedding(DIM, combiner="sum", distribution="alltoall")
  model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(layer(ids)))
  optimizer = tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS["sgd"]())
  model.compile(hvd_keras.DistributedOptimizer(optimizer, backward_passes_per_step=2), "mse")
  try:
    model.fit(GLOBAL_IDS[0][MINE], GLOBAL_LABELS[0][MINE], verbose=0)
    check("backward_passes_per_step=2", False, "no error")
  except ValueError as error:
    # (Horovod's own error: it aggregates no IndexedSlices, those of any table.)
    message = "IndexedSlices are not supported when `backward_passes_per_step` > 1"
    check("backward_passes_per_step=2", message in str(error), error)


def serving_model():
  """A Keras model of a split int64 table and a split string table."""
  ids = tf.keras.Input(shape=(IDS_PER_ROW,), dtype=tf.int64, name="ids")
  words = tf.keras.Input(shape=(IDS_PER_ROW,), dtype=tf.string, name="words")
  by_id = tf_ext.keras.layers.DynamicEmbedding(
    DIM, combiner="sum", distribution="alltoall", name="served_ids"
  )(ids)
  by_word = tf_ext.keras.layers.DynamicEmbedding(
    DIM, key_dtype=tf.string, combiner="mean", distribution="alltoall", name="served_words"
  )(words)
  out = tf.keras.layers.Dense(1, kernel_initializer="ones")(tf.concat([by_id, by_word], 1))
  return tf.keras.Model([ids, words], out)


def export_split_model(directory):
  """Every rank exports the trained model (a collective; rank 0 writes); the SavedModel, loaded
  without tf_ext's tables, serves what the split model computes, and holds every rank's rows.
  Each rank also saves a checkpoint, for one process to export the same (MODE=serving_one)."""
  model = serving_model()
  model.compile(
    hvd_keras.DistributedOptimizer(tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS["adam"]())), "mse"
  )
  inputs = [np.concatenate([GLOBAL_IDS[s][MINE] for s in range(STEPS)])]
  inputs.append(as_keys(inputs[0], tf.string))
  model.fit(
    inputs,
    np.concatenate([GLOBAL_LABELS[s][MINE] for s in range(STEPS)]),
    batch_size=ROWS,
    shuffle=False,
    verbose=0,
  )
  expected = model.predict(PROBE, verbose=0)
  tf.train.Checkpoint(model=model).write(f"{directory}/rank_{rank}/ckpt")
  rows = tf_ext.saved_model.export_for_serving(model, f"{directory}/export")
  sizes = {
    layer: model.get_layer(layer).table.statistics(aggregate=True)["size"].numpy()
    for layer in ("served_ids", "served_words")
  }
  check(
    "served rows: every rank's", rows == {f"{name}": n for name, n in sizes.items()}, (rows, sizes)
  )
  if rank == 0:
    np.save(f"{directory}/expected.npy", expected)
  check_served(f"{directory}/export", expected, "exported by every rank")
  try:  # each rank its own folder: as on nodes without a shared filesystem
    tf_ext.saved_model.export_for_serving(model, f"{directory}/unshared_{rank}")
    check("an export folder rank 0 cannot read", False, "no error")
  except RuntimeError as error:
    check("an export folder rank 0 cannot read", "shared filesystem" in str(error), error)


def check_served(export_dir, expected, label):
  serve = tf.saved_model.load(export_dir).signatures["serving_default"]
  (served,) = serve(ids=tf.constant(PROBE[0]), words=tf.constant(PROBE[1])).values()
  check(
    f"{label}: serves the split model's outputs",
    np.allclose(served, expected, atol=1e-5),
    (served, expected),
  )


def export_from_checkpoint(directory):
  """One process (one rank) restores rank 0's checkpoint (every rank's part) and exports."""
  model = serving_model()
  tf.train.Checkpoint(model=model).read(f"{directory}/rank_0/ckpt").expect_partial()
  tf_ext.saved_model.export_for_serving(model, f"{directory}/export_one")
  check_served(f"{directory}/export_one", np.load(f"{directory}/expected.npy"), "one process")


def train_estimators(directory):
  """An Estimator (MonitoredTrainingSession inside) with a split table: every rank trains its
  part of each global batch and saves its own checkpoint; its predictions, restored from that
  checkpoint and looked up through the exchange, equal one process's Estimator on the whole
  batches."""

  def model_fn(features, labels, mode, params):
    embedded = tf_ext.dynamic_embedding(
      features, DIM, "estimator_table", combiner="mean", distribution=params["distribution"]
    )
    start = np.linspace(-0.5, 0.5, DIM, dtype=np.float32)[:, None]
    logits = embedded @ tf.compat.v1.get_variable("w", initializer=start)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions=logits)
    loss = tf.reduce_mean(tf.square(logits - labels))
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3))
    if params["distribution"]:
      optimizer = hvd.DistributedOptimizer(optimizer)
    step = tf.compat.v1.train.get_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, step))

  def input_fn(rows):
    ids = np.concatenate([GLOBAL_IDS[s][rows] for s in range(STEPS)])
    labels = np.concatenate([GLOBAL_LABELS[s][rows] for s in range(STEPS)])
    batch = len(ids) // STEPS
    return lambda: tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch)

  predictions = {}
  for which, distribution, rows in (
    ("split", "alltoall", MINE),
    ("reference", None, slice(None)),
  ):
    estimator = tf.estimator.Estimator(
      model_fn, f"{directory}/{which}_rank_{rank}", params={"distribution": distribution}
    )
    estimator.train(input_fn(rows))
    probe = lambda: tf.data.Dataset.from_tensor_slices(GLOBAL_IDS[0]).batch(ROWS)  # noqa: E731
    predictions[which] = np.concatenate(list(estimator.predict(probe)))
  check(
    "estimator: predictions equal one process's",
    np.allclose(predictions["split"], predictions["reference"], atol=1e-5),
    (predictions["split"], predictions["reference"]),
  )


def train_step_of(table, optimizer):
  """An eager training step of `table` alone, on the ids given."""

  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(table.lookup(ids)))
    tape = hvd.DistributedGradientTape(tape)
    anchors = [table.gradient_anchor]
    optimizer.apply_gradients(zip(tape.gradient(loss, anchors), anchors))

  return step


def delta_checkpoints(directory):
  """Every rank gives the same directory; each saves its part (a full link, then deltas) in a
  folder of its own there, restores it exactly, and keeps a copy for MODE=delta_reshard."""
  table = tf_ext.get_dynamic_embedding_variable("delta_table", DIM, distribution="alltoall")
  step = train_step_of(table, tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS["adam"]()))
  manager = tf_ext.DeltaCheckpointManager(f"{directory}/split", [table])
  kinds = []
  for s in range(STEPS):
    step(GLOBAL_IDS[s][MINE])
    if s == 1:
      table.remove(GLOBAL_IDS[0][:1, :1])  # (a delta with a removed id)
    kinds.append(manager.save(s)["kind"])
  check("delta: a full link, then deltas", kinds == ["full"] + ["delta"] * (STEPS - 1), kinds)
  check("delta: a folder per rank", manager.directory.endswith(f"rank-{rank}-of-{size}"))
  saved = [t.numpy() for t in table.export_with_slots()][:5]
  np.savez(f"{directory}/part_{rank}.npz", *saved)
  table.clear()
  check("delta: restored step", manager.restore() == STEPS - 1)
  check_rows("delta: restored part", table, saved)


def check_rows(label, table, expected):
  """`table` holds exactly the rows, slots, update counts and last steps of `expected` (the first
  five arrays of export_with_slots)."""
  got = [t.numpy() for t in table.export_with_slots()][:5]
  order, got_order = np.argsort(expected[0]), np.argsort(got[0])
  same = all(
    a.shape[0] == b.shape[0] and np.array_equal(a[order], b[got_order])
    for a, b in zip(expected, got)
  )
  check(label, same, (len(expected[0]), len(got[0])))


def delta_checkpoints_resharded(directory):
  """The 2 ranks' delta checkpoint restores into this number of ranks (each keeps the ids it
  owns of every part) and, on one rank, into a plain table, which then saves a one-process delta
  checkpoint that restores into this number of ranks too."""
  parts = [np.load(f"{directory}/part_{r}.npz") for r in range(2)]
  whole = [np.concatenate([p[f"arr_{i}"] for p in parts]) for i in range(5)]
  table = tf_ext.get_dynamic_embedding_variable("delta_table", DIM, distribution="alltoall")
  restored_step = tf_ext.DeltaCheckpointManager(f"{directory}/split", [table]).restore()
  check(f"delta 2 -> {size}: step", restored_step == STEPS - 1, restored_step)
  owned = table.owner_of(whole[0]).numpy() == rank
  check_rows(f"delta 2 -> {size}: this rank's ids", table, [a[owned] for a in whole])
  if size == 1:
    plain = tf_ext.DynamicEmbeddingVariable("delta_table", DIM)  # (another table, same name)
    tf_ext.DeltaCheckpointManager(f"{directory}/split", [plain]).restore()
    check_rows("delta 2 -> a plain table", plain, whole)
    tf_ext.DeltaCheckpointManager(f"{directory}/plain", [plain]).save(STEPS - 1)
  else:
    table.clear()
    tf_ext.DeltaCheckpointManager(f"{directory}/plain", [table]).restore()
    check_rows(f"delta 1 -> {size}: this rank's ids", table, [a[owned] for a in whole])


def die_mid_step(directory):
  """Both ranks train a step and save; rank 0 keeps the whole table for MODE=replaced; then rank
  1 dies inside the next step, while rank 0 waits in the step's all-to-all."""
  table = tf_ext.get_dynamic_embedding_variable("dies", DIM, distribution="alltoall")
  step = train_step_of(table, tf_ext.DynamicEmbeddingOptimizer(OPTIMIZERS["adam"]()))
  step(GLOBAL_IDS[0][MINE])
  tf.train.Checkpoint(table=table).write(f"{directory}/rank_{rank}/ckpt")
  keys, values = (t.numpy() for t in table.export_whole())
  if rank == 0:
    np.savez(f"{directory}/whole.npz", keys=keys, values=values)
  hvd.allreduce(tf.constant(0.0), name="saved")
  print(f"rank {rank}: saved", flush=True)
  if rank == 1:
    os._exit(3)  # (inside the step: rank 0 is about to send it ids)
  # The launcher terminates the other ranks when one dies: ignored here, to see what the
  # survivor's step itself does.
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  start = time.monotonic()
  try:
    step(GLOBAL_IDS[1][MINE])
    print(f"rank {rank}: the step after the death finished", flush=True)
  except Exception as error:  # noqa: BLE001
    print(
      f"rank {rank}: the step failed after {time.monotonic() - start:.1f} s: "
      f"{type(error).__name__}: {error}",
      flush=True,
    )
    os._exit(4)


def restore_after_the_death(directory):
  """The survivor and a replacement restore rank 0's checkpoint: the whole table as saved."""
  table = tf_ext.get_dynamic_embedding_variable("dies", DIM, distribution="alltoall")
  tf.train.Checkpoint(table=table).read(f"{directory}/rank_0/ckpt").assert_consumed()
  saved = np.load(f"{directory}/whole.npz")
  keys, values = (t.numpy() for t in table.export_whole())
  order, saved_order = np.argsort(keys), np.argsort(saved["keys"])
  check("restored after a rank died: ids", np.array_equal(keys[order], saved["keys"][saved_order]))
  check(
    "restored after a rank died: rows", np.array_equal(values[order], saved["values"][saved_order])
  )


MODES_WITH_A_DIRECTORY = {
  "estimator": train_estimators,
  "delta": delta_checkpoints,
  "delta_reshard": delta_checkpoints_resharded,
  "die": die_mid_step,
  "replaced": restore_after_the_death,
  "serving": export_split_model,
  "serving_one": export_from_checkpoint,
}


def main(mode, checkpoint_dir=None):
  start(mode)
  if MODE == "tf1":
    train_in_a_session(
      "tf1_adagrad",
      lambda: tf.compat.v1.train.AdagradOptimizer(0.3),
      True,
      saved_in=checkpoint_dir,
    )
    train_in_a_session("tf1_adam", lambda: tf.compat.v1.train.AdamOptimizer(0.05), False)
    train_in_a_session("tf1_ftrl", lambda: tf.compat.v1.train.FtrlOptimizer(0.3), True)
    train_in_a_session(
      "tf1_column", lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5), False, column=True
    )
  elif MODE == "tape":
    for name in OPTIMIZERS:
      train_with_tape(f"tape_{name}", name)
    train_with_tape("strings", "adam", key_dtype=tf.string)
    train_with_tape("ragged", "adagrad", ragged=True)
    train_with_tape("horovod_tape", "ftrl", tape_of=horovod.DistributedGradientTape)
  elif MODE == "tape4":  # four ranks: fewer cases
    train_with_tape("tape4_adam", "adam")
    train_with_tape("tape4_strings", "ftrl", key_dtype=tf.string)
  elif MODE == "lightcc":
    train_with_tape("lightcc_adam", "adam")
  elif MODE == "keras":
    for name in OPTIMIZERS:
      train_with_fit(f"fit_{name}", name)
    train_with_fit("fit_horovods_own", "adam", wrapper=horovod_keras.DistributedOptimizer)
  elif MODE == "checkpoint":
    restore_checkpoints(checkpoint_dir)
  elif MODE == "policies":
    train_with_policies("policies")
    check_mismatched_optimizers()
    check_refused_horovod_settings()
    train_with_tape(
      "amp_adam",
      "adam",
      amp_wrap=lambda o: amp.LossAwareOptimizer(o, "bfloat16", probe_interval=0),
      tolerance=2e-2,
    )
  elif MODE in MODES_WITH_A_DIRECTORY:
    MODES_WITH_A_DIRECTORY[MODE](checkpoint_dir)
  elif MODE == "reshard":  # restores the checkpoints that MODE=checkpoint wrote with other ranks
    check_restored(checkpoint_dir, "")
  elif MODE == "mismatch":
    try:
      tf_ext.get_dynamic_embedding_variable("mismatched", 4 + 4 * rank, distribution="alltoall")
      check("mismatched dims", False, "no error")
    except ValueError as error:
      print(f"rank {rank}: {error}", flush=True)
      check("mismatched dims", "ranks [1]" in str(error) and "'mismatched'" in str(error))
  finish(rank, cases, failures)


if __name__ == "__main__":
  main(os.environ["MODE"], os.environ.get("CHECKPOINT_DIR"))

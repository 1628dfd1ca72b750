"""Writes fixtures/: TFRA checkpoints made by TFRA itself (imports tensorflow_recommenders_addons).

  /work/tfra-venv/bin/python tests/dynamic_embedding/tfra/make_tfra_fixtures.py [OUT_DIR]

Each fixture is a small model trained for a few steps by TFRA 0.7.2 and saved the way a TFRA user
saves one, with, beside it, `expected.npz`: what TFRA itself exports of every Variable and of each
of its optimizer slots (`var.export()`, the slots' Variables' `export()`), and the rows and slots
of a batch after one more TFRA step on it (`next/...`), which a restored tf_ext program must
reproduce. Arrays are stored as TFRA returned them (its order); `manifest.json` says what each
fixture holds, and the versions, date and command that made it. Nothing in fixtures/ needs TFRA to
be read.

The expected.npz keys, for each Variable V (by its name) of a fixture:
  V/keys, V/values                   TFRA's export of V
  V/slot/S/keys, V/slot/S/values     the export of V's slot S (m, v, accumulator, momentum)
  V/next/ids                         the batch of one more step (ids already in V)
  V/next/values, V/next/slot/S       V's rows and slot S of those ids after that step
  V/step                             the optimizer's step count at the save
"""

import datetime
import json
import os
import shutil
import sys
import types

import numpy as np
import tensorflow as tf

# TFRA 0.7.2's de.keras.models.save_model calls horovod's rank() even without Horovod (hvd is None
# there); a one-rank stand-in lets it save as a one-process program does.
_hvd = types.ModuleType("horovod.tensorflow")
_hvd.rank = lambda: 0
_hvd.size = lambda: 1
_hvd.join = lambda: None
_hvd.broadcast_object = lambda obj, root_rank=0, name=None: obj
sys.modules["horovod"] = types.ModuleType("horovod")
sys.modules["horovod.tensorflow"] = _hvd

import tensorflow_recommenders_addons as tfra  # noqa: E402
from tensorflow_recommenders_addons import dynamic_embedding as de  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DIM = 4
STEPS = 3
LEARNING_RATE = 0.05
RNG = np.random.default_rng(20240623)


def _int_keys(n):
  return np.unique(RNG.integers(-(2**40), 2**40, size=n * 2, dtype=np.int64))[:n]


def _batches(keys, steps, size):
  """Batches of distinct ids, each a different subset, so rows have different update counts."""
  return [RNG.choice(keys, size=size, replace=False) for _ in range(steps)]


def _weights(n):
  return RNG.normal(size=(n, DIM)).astype(np.float32)


def _record(expected, name, keys, values):
  expected[f"{name}/keys"] = np.asarray(keys)
  expected[f"{name}/values"] = np.asarray(values)


def _plain(value):
  """An array numpy loads without pickle: string keys (objects of bytes) as fixed-width bytes."""
  value = np.asarray(value)
  return value.astype(bytes) if value.dtype == object else value


def _save_npz(path, expected):
  np.savez_compressed(path, **{k: _plain(v) for k, v in expected.items()})


def _loss(rows, weights):
  # d loss / d row = weights + row: each row's gradient depends on the row only.
  return tf.reduce_sum(rows * weights) + 0.5 * tf.reduce_sum(rows * rows)


# ---- (a) a TF1 graph saved by tf.compat.v1.train.Saver: Adam, Adagrad, momentum --------------


def make_tf1_saver(out):
  """Three Variables, each trained by its own TF1 optimizer; the momentum one in two shards."""
  os.makedirs(out)
  keys = _int_keys(120)
  specs = [
    ("tf1/emb_adam", lambda: tf.compat.v1.train.AdamOptimizer(LEARNING_RATE), ["m", "v"], 1),
    (
      "tf1/emb_adagrad",
      lambda: tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE, initial_accumulator_value=0.1),
      ["accumulator"],
      1,
    ),
    (
      "tf1/emb_momentum",
      lambda: tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, momentum=0.9),
      ["momentum"],
      2,
    ),
  ]
  batches = _batches(keys, STEPS, 72)
  weights = _weights(72)
  next_weights = _weights(24)
  expected, facts = {}, {}
  graph = tf.Graph()
  with graph.as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    batch_weights = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    built = []
    for name, make_optimizer, slot_names, shards in specs:
      var = de.get_variable(
        name,
        dim=DIM,
        devices=["/CPU:0"] * shards,
        initializer=tf.keras.initializers.RandomNormal(seed=7),
      )
      rows, wrapper = de.embedding_lookup(
        var, ids, return_trainable=True, name=name.split("/")[-1] + "_lookup"
      )
      optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())
      train = optimizer.minimize(_loss(rows, batch_weights), var_list=[wrapper])
      slots = {s: optimizer.get_slot(wrapper, s).params for s in slot_names}
      built.append((name, var, train, slots, optimizer))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for batch in batches:
        session.run([b[2] for b in built], {ids: batch, batch_weights: weights})
      prefix = saver.save(session, os.path.join(out, "model"), write_meta_graph=False)
      for name, var, _train, slots, _ in built:
        _record(expected, name, *session.run(var.export()))
        for slot, slot_var in slots.items():
          _record(expected, f"{name}/slot/{slot}", *session.run(slot_var.export()))
        expected[f"{name}/step"] = np.int64(STEPS)
      # One more step on ids every table holds (a missing id would read a random initial row);
      # its results are what a restored program must continue to.
      held = set(expected[f"{specs[0][0]}/keys"].tolist())
      for name, *_ in specs[1:]:
        held &= set(expected[f"{name}/keys"].tolist())
      next_ids = RNG.choice(np.array(sorted(held), np.int64), size=24, replace=False)
      session.run([b[2] for b in built], {ids: next_ids, batch_weights: next_weights})
      for name, var, _train, slots, _ in built:
        expected[f"{name}/next/ids"] = next_ids
        expected[f"{name}/next/weights"] = next_weights
        expected[f"{name}/next/values"] = session.run(var.lookup(next_ids))
        for slot, slot_var in slots.items():
          expected[f"{name}/next/slot/{slot}"] = session.run(slot_var.lookup(next_ids))
  # Saver records the absolute path; the fixture must be found wherever the checkout is.
  with open(os.path.join(out, "checkpoint"), "w") as f:
    f.write('model_checkpoint_path: "model"\nall_model_checkpoint_paths: "model"\n')
  reader = tf.train.load_checkpoint(prefix)
  facts["beta1_power"] = float(reader.get_tensor("beta1_power"))
  facts["beta2_power"] = float(reader.get_tensor("beta2_power"))
  _save_npz(os.path.join(out, "expected.npz"), expected)
  return {
    "format": "tf.compat.v1.train.Saver (TF1 graph), write_meta_graph=False",
    "checkpoint": os.path.basename(prefix),
    "variables": {
      name: {"dim": DIM, "shards": shards, "optimizer": type(opt).__name__, "slots": slot_names}
      for (name, _, slot_names, shards), (_, _, _, _, opt) in zip(specs, built)
    },
    "hyperparameters": {
      "learning_rate": LEARNING_RATE,
      "adam": "beta1=0.9 beta2=0.999 epsilon=1e-8",
      "adagrad": "initial_accumulator_value=0.1",
      "momentum": "momentum=0.9 use_nesterov=False",
    },
    "steps": STEPS,
    **facts,
  }


# ---- (b) eager: tf.train.Checkpoint (string keys), Keras save_weights --------------------------


def _eager_step(var, shadow, optimizer, ids, weights):
  with tf.GradientTape() as tape:
    rows = de.shadow_ops.embedding_lookup(shadow, ids)
    loss = _loss(rows, weights)
  gradients = tape.gradient(loss, [shadow])
  optimizer.apply_gradients(zip(gradients, [shadow]))


def _record_eager(expected, name, var, optimizer):
  _record(expected, name, *(t.numpy() for t in var.export()))
  for slot_var in var.get_slot_variables(optimizer):
    slot = slot_var.name.split("/")[-1]
    _record(expected, f"{name}/slot/{slot}", *(t.numpy() for t in slot_var.export()))


def _record_next(expected, name, var, optimizer, next_ids, next_weights):
  expected[f"{name}/next/ids"] = next_ids
  expected[f"{name}/next/weights"] = next_weights
  expected[f"{name}/next/values"] = var.lookup(tf.constant(next_ids)).numpy()
  for slot_var in var.get_slot_variables(optimizer):
    slot = slot_var.name.split("/")[-1]
    expected[f"{name}/next/slot/{slot}"] = slot_var.lookup(tf.constant(next_ids)).numpy()


def make_eager_checkpoint(out):
  """A Variable of string keys trained eagerly by Keras Adam, saved by tf.train.Checkpoint."""
  os.makedirs(out)
  keys = np.array([f"user_{i:04d}".encode() for i in RNG.permutation(10000)[:120]], dtype=object)
  var = de.get_variable(
    "eager_user_emb",
    key_dtype=tf.string,
    dim=DIM,
    initializer=tf.keras.initializers.RandomNormal(seed=3),
  )
  shadow = de.shadow_ops.ShadowVariable(var, name="user_shadow")
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  weights = _weights(64)
  for batch in _batches(keys, STEPS, 64):
    _eager_step(var, shadow, optimizer, tf.constant(batch, tf.string), weights)
  checkpoint = tf.train.Checkpoint(emb=var, optimizer=optimizer)
  prefix = checkpoint.save(os.path.join(out, "ckpt"))
  expected = {}
  _record_eager(expected, var.name, var, optimizer)
  expected[f"{var.name}/step"] = np.int64(optimizer.iterations.numpy())
  next_ids = RNG.choice(expected[f"{var.name}/keys"], size=16, replace=False).astype(bytes)
  next_weights = _weights(16)
  _eager_step(var, shadow, optimizer, tf.constant(next_ids), next_weights)
  _record_next(expected, var.name, var, optimizer, next_ids, next_weights)
  _save_npz(os.path.join(out, "expected.npz"), expected)
  return {
    "format": "tf.train.Checkpoint(emb=var, optimizer=optimizer), eager",
    "checkpoint": os.path.basename(prefix),
    "variables": {var.name: {"dim": DIM, "key_dtype": "string", "optimizer": "keras Adam"}},
    "hyperparameters": {"learning_rate": LEARNING_RATE, "adam": "Keras defaults (epsilon=1e-7)"},
    "steps": STEPS,
  }


class _Model(tf.keras.Model):
  def __init__(self):
    super().__init__()
    self.emb = de.keras.layers.Embedding(
      DIM, initializer=tf.keras.initializers.RandomNormal(seed=5), name="item_emb"
    )
    self.dense = tf.keras.layers.Dense(1)

  def call(self, ids):
    return self.dense(tf.reduce_sum(self.emb(ids), 1))


def _keras_data(keys, n=96):
  ids = RNG.choice(keys, size=(n, 2))
  labels = RNG.normal(size=(n, 1)).astype(np.float32)
  return ids, labels


def _layer_step(layer, optimizer, ids, weights):
  """One step of _loss on the layer's rows alone (the Dense layer has no part in it)."""
  with tf.GradientTape() as tape:
    loss = _loss(layer(tf.constant(ids)), weights)
  variables = layer.trainable_variables
  optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _fit_keras_model(keys):
  model = _Model()
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  model.compile(optimizer=optimizer, loss="mse")
  ids, labels = _keras_data(keys)
  model.fit(ids, labels, batch_size=32, epochs=1, verbose=0)  # 3 steps
  return model, optimizer


def make_keras_weights(out):
  """A Keras model with de.keras.layers.Embedding, fitted with Keras Adam, model.save_weights."""
  os.makedirs(out)
  keys = _int_keys(120)
  model, optimizer = _fit_keras_model(keys)
  model.save_weights(os.path.join(out, "weights"))
  var = model.emb.params
  expected = {}
  _record_eager(expected, var.name, var, optimizer)
  expected[f"{var.name}/step"] = np.int64(optimizer.iterations.numpy())
  exported = var.export()[0].numpy()
  next_ids = RNG.choice(exported, size=16, replace=False)
  next_weights = _weights(16)
  _layer_step(model.emb, optimizer, next_ids, next_weights)
  _record_next(expected, var.name, var, optimizer, next_ids, next_weights)
  _save_npz(os.path.join(out, "expected.npz"), expected)
  return {
    "format": "Keras model.save_weights (TF checkpoint format) of a model with "
    "de.keras.layers.Embedding(name='item_emb') and a Dense layer",
    "checkpoint": "weights",
    "variables": {var.name: {"dim": DIM, "optimizer": "keras Adam"}},
    "hyperparameters": {"learning_rate": LEARNING_RATE, "adam": "Keras defaults (epsilon=1e-7)"},
    "steps": int(optimizer.iterations.numpy()) - 1,
    "note": "step counts the fit's 3 steps; next/ is a 4th step on the layer's rows alone",
  }


# ---- (c) de.keras.models.save_model: a SavedModel ----------------------------------------------


def make_saved_model(out):
  """The same kind of model, saved by de.keras.models.save_model (optimizer included)."""
  keys = _int_keys(100)
  inputs = tf.keras.Input((2,), dtype=tf.int64)
  layer = de.keras.layers.Embedding(
    DIM, initializer=tf.keras.initializers.RandomNormal(seed=9), name="ad_emb"
  )
  outputs = tf.keras.layers.Dense(1)(tf.reduce_sum(layer(inputs), 1))
  model = tf.keras.Model(inputs, outputs)
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  model.compile(optimizer=optimizer, loss="mse")
  ids, labels = _keras_data(keys)
  model.fit(ids, labels, batch_size=32, epochs=1, verbose=0)
  de.keras.models.save_model(model, out)
  # The graph (about 140 KB) is not what a restore reads: variables/ is the checkpoint.
  os.remove(os.path.join(out, "saved_model.pb"))
  var = layer.params
  expected = {}
  _record_eager(expected, var.name, var, optimizer)
  expected[f"{var.name}/step"] = np.int64(optimizer.iterations.numpy())
  _save_npz(os.path.join(out, "expected.npz"), expected)
  return {
    "format": "de.keras.models.save_model SavedModel (include_optimizer=True); its "
    "saved_model.pb is removed to keep the fixture small (variables/ is the checkpoint)",
    "checkpoint": "variables/variables",
    "variables": {var.name: {"dim": DIM, "optimizer": "keras Adam"}},
    "steps": STEPS,
  }


# ---- (d) FileSystemSaver: TFRA's own key and value files ---------------------------------------


def make_file_system_saver(out):
  """A Variable with kv_creator=CuckooHashTableCreator(saver=FileSystemSaver()): its key/value
  files and its slots' (save_to_file_system), and the DECheckpoint that writes them too."""
  os.makedirs(out)
  keys = _int_keys(140)
  var = de.get_variable(
    "fs_emb",
    dim=DIM,
    initializer=tf.keras.initializers.RandomNormal(seed=11),
    kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver()),
  )
  shadow = de.shadow_ops.ShadowVariable(var, name="fs_shadow")
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  weights = _weights(64)
  for batch in _batches(keys, STEPS, 64):
    _eager_step(var, shadow, optimizer, tf.constant(batch), weights)
  kv_dir = os.path.join(out, "kv")
  var.save_to_file_system(kv_dir)
  for slot_var in var.get_slot_variables(optimizer):
    slot_var.save_to_file_system(kv_dir)
  checkpoint = de.train.DECheckpoint(emb=var, optimizer=optimizer)
  prefix = checkpoint.save(os.path.join(out, "de_ckpt", "ckpt"))
  expected = {}
  _record_eager(expected, var.name, var, optimizer)
  expected[f"{var.name}/step"] = np.int64(optimizer.iterations.numpy())
  next_ids = RNG.choice(expected[f"{var.name}/keys"], size=16, replace=False)
  next_weights = _weights(16)
  _eager_step(var, shadow, optimizer, tf.constant(next_ids), next_weights)
  _record_next(expected, var.name, var, optimizer, next_ids, next_weights)
  _save_npz(os.path.join(out, "expected.npz"), expected)
  return {
    "format": "FileSystemSaver: kv/ from var.save_to_file_system (and each slot's), de_ckpt/ "
    "from de.train.DECheckpoint (its TFRADynamicEmbedding-1/ holds the same files)",
    "checkpoint": os.path.relpath(prefix, out),
    "variables": {var.name: {"dim": DIM, "optimizer": "keras Adam"}},
    "steps": STEPS,
  }


MAKERS = {
  "tf1_saver": make_tf1_saver,
  "eager_checkpoint": make_eager_checkpoint,
  "keras_weights": make_keras_weights,
  "saved_model": make_saved_model,
  "file_system_saver": make_file_system_saver,
}


def main(out_dir):
  # Each fixture is made anew; README.md (written by hand) stays.
  for name in MAKERS:
    shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
  os.makedirs(out_dir, exist_ok=True)
  fixtures = {}
  for name, make in MAKERS.items():
    tf.keras.backend.clear_session()
    fixtures[name] = make(os.path.join(out_dir, name))
  manifest = {
    "made_by": "tests/dynamic_embedding/tfra/make_tfra_fixtures.py",
    "command": "/work/tfra-venv/bin/python tests/dynamic_embedding/tfra/make_tfra_fixtures.py",
    "date": datetime.date.today().isoformat(),
    "tensorflow": tf.__version__,
    "tensorflow_recommenders_addons": tfra.__version__,
    "python": sys.version.split()[0],
    "numpy": np.__version__,
    "fixtures": fixtures,
  }
  with open(os.path.join(out_dir, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=2, sort_keys=True)
    f.write("\n")
  print(json.dumps(manifest, indent=2, sort_keys=True))


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures"))

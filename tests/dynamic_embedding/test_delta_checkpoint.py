"""Full and delta checkpoints of tables: tf_ext.DeltaCheckpointManager, its session hook and its
Keras callback. Restoring a chain's first k links must give exactly the tables of link k's step,
through evictions, removals and re-admissions; broken chains are clear errors that change
nothing."""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf
from _subprocess import ROOT

import tf_ext

DIM = 4


def _content(table):
  """Everything a checkpoint keeps of a table, sorted by key."""
  keys, values, slots, counts, steps, init = (x.numpy() for x in table.export_with_slots())
  order = np.argsort(keys)
  return [keys[order], values[order], slots[order], counts[order], steps[order], init]


def _assert_same(a, b):
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


def _table(name, **policies):
  return tf_ext.DynamicEmbeddingVariable(name, DIM, initializer="normal", **policies)


def _train(table, opt, ids, step):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(table.lookup(ids) - 0.1 * step))
  grads = tape.gradient(loss, [table.gradient_anchor])
  opt.apply_gradients(zip(grads, [table.gradient_anchor]))


def test_each_link_restores_exactly_the_tables_of_its_step(tmp_path):
  """Rows changed, removed, evicted and re-admitted between saves; Adam slots; two tables."""
  users = _table("users", eviction=tf_ext.EvictionPolicy(ttl_steps=3))
  items = tf_ext.DynamicEmbeddingVariable("items", 2, key_dtype=tf.string, initializer="zeros")
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [users, items], full_every_n_deltas=3)
  rng = np.random.default_rng(0)
  expected, kinds = {}, []
  for step in range(1, 9):
    _train(users, opt, rng.integers(0, 200, 64), step)
    items.insert([f"item{i}" for i in rng.integers(0, 50, 5)], rng.normal(size=(5, 2)))
    if step % 3 == 0:
      users.evict(step)  # rows idle for 3 steps go; some come back at the next training step
    if step == 5:
      users.remove(np.arange(0, 200, 7))
      items.remove(["item1", "item2"])
    kinds.append(manager.save(step)["kind"])
    expected[step] = (_content(users), _content(items))
  # full, 3 deltas, full (a new chain), 3 deltas
  assert kinds == ["full", "delta", "delta", "delta", "full", "delta", "delta", "delta"]
  assert [link["sequence"] for link in manager.links()] == [0, 1, 2, 3, 0, 1, 2, 3]

  # Other table objects (as in a new process) are matched by name, and restore any link.
  users2 = _table("users")
  items2 = tf_ext.DynamicEmbeddingVariable("items", 2, key_dtype=tf.string, initializer="zeros")
  users2.insert([999], [[5.0] * DIM])  # replaced by the restore
  reader = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [users2, items2])
  for step in range(1, 9):
    assert reader.restore(step=step) == step
    _assert_same(_content(users2), expected[step][0])
    _assert_same(_content(items2), expected[step][1])
  assert reader.restore() == 8


def test_delta_holds_only_what_changed_and_equals_a_full_save(tmp_path):
  table = _table("big")
  table.insert(np.arange(20000), np.ones([20000, DIM], np.float32))
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [table])
  full = manager.save(1)
  table.insert(np.arange(200), np.full([200, DIM], 2.0, np.float32))  # 1 % changed
  table.remove([20001, 5])  # one absent, one present
  delta = manager.save(2)
  assert (full["kind"], full["rows"]) == ("full", 20000)
  assert (delta["kind"], delta["rows"], delta["tombstones"]) == ("delta", 199, 1)
  assert delta["bytes"] < 0.03 * full["bytes"]
  # The same content a tf.train.Checkpoint (a full save) of this step restores.
  path = tf.train.Checkpoint(table=table).write(str(tmp_path / "full" / "ckpt"))
  from_checkpoint, from_chain = _table("from_checkpoint"), _table("big")
  tf.train.Checkpoint(table=from_checkpoint).read(path).assert_consumed()
  tf_ext.DeltaCheckpointManager(tmp_path / "chain", [from_chain]).restore()
  _assert_same(_content(from_chain), _content(from_checkpoint))


def test_old_chains_are_deleted_and_a_restored_chain_continues(tmp_path):
  table = _table("cont")
  manager = tf_ext.DeltaCheckpointManager(
    tmp_path / "chain", [table], full_every_n_deltas=1, max_chains=2
  )
  for step in range(1, 7):
    table.insert([step], [[float(step)] * DIM])
    manager.save(step)
  chains = sorted(d for d in os.listdir(tmp_path / "chain") if d.startswith("chain-"))
  assert len(chains) == 2 and [link["step"] for link in manager.links()] == [3, 4, 5, 6]
  # A new process's manager restores the tip and continues its chain... (here: a new manager)
  again = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [table], full_every_n_deltas=3)
  assert again.restore() == 6
  table.insert([7], [[7.0] * DIM])
  assert again.save(7)["kind"] == "delta"
  # ...but after restoring an older link, the next save starts a new chain.
  assert again.restore(step=5) == 5
  assert again.save(8)["kind"] == "full"


def _two_deltas(tmp_path, name):
  table = _table(name)
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [table])
  for step in range(3):
    table.insert([step, 100 + step], [[float(step)] * DIM] * 2)
    manager.save(step)
  manifest = json.loads((tmp_path / "chain" / "MANIFEST.json").read_text())
  files = [
    str(tmp_path / "chain" / link["tables"][name]["file"])
    for link in manifest["chains"][-1]["links"]
  ]
  target = _table(name)
  target.insert([42], [[4.2] * DIM])
  return manager, files, target


def _untouched(table):
  assert int(table.size()) == 1
  np.testing.assert_array_equal(table.lookup([42]).numpy(), np.full([1, DIM], 4.2, np.float32))


def test_missing_link_is_an_error_naming_the_file(tmp_path):
  _, files, target = _two_deltas(tmp_path, "missing")
  os.remove(files[1])
  reader = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [target])
  with pytest.raises(tf.errors.NotFoundError, match=f"'missing'.*{files[1]}.*missing"):
    reader.restore()
  _untouched(target)


def test_corrupt_link_is_an_error_naming_the_file(tmp_path):
  _, files, target = _two_deltas(tmp_path, "corrupt")
  raw = bytearray(open(files[2], "rb").read())
  raw[-10] ^= 0x01
  open(files[2], "wb").write(bytes(raw))
  with pytest.raises(tf.errors.DataLossError, match=f"'corrupt'.*{files[2]}.*checksum"):
    tf_ext.DeltaCheckpointManager(tmp_path / "chain", [target]).restore()
  _untouched(target)


def test_a_corrupt_file_of_a_later_table_leaves_the_earlier_tables_untouched(tmp_path):
  first, second = _table("atomic_first"), _table("atomic_second")
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [first, second])
  for step in range(3):
    for table in (first, second):
      table.insert([step, 100 + step], [[float(step)] * DIM] * 2)
    manager.save(step)
  manifest = json.loads((tmp_path / "chain" / "MANIFEST.json").read_text())
  last = str(
    tmp_path / "chain" / manifest["chains"][-1]["links"][-1]["tables"]["atomic_second"]["file"]
  )
  raw = bytearray(open(last, "rb").read())
  raw[-10] ^= 0x01  # in the last block: only a full read finds it
  open(last, "wb").write(bytes(raw))
  targets = [_table("atomic_first"), _table("atomic_second")]
  for target in targets:
    target.insert([42], [[4.2] * DIM])
  with pytest.raises(tf.errors.DataLossError, match=f"'atomic_second'.*{last}.*checksum"):
    tf_ext.DeltaCheckpointManager(tmp_path / "chain", targets).restore()
  for target in targets:  # the first table, restored first, changed nothing either
    _untouched(target)


def test_links_out_of_order_are_an_error_naming_the_table_and_file(tmp_path):
  _, files, target = _two_deltas(tmp_path, "order")
  first_delta = open(files[1], "rb").read()
  shutil.copyfile(files[2], files[1])  # link 1's name now holds delta number 2
  open(files[2], "wb").write(first_delta)
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=f"'order'.*delta chain out of order: '{files[1]}' is delta number 2 .*expected delta "
    "number 1",
  ):
    tf_ext.DeltaCheckpointManager(tmp_path / "chain", [target]).restore()
  _untouched(target)
  # A delta where the full snapshot should be.
  shutil.copyfile(files[2], files[0])
  with pytest.raises(tf.errors.InvalidArgumentError, match="must start with a full snapshot"):
    tf_ext.DeltaCheckpointManager(tmp_path / "chain", [target]).restore()
  _untouched(target)


def test_bad_manifest_and_bad_arguments(tmp_path):
  table = _table("args")
  (tmp_path / "chain").mkdir()
  (tmp_path / "chain" / "MANIFEST.json").write_text("{not json")
  with pytest.raises(tf.errors.DataLossError, match="manifest .*MANIFEST.json"):
    tf_ext.DeltaCheckpointManager(tmp_path / "chain", [table]).restore()
  for kwargs, message in [
    ({"full_every_n_deltas": 0}, "full_every_n_deltas must be a positive int"),
    ({"max_chains": -1}, "max_chains must be a positive int"),
    ({"tables": [tf.Variable(1.0)]}, "must be DynamicEmbeddingVariables"),
    ({"dense": object()}, "dense must be"),
  ]:
    with pytest.raises(ValueError, match=message):
      tf_ext.DeltaCheckpointManager(tmp_path / "other", **{"tables": [table], **kwargs})
  with pytest.raises(ValueError, match="every_n_steps, every_n_secs or both"):
    tf_ext.train.DeltaCheckpointHook(tmp_path)
  with pytest.raises(ValueError, match="every_n_steps must be a positive int"):
    tf_ext.keras.callbacks.DeltaCheckpoint(tmp_path, every_n_steps=0)
  with pytest.raises(ValueError, match="every_n_secs must be a positive number"):
    tf_ext.train.DeltaCheckpointHook(tmp_path, every_n_secs=-1)


def _graph_model():
  ids = tf.compat.v1.placeholder(tf.int64, [None])
  table = tf_ext.get_dynamic_embedding_variable("hooked", DIM, initializer="normal")
  w = tf.compat.v1.get_variable("w", [DIM, 1], initializer=tf.compat.v1.ones_initializer())
  step = tf.compat.v1.train.get_or_create_global_step()
  loss = tf.reduce_sum(tf.square(tf.matmul(table.lookup(ids), w) - 1.0))
  train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(
    loss, global_step=step
  )
  return ids, train, table.export_with_slots(), w, step


def test_session_hook_saves_restores_dense_state_and_continues(tmp_path):
  directory = tmp_path / "chain"
  with tf.Graph().as_default():
    ids, train, export, w, _ = _graph_model()
    hook = tf_ext.train.DeltaCheckpointHook(directory, every_n_steps=2, full_every_n_deltas=10)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      for step in range(7):
        sess.run(train, {ids: [step, step + 1, 50]})
      saved = (sess.run(export), sess.run(w))
  # steps 1..7: saves every 2 steps from the session's start, and one more at the end
  assert [(s["kind"], s["step"]) for s in hook.saved] == [
    ("full", 2),
    ("delta", 4),
    ("delta", 6),
    ("delta", 7),
  ]

  with tf.Graph().as_default():
    ids, train, export, w, step = _graph_model()
    hook = tf_ext.train.DeltaCheckpointHook(directory, every_n_steps=2)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      assert sess.run(step) == 7  # the dense state came back with the tables
      restored = (sess.run(export), sess.run(w))
      sess.run(train, {ids: [1]})
      sess.run(train, {ids: [2]})
  order_a, order_b = np.argsort(saved[0][0]), np.argsort(restored[0][0])
  for a, b in zip(saved[0][:5], restored[0][:5]):
    np.testing.assert_array_equal(a[order_a], b[order_b])
  np.testing.assert_array_equal(saved[1], restored[1])
  assert [(s["kind"], s["sequence"]) for s in hook.saved] == [("delta", 4)]  # the chain goes on


def test_session_hook_in_estimator(tmp_path):
  def input_fn():
    ids = tf.data.Dataset.range(40).batch(4)
    return ids.map(lambda i: ({"ids": i}, tf.ones([tf.size(i)])))

  def model_fn(features, labels, mode):
    emb = tf_ext.dynamic_embedding(features["ids"], 2, name="est_delta")
    loss = tf.reduce_sum(tf.square(tf.reduce_sum(emb, 1) - labels))
    train_op = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  hook = tf_ext.train.DeltaCheckpointHook(tmp_path / "chain", every_n_steps=3)
  tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "est")).train(input_fn, hooks=[hook])
  assert [s["step"] for s in hook.saved] == [3, 6, 9, 10]
  assert [s["rows"] for s in hook.saved] == [12, 12, 12, 4]  # the full, then the batches since
  assert hook.manager.latest_step() == 10


def _keras_model():
  ids = tf.keras.Input(shape=(), dtype=tf.int64)
  emb = tf_ext.keras.layers.DynamicEmbedding(DIM, name="keras_delta")(ids)
  model = tf.keras.Model(ids, tf.keras.layers.Dense(1, kernel_initializer="ones")(emb))
  model.compile(tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), "mse")
  return model


def test_keras_callback_saves_and_resumes(tmp_path):
  x = np.arange(64, dtype=np.int64) % 40
  y = np.linspace(0, 1, 64).astype(np.float32)
  model = _keras_model()
  callback = tf_ext.keras.callbacks.DeltaCheckpoint(tmp_path / "chain", every_n_steps=4)
  model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
  assert [s["kind"] for s in callback.saved] == ["full", "delta", "delta", "delta"]
  table = model.get_layer("keras_delta").table
  saved = _content(table)

  tf.keras.backend.clear_session()
  resumed = _keras_model()
  callback2 = tf_ext.keras.callbacks.DeltaCheckpoint(tmp_path / "chain", every_n_steps=4)
  resumed.fit(x[:8], y[:8], batch_size=8, epochs=1, verbose=0, callbacks=[callback2])
  # fit restored step 16 first, then trained one batch: step 17, one more delta of the chain
  assert int(resumed.optimizer.iterations.numpy()) == 17
  assert [(s["kind"], s["sequence"]) for s in callback2.saved] == [("delta", 4)]
  reader = _table(table.name)
  tf_ext.DeltaCheckpointManager(tmp_path / "chain", [reader]).restore(step=16)
  _assert_same(_content(reader), saved)


def test_kill_during_delta_saves_leaves_the_chain_restorable(tmp_path):
  """A process killed while writing deltas: the manifest still names only complete links, and
  each restores to exactly its step's content."""
  directory = tmp_path / "chain"
  marker = tmp_path / "first_delta"
  script = f"""
    import pathlib, numpy as np, tensorflow as tf, tf_ext
    table = tf_ext.DynamicEmbeddingVariable("killed", 32, initializer="zeros")
    manager = tf_ext.DeltaCheckpointManager({str(directory)!r}, [table], full_every_n_deltas=1000)
    for step in range(1, 10_000):
      # the content of step s: ids [s * 100000, (s + 1) * 100000) hold s; older ones removed
      keys = np.arange(step * 100_000, (step + 1) * 100_000)
      table.insert(keys, np.full([len(keys), 32], float(step), np.float32))
      table.remove(np.arange((step - 2) * 100_000, (step - 1) * 100_000))
      manager.save(step)
      if step == 2:
        pathlib.Path({str(marker)!r}).write_text("")
  """
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env)
  deadline = time.time() + 180
  while not marker.exists() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  assert marker.exists(), "the first delta was never written"
  time.sleep(2.5)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  target = tf_ext.DynamicEmbeddingVariable("killed", 32, initializer="zeros")
  manager = tf_ext.DeltaCheckpointManager(directory, [target], full_every_n_deltas=1000)
  step = manager.restore()
  assert step >= 2
  keys = np.sort(target.export()[0].numpy())
  np.testing.assert_array_equal(keys, np.arange((step - 1) * 100_000, (step + 1) * 100_000))
  rows = target.lookup([(step - 1) * 100_000, step * 100_000]).numpy()
  np.testing.assert_array_equal(rows[:, 0], [step - 1, step])
  # A later save after the crash starts cleanly (the killed link's leftovers are gone).
  assert manager.save(step + 1)["kind"] == "delta"
  listed = {d for d in os.listdir(directory) if d.startswith("chain-")}
  assert len(listed) == 1


def test_snapshot_ops_reject_bad_input_without_crashing(tmp_path):
  ops = tf_ext._ops_loader.load()
  table = _table("raw_ops")
  table.insert([1], [[1.0] * DIM])
  with pytest.raises(tf.errors.InvalidArgumentError, match="'raw_ops'.*input 1 must be a scalar"):
    ops.tf_ext_table_save_snapshot(table.resource_handle, ["a", "b"], -1, 0, 0, 0)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'raw_ops'.*paths is empty"):
    ops.tf_ext_table_restore_snapshots(table.resource_handle, tf.constant([], tf.string))
  not_a_snapshot = tmp_path / "text.snap"
  not_a_snapshot.write_text("x" * 500)
  with pytest.raises(tf.errors.DataLossError, match=f"'raw_ops'.*{not_a_snapshot}.*bad magic"):
    ops.tf_ext_table_restore_snapshots(table.resource_handle, [str(not_a_snapshot)])
  with pytest.raises(tf.errors.NotFoundError, match="'raw_ops'.*cannot open"):
    ops.tf_ext_table_restore_snapshots(table.resource_handle, [str(tmp_path / "absent.snap")])
  # An empty path separates the chains of a split table's parts: none may be empty.
  with pytest.raises(tf.errors.InvalidArgumentError, match="'raw_ops'.*an empty chain"):
    ops.tf_ext_table_restore_snapshots(table.resource_handle, [str(not_a_snapshot), "", ""])
  with pytest.raises(tf.errors.InvalidArgumentError, match="shard_index 2 of num_shards 2"):
    ops.tf_ext_table_restore_snapshots(
      table.resource_handle, [str(not_a_snapshot)], num_shards=2, shard_index=2
    )
  assert int(table.size()) == 1


def _resident_mib():
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.parametrize("trim", ["0", "1"])
def test_a_save_gives_the_heap_memory_freed_before_it_back(tmp_path, monkeypatch, trim):
  """glibc keeps freed heap memory resident; with TF_EXT_TRIM_HEAP_AFTER_SAVE=1 (the default) a
  save hands it back (malloc_trim), with 0 it stays. 200 MiB of 4 KiB blocks are written and
  freed, all but one block at the end, which keeps glibc from trimming the heap's top itself."""
  libc = ctypes.CDLL(None)
  if not hasattr(libc, "gnu_get_libc_version"):
    pytest.fail("this test measures glibc's heap; the machines here all run glibc")
  libc.malloc.restype = ctypes.c_void_p
  libc.malloc.argtypes = [ctypes.c_size_t]
  libc.free.argtypes = [ctypes.c_void_p]
  monkeypatch.setenv("TF_EXT_TRIM_HEAP_AFTER_SAVE", trim)
  table = _table(f"trim_{trim}")
  table.insert(np.arange(100), np.ones([100, DIM], np.float32))
  manager = tf_ext.DeltaCheckpointManager(tmp_path / "chain", [table])
  manager.save(0)  # the save's own first-time allocations happen here, not below
  blocks = [libc.malloc(4096) for _ in range(51_200)]
  for block in blocks:
    ctypes.memset(block, 1, 4096)
  pin = libc.malloc(4096)
  for block in blocks:
    libc.free(block)
  before = _resident_mib()
  manager.save(1)
  released = before - _resident_mib()
  libc.free(pin)
  if trim == "1":
    assert released > 150, f"{released:.0f} MiB released"
  else:
    assert released < 50, f"{released:.0f} MiB released"

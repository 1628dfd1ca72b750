"""Checkpoints: Saver and tf.train.Checkpoint keep rows, slots and metadata; failures are safe."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from _subprocess import ROOT, run_python

import tf_ext
from tf_ext.dynamic_embedding import checkpoint

DIM = 4


def _train_step(table, w, opt, ids, labels):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(tf.matmul(table.lookup(ids), w) - labels))
  variables = [table.gradient_anchor, w]
  opt.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _data(step):
  rng = np.random.default_rng(step)
  return rng.integers(0, 50, 16).astype(np.int64), rng.normal(size=(16, 1)).astype(np.float32)


def _model(name):
  table = tf_ext.DynamicEmbeddingVariable(name, DIM, initializer="truncated_normal")
  w = tf.Variable(tf.ones([DIM, 1]), name="w")
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
  return table, w, opt


def _snapshot(table):
  keys, values, slots, counts, steps, init = (x.numpy() for x in table.export_with_slots())
  order = np.argsort(keys)
  return keys[order], values[order], slots[order], counts[order], steps[order]


def test_checkpoint_restores_rows_slots_metadata_and_continues_identically(tmp_path):
  table, w, opt = _model("ckpt_a")
  for step in range(5):
    _train_step(table, w, opt, *_data(step))
  ckpt = tf.train.Checkpoint(table=table, w=w, opt=opt)
  path = ckpt.write(str(tmp_path / "ckpt"))
  for step in range(5, 10):
    _train_step(table, w, opt, *_data(step))
  uninterrupted = _snapshot(table)

  table2, w2, opt2 = _model("ckpt_b")
  _train_step(table2, w2, opt2, *_data(99))  # has other content and slots before the restore
  tf.train.Checkpoint(table=table2, w=w2, opt=opt2).read(path).assert_consumed()
  restored_keys = _snapshot(table2)[0]
  assert len(restored_keys) == int(table2.size())
  for step in range(5, 10):
    _train_step(table2, w2, opt2, *_data(step))
  for a, b in zip(uninterrupted, _snapshot(table2)):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_fresh_process_restores_identical_lookups(tmp_path):
  table, w, opt = _model("fresh_src")
  for step in range(3):
    _train_step(table, w, opt, *_data(step))
  path = tf.train.Checkpoint(table=table).write(str(tmp_path / "ckpt"))
  ids = np.arange(-5, 60)
  expected = table.lookup(ids).numpy()
  out = tmp_path / "lookups.npy"
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    table = tf_ext.DynamicEmbeddingVariable("other_name", {DIM}, initializer="truncated_normal")
    tf.train.Checkpoint(table=table).read({path!r}).assert_consumed()
    np.save({str(out)!r}, table.lookup(np.arange(-5, 60)).numpy())
  """)
  np.testing.assert_array_equal(np.load(out), expected)


def test_saver_in_graph_mode_with_monitored_training_session(tmp_path):
  def build():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    table = tf_ext.get_dynamic_embedding_variable(
      "saver_table", DIM, key_dtype=tf.int64, initializer="normal"
    )
    step = tf.compat.v1.train.get_or_create_global_step()
    loss = tf.reduce_sum(tf.square(table.lookup(ids) - 1.0))
    train = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
      loss, global_step=step
    )
    return ids, table, train, table.export_with_slots()

  with tf.Graph().as_default():
    ids, table, train, export = build()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.train.MonitoredTrainingSession(
      checkpoint_dir=str(tmp_path), save_checkpoint_steps=None, save_checkpoint_secs=None
    ) as sess:
      for step in range(4):
        sess.run(train, {ids: _data(step)[0]})
      exported = sess.run(export)
      saver.save(sess._tf_sess(), str(tmp_path / "model.ckpt"), global_step=4)
  with tf.Graph().as_default():
    ids, table, train, export = build()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, tf.compat.v1.train.latest_checkpoint(str(tmp_path)))
      restored = sess.run(export)
      assert sess.run(tf.compat.v1.train.get_global_step()) == 4
  order_a, order_b = np.argsort(exported[0]), np.argsort(restored[0])
  for a, b in zip(exported[:5], restored[:5]):
    np.testing.assert_array_equal(a[order_a], b[order_b])
  np.testing.assert_array_equal(exported[5], restored[5])
  assert restored[2].shape[1] == DIM  # Adagrad's accumulator travelled with the rows


def test_mismatched_dim_is_a_clear_error_and_leaves_table_untouched(tmp_path):
  src = tf_ext.DynamicEmbeddingVariable("dim4", 4, initializer="zeros")
  src.insert([1, 2], np.ones([2, 4], np.float32))
  path = tf.train.Checkpoint(table=src).write(str(tmp_path / "ckpt"))
  dst = tf_ext.DynamicEmbeddingVariable("dim8", 8, initializer="zeros")
  dst.insert([7], np.full([1, 8], 3.0, np.float32))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'dim8'.*holds rows of dim 4, the table has dim 8"
  ):
    tf.train.Checkpoint(table=dst).read(path)
  assert int(dst.size()) == 1
  np.testing.assert_array_equal(dst.lookup([7]).numpy(), np.full([1, 8], 3.0))


def test_mismatched_key_dtype_is_a_clear_error_and_leaves_table_untouched(tmp_path):
  src = tf_ext.DynamicEmbeddingVariable("int64_keys", 4, initializer="zeros")
  src.insert([1, 2], np.ones([2, 4], np.float32))
  path = tf.train.Checkpoint(table=src).write(str(tmp_path / "ckpt"))
  dst = tf_ext.DynamicEmbeddingVariable("string_keys", 4, key_dtype=tf.string, initializer="zeros")
  dst.insert(["kept"], np.full([1, 4], 3.0, np.float32))
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match="'string_keys'.*holds int64 keys, the table has string keys \\(key_dtype\\)",
  ):
    tf.train.Checkpoint(table=dst).read(path)
  assert int(dst.size()) == 1
  np.testing.assert_array_equal(dst.lookup(["kept"]).numpy(), np.full([1, 4], 3.0))


def test_import_with_duplicate_keys_is_rejected_atomically():
  table = tf_ext.DynamicEmbeddingVariable("dups", 2, initializer="zeros")
  table.insert([5], [[1.0, 1.0]])
  with pytest.raises(tf.errors.InvalidArgumentError, match="'dups'.*duplicate"):
    table.import_with_slots(
      [1, 1], np.zeros([2, 2]), np.zeros([2, 0]), [0, 0], [0, 0], np.zeros([0])
    )
  np.testing.assert_array_equal(table.export()[0].numpy(), [5])


def test_corrupted_checkpoint_is_a_clear_error(tmp_path):
  src = tf_ext.DynamicEmbeddingVariable("corrupt_src", 4, initializer="zeros")
  src.insert(np.arange(1000), np.ones([1000, 4], np.float32))
  path = tf.train.Checkpoint(table=src).write(str(tmp_path / "ckpt"))
  (table_file,) = tf.io.gfile.glob(path + ".data-t*")  # the table's snapshot, beside the index
  raw = bytearray(open(table_file, "rb").read())
  raw[len(raw) // 2] ^= 0xFF
  open(table_file, "wb").write(bytes(raw))
  dst = tf_ext.DynamicEmbeddingVariable("corrupt_dst", 4, initializer="zeros")
  dst.insert([3], [[2.0, 2.0, 2.0, 2.0]])
  with pytest.raises(tf.errors.DataLossError, match=f"'corrupt_dst'.*{table_file}.*checksum"):
    tf.train.Checkpoint(table=dst).read(path).assert_consumed()
  assert int(dst.size()) == 1  # nothing partially restored
  np.testing.assert_array_equal(dst.lookup([3]).numpy(), [[2.0] * 4])


def test_a_corrupt_table_file_leaves_every_table_of_the_checkpoint_untouched(tmp_path):
  sources = {
    name: tf_ext.DynamicEmbeddingVariable(f"atomic_{name}_src", 4, initializer="zeros")
    for name in ("a_first", "b_second")
  }
  for table in sources.values():
    table.insert(np.arange(100), np.ones([100, 4], np.float32))
  path = tf.train.Checkpoint(**sources).write(str(tmp_path / "ckpt"))
  corrupt = path + checkpoint.snapshot_suffix("b_second")  # restored after a_first
  raw = bytearray(open(corrupt, "rb").read())
  raw[-10] ^= 0xFF
  open(corrupt, "wb").write(bytes(raw))
  targets = {
    name: tf_ext.DynamicEmbeddingVariable(f"atomic_{name}_dst", 4, initializer="zeros")
    for name in sources
  }
  for table in targets.values():
    table.insert([3], [[2.0, 2.0, 2.0, 2.0]])
  with pytest.raises(tf.errors.DataLossError, match=f"'atomic_b_second_dst'.*{corrupt}"):
    tf.train.Checkpoint(**targets).read(path)
  for table in targets.values():
    assert int(table.size()) == 1
    np.testing.assert_array_equal(table.lookup([3]).numpy(), [[2.0] * 4])


@pytest.mark.parametrize("sharded", [False, True], ids=["saver", "sharded_saver"])
@pytest.mark.parametrize("corrupt", ["a_first", "b_second"])
def test_a_corrupt_table_file_leaves_every_table_a_saver_restores_untouched(
  tmp_path, corrupt, sharded
):
  names = ("a_first", "b_second")

  def build():
    tables = {n: tf_ext.get_dynamic_embedding_variable(f"saver_atomic_{n}", 4) for n in names}
    return tables, tf.compat.v1.train.Saver(sharded=sharded)

  with tf.Graph().as_default():
    tables, saver = build()
    inserts = [t.insert(np.arange(100), np.ones([100, 4], np.float32)) for t in tables.values()]
    with tf.compat.v1.Session() as sess:
      sess.run([tf.compat.v1.global_variables_initializer(), *inserts])
      path = saver.save(sess, str(tmp_path / "model.ckpt"))
  damaged = path + _suffix(f"saver_atomic_{corrupt}")
  raw = bytearray(open(damaged, "rb").read())
  raw[-10] ^= 0xFF
  open(damaged, "wb").write(bytes(raw))
  with tf.Graph().as_default():
    tables, saver = build()
    inserts = [t.insert([3], [[2.0] * 4]) for t in tables.values()]
    sizes = [t.size() for t in tables.values()]
    rows = [t.lookup([3]) for t in tables.values()]
    with tf.compat.v1.Session() as sess:
      sess.run([tf.compat.v1.global_variables_initializer(), *inserts])
      with pytest.raises(tf.errors.DataLossError, match=f"'saver_atomic_{corrupt}'.*checksum"):
        saver.restore(sess, path)
      assert sess.run(sizes) == [1, 1]  # neither table changed, whichever the Saver did first
      for row in sess.run(rows):
        np.testing.assert_array_equal(row, [[2.0] * 4])


def test_missing_table_file_is_a_clear_error(tmp_path):
  src = tf_ext.DynamicEmbeddingVariable("missing_src", 4, initializer="zeros")
  src.insert([1], [[1.0] * 4])
  path = tf.train.Checkpoint(table=src).write(str(tmp_path / "ckpt"))
  (table_file,) = tf.io.gfile.glob(path + ".data-t*")
  os.remove(table_file)
  dst = tf_ext.DynamicEmbeddingVariable("missing_dst", 4, initializer="zeros")
  with pytest.raises(
    tf.errors.NotFoundError, match=f"'missing_dst'.*no snapshot file '{table_file}'"
  ):
    tf.train.Checkpoint(table=dst).read(path)


def test_crash_during_save_leaves_previous_checkpoint_intact(tmp_path):
  """A process killed while saving a large table must not damage the last good checkpoint."""
  ckpt_dir = tmp_path / "ckpts"
  marker = tmp_path / "saved_first"
  script = f"""
    import numpy as np, tensorflow as tf, tf_ext, pathlib
    table = tf_ext.DynamicEmbeddingVariable("crash", 64, initializer="zeros")
    table.insert(np.arange(1000), np.full([1000, 64], 1.0, np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(table=table), {str(ckpt_dir)!r}, 3)
    manager.save()
    pathlib.Path({str(marker)!r}).write_text(manager.latest_checkpoint)
    for start in range(0, 2_000_000, 200_000):  # make the second save big and slow
      keys = np.arange(start, start + 200_000)
      table.insert(keys, np.full([len(keys), 64], 2.0, np.float32))
    while True:
      manager.save()
  """
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.Popen([sys.executable, "-c", __import__("textwrap").dedent(script)], env=env)
  deadline = time.time() + 180
  while not marker.exists() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  assert marker.exists(), "the first checkpoint was never written"
  first = marker.read_text()
  # Kill it during the large saves that follow.
  time.sleep(4.0)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  latest = tf.train.latest_checkpoint(str(ckpt_dir))
  assert latest is not None
  dst = tf_ext.DynamicEmbeddingVariable("crash_dst", 64, initializer="zeros")
  tf.train.Checkpoint(table=dst).read(latest).assert_existing_objects_matched()
  size = int(dst.size())
  assert size in (1000, 2_000_000)  # the first checkpoint or a complete later one, nothing between
  if latest == first:
    np.testing.assert_array_equal(dst.lookup([0, 999]).numpy(), np.ones([2, 64]))


def test_old_checkpoints_take_their_table_files_with_them(tmp_path):
  """The table's file is named like a TensorFlow data file, so TF's own cleanup deletes it."""
  table = tf_ext.DynamicEmbeddingVariable("kept_two", DIM, initializer="zeros")
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(table=table), str(tmp_path / "tf2"), 2)
  for step in range(4):
    table.insert([step], [[float(step)] * DIM])
    manager.save()
  table_files = tf.io.gfile.glob(str(tmp_path / "tf2" / "*.data-t*"))
  assert len(table_files) == 2 and all(
    any(f.startswith(kept + ".") for kept in manager.checkpoints) for f in table_files
  )
  with tf.Graph().as_default():
    graph_table = tf_ext.get_dynamic_embedding_variable("saver_kept", DIM, initializer="zeros")
    insert = graph_table.insert([1], [[1.0] * DIM])
    saver = tf.compat.v1.train.Saver(max_to_keep=1)
    with tf.compat.v1.Session() as sess:
      sess.run([tf.compat.v1.global_variables_initializer(), insert])
      for step in range(3):
        saver.save(sess, str(tmp_path / "tf1" / "model.ckpt"), global_step=step)
  remaining = sorted(
    os.path.basename(f) for f in tf.io.gfile.glob(str(tmp_path / "tf1" / "*.data-*"))
  )
  assert remaining == ["model.ckpt-2.data-00000-of-00001", "model.ckpt-2" + _suffix("saver_kept")]


def _suffix(name):
  from tf_ext.dynamic_embedding import checkpoint  # pylint: disable=import-outside-toplevel

  return checkpoint.snapshot_suffix(name)


def test_tf2_checkpoint_restore_in_a_tf1_graph_is_a_clear_error(tmp_path):
  src = tf_ext.DynamicEmbeddingVariable("eager_src", DIM, initializer="zeros")
  path = tf.train.Checkpoint(table=src).write(str(tmp_path / "ckpt"))
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable("graph_dst", DIM)
    with pytest.raises(ValueError, match="cannot restore dynamic embedding tables in a TF1 graph"):
      tf.train.Checkpoint(table=table).restore(path)


def test_saver_restores_a_table_in_another_graph_and_a_new_process(tmp_path):
  prefix = str(tmp_path / "model.ckpt")
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable("moved", DIM, key_dtype=tf.string)
    insert = table.insert(["a", "b"], [[1.0] * DIM, [2.0] * DIM])
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run([tf.compat.v1.global_variables_initializer(), insert])
      saver.save(sess, prefix)
  moved = tmp_path / "moved"
  moved.mkdir()
  for f in tf.io.gfile.glob(prefix + ".*"):  # copying <prefix>.* takes the table along
    shutil.copy(f, moved)
  out = tmp_path / "rows.npy"
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    with tf.Graph().as_default():
      table = tf_ext.get_dynamic_embedding_variable("moved", {DIM}, key_dtype=tf.string)
      rows = table.lookup(["b", "a", "c"])
      saver = tf.compat.v1.train.Saver()
      with tf.compat.v1.Session() as sess:
        saver.restore(sess, {str(moved / "model.ckpt")!r})
        np.save({str(out)!r}, sess.run(rows))
  """)
  np.testing.assert_array_equal(np.load(out)[:2], [[2.0] * DIM, [1.0] * DIM])

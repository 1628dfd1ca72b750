"""TFRA's FileSystemSaver over tf_ext.tfra: TFRA's key and value files (save_to_file_system /
load_from_file_system of a table and of a Variable), and FileSystemSaver checkpoints, which
restore into a Variable of another number of tables (their rows and slots)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tf_ext.tfra as de
from tf_ext.dynamic_embedding.tfra import checkpoints


def _name(request):
  return request.node.name.replace("[", "_").replace("]", "")


def _fs_variable(name, shards, saver=None, **kwargs):
  return de.get_variable(
    name,
    dim=2,
    devices=["/CPU:0"] * shards,
    kv_creator=de.CuckooHashTableCreator(saver=saver or de.FileSystemSaver()),
    **kwargs,
  )


def _entries(variable, run=lambda x: x):
  """{key: (row, slots, update count)} of every table, and [set of keys] per table."""
  entries, per_table = {}, []
  for table in variable.tables:
    keys, values, slots, counts, *_ = [np.asarray(x) for x in run(table.export_with_slots())]
    per_table.append(set(keys.tolist()))
    for i, key in enumerate(keys.tolist()):
      entries[key] = (values[i].tolist(), slots[i].tolist(), int(counts[i]))
  return entries, per_table


def test_table_files_are_tfras_layout_and_load_back(request, tmp_path):
  name = _name(request)
  var = de.get_variable(name, key_dtype=tf.int32, value_dtype=tf.float16, dim=3)
  keys = tf.constant([7, -2, 40], tf.int32)
  rows = tf.constant([[1, 2, 3], [0.5, -1, 0], [9, 8, 7]], tf.float16)
  var.upsert(keys, rows)
  table = var.tables[0]
  assert table.save_to_file_system(str(tmp_path), file_name="t") is None  # eagerly: written
  # TFRA's layout: raw little-endian keys and rows in the Variable's own dtypes.
  saved_keys = np.fromfile(tmp_path / "t-keys", "<i4")
  saved_rows = np.fromfile(tmp_path / "t-values", "<f2").reshape([-1, 3])
  order = np.argsort(saved_keys)
  np.testing.assert_array_equal(saved_keys[order], [-2, 7, 40])
  np.testing.assert_array_equal(saved_rows[order], rows.numpy()[[1, 0, 2]])
  # Appended: the file holds both saves; a load sets the rows of the keys it holds.
  table.save_to_file_system(f"file://{tmp_path}/", file_name="t", append_to_file=True)
  assert os.path.getsize(tmp_path / "t-keys") == 2 * 3 * 4
  other = de.get_variable(name + "_other", key_dtype=tf.int32, value_dtype=tf.float16, dim=3)
  other.upsert(tf.constant([5], tf.int32), tf.ones([1, 3], tf.float16))
  other.tables[0].load_from_file_system(str(tmp_path), file_name="t")
  assert int(other.size()) == 4  # as TFRA's: other keys keep their rows
  np.testing.assert_array_equal(other.lookup(keys), rows)


def test_variable_files_restore_into_another_number_of_tables_and_ranks(request, tmp_path):
  name = _name(request)
  var = de.Variable(name=name, dim=2, devices=["/CPU:0"] * 3)
  keys = tf.range(10, dtype=tf.int64)
  rows = tf.stack([tf.cast(keys, tf.float32), -tf.cast(keys, tf.float32)], 1)
  var.upsert(keys, rows)
  var.save_to_file_system(str(tmp_path))
  names = [f"{name}_mht_{i}of3_rank0_size1" for i in (1, 2, 3)]
  assert sorted(os.listdir(tmp_path)) == sorted(
    f"{n}-{p}" for n in names for p in ("keys", "values")
  )
  # The files TFRA's FileSystemSaver writes: restore_from_tfra's reader reads them.
  saved = checkpoints.TfraCheckpoint(str(tmp_path))
  assert [(len(g.shards), g.rows) for g in saved.groups.values()] == [(3, 10)]

  # A Variable of the same name and another number of tables: each key in the table of its
  # partition now (key mod 2); of rank 1 of 2, the keys the partitioner gives rank 1.
  two = de.Variable(name=name, dim=2, devices=["/CPU:0"] * 2)
  two.load_from_file_system_with_restore_function(str(tmp_path))
  assert [int(two.size(i)) for i in range(2)] == [5, 5]
  np.testing.assert_array_equal(two.lookup(keys), rows)
  rank = de.Variable(name=name, dim=2)
  rank.load_from_file_system_with_restore_function(str(tmp_path), proc_size=2, proc_rank=1)
  np.testing.assert_array_equal(np.sort(rank.export()[0].numpy()), [1, 3, 5, 7, 9])

  # Each table from the files of its own name; load_entire_dir: every file into one table.
  again = de.Variable(name=name, dim=2, devices=["/CPU:0"] * 3)
  again.load_from_file_system(str(tmp_path))
  assert [int(again.size(i)) for i in range(3)] == [int(var.size(i)) for i in range(3)]
  whole = de.Variable(name=name, dim=2)
  whole.tables[0].load_from_file_system(str(tmp_path), file_name=names[1], load_entire_dir=True)
  assert int(whole.size()) == 10


def test_bad_files_and_string_keys_are_refused_by_name(request, tmp_path):
  name = _name(request)
  var = de.get_variable(name, dim=2)
  var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
  var.save_to_file_system(str(tmp_path))
  values = next(p for p in tmp_path.iterdir() if p.name.endswith("-values"))
  values.write_bytes(values.read_bytes()[:-4])
  with pytest.raises(tf.errors.InvalidArgumentError, match="files disagree.*-keys and .*-values"):
    var.load_from_file_system(str(tmp_path))
  words = de.get_variable(name + "_s", key_dtype=tf.string, dim=2)
  with pytest.raises(TypeError, match="fixed size.*checkpoint"):
    words.tables[0].save_to_file_system(str(tmp_path))


def _train(var, optimizer, steps=3):
  ids = tf.constant([0, 1, 2, 3, 4, 5, 13], tf.int64)
  for _ in range(steps):
    with tf.GradientTape() as tape:
      rows, wrapper = de.embedding_lookup(var, ids, name="lookup", return_trainable=True)
      loss = tf.reduce_sum(tf.square(rows - 1.0))
    optimizer.apply_gradients([(tape.gradient(loss, wrapper), wrapper)])


@pytest.mark.parametrize("shards", [3, 1, 2, 5])
def test_a_checkpoint_restores_into_another_number_of_tables(request, tmp_path, shards):
  """tf.train.Checkpoint: rows, slots and update counts, each key in the table of its partition."""
  name = _name(request)
  var = _fs_variable(name, 3, initializer=0.5)
  _train(var, de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1)))
  saved, _ = _entries(var)
  prefix = tf.train.Checkpoint(emb=var).save(str(tmp_path / "ckpt"))
  restored = _fs_variable(name + "_restored", shards)
  restored.upsert(tf.constant([99], tf.int64), tf.ones([1, 2]))  # replaced by the restore
  # (A checkpoint of more tables holds tables this Variable does not have: expect_partial.)
  tf.train.Checkpoint(emb=restored).read(prefix).expect_partial()
  entries, per_table = _entries(restored)
  assert entries == saved
  for index, keys in enumerate(per_table):
    assert all(key % shards == index for key in keys)


def test_a_saved_model_of_a_file_system_saver_variable_loads_and_serves(request, tmp_path):
  var = _fs_variable(_name(request), 2, initializer=0.5)
  var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
  module = tf.Module()
  module.var = var
  module.lookup = tf.function(var.lookup, input_signature=[tf.TensorSpec([None], tf.int64)])
  tf.saved_model.save(module, str(tmp_path))
  loaded = tf.saved_model.load(str(tmp_path))
  np.testing.assert_array_equal(
    loaded.lookup(tf.constant([1, 2, 3], tf.int64)), [[1, 1], [1, 1], [0.5, 0.5]]
  )


@pytest.mark.parametrize("shards", [2, 3, 1])
def test_a_saver_checkpoint_restores_into_another_number_of_tables(tmp_path, shards):
  """tf.compat.v1.train.Saver in TF1 graphs (the default list), TF1 Adam's slots kept."""
  prefix = str(tmp_path / "model")
  with tf.Graph().as_default():
    var = _fs_variable("saver_table", 2, initializer=0.5)
    rows = de.embedding_lookup(var, tf.constant([1, 2, 3, 8], tf.int64), name="lookup")
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    train = optimizer.minimize(tf.reduce_sum(tf.square(rows - 1.0)), global_step=step)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(3):
        session.run(train)
      saved, _ = _entries(var, session.run)
      saver.save(session, prefix)
  with tf.Graph().as_default():
    var = _fs_variable("saver_table", shards)
    tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      saver.restore(session, prefix)
      entries, per_table = _entries(var, session.run)
  assert entries == saved and len(saved) == 4
  for index, keys in enumerate(per_table):
    assert all(key % shards == index for key in keys)


def test_a_restore_keeps_its_ranks_keys_and_reads_other_ranks_files(request, tmp_path):
  """TFRA's multi-process flow: rank 0 saves the checkpoint, rank 1 its files beside it."""
  name = _name(request)

  def part(rank, shards=1):
    saver = de.FileSystemSaver(proc_size=2, proc_rank=rank)
    creator = de.CuckooHashTableCreator(saver=saver)
    return de.Variable(name=name, dim=2, devices=["/CPU:0"] * shards, kv_creator=creator)

  rank0 = part(0)
  rank0.upsert(tf.constant([0, 1, 2], tf.int64), tf.ones([3, 2]))
  prefix = tf.train.Checkpoint(emb=rank0).save(str(tmp_path / "ckpt"))
  rank1 = part(1)
  rank1.upsert(tf.constant([3, 4, 5], tf.int64), tf.fill([3, 2], 2.0))
  rank1.save_to_file_system(str(tmp_path / "TFRADynamicEmbedding"), proc_size=2, proc_rank=1)
  got = {}
  for rank in (0, 1):
    var = part(rank, shards=2)
    tf.train.Checkpoint(emb=var).read(prefix).expect_partial()
    keys, values = var.export()
    got[rank] = dict(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist()))
  assert got == {0: {0: 1.0, 2: 1.0, 4: 2.0}, 1: {1: 1.0, 3: 2.0, 5: 2.0}}


def test_warm_start_from_a_file_system_saver_checkpoint(tmp_path):
  prefix = str(tmp_path / "model")
  with tf.Graph().as_default():
    var = _fs_variable("warm", 2)
    written = var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 2]))
    with tf.compat.v1.Session() as session:
      session.run(written)
      tf.compat.v1.train.Saver().save(session, prefix)
  with tf.Graph().as_default():
    var = de.get_variable("warm_new", dim=2, devices=["/CPU:0"] * 3)
    start = de.warm_start(prefix, [var], var_name_to_prev_var_name={"warm_new": "warm"})
    with tf.compat.v1.Session() as session:
      session.run(start)
      assert [session.run(var.size(i)) for i in range(3)] == [1, 1, 1]


def test_a_shadow_variable_has_the_rows_dtype_and_lets_its_rows_go_when_saved(request, tmp_path):
  name = _name(request)
  params = de.get_variable(name, value_dtype=tf.float16, dim=2, initializer=0.5)
  shadow = de.shadow_ops.ShadowVariable(params, name=name + "-shadow")
  assert shadow.dtype == tf.float16 and shadow.ids.dtype == tf.int64
  assert shadow.read_value().shape == (0, 2) and shadow.read_value().dtype == tf.float16
  keys = tf.constant([1, 2, 3], tf.int64)
  params.upsert(keys, tf.ones([3, 2], tf.float16))
  de.shadow_ops.embedding_lookup(shadow, keys)
  np.testing.assert_array_equal(shadow.read_value(), np.ones([3, 2]))

  module = tf.Module()
  module.params, module.shadow = params, shadow
  module.lookup = tf.function(
    lambda ids: de.shadow_ops.embedding_lookup(shadow, ids),
    input_signature=[tf.TensorSpec([None], tf.int64)],
  )
  prefix = tf.train.Checkpoint(module=module).save(str(tmp_path / "ckpt"))
  assert shadow.read_value().shape == (0, 2)  # TFRA clears the rows it holds when saving
  restored = de.shadow_ops.ShadowVariable(
    de.get_variable(name + "_r", value_dtype=tf.float16, dim=2)
  )
  again = tf.Module()
  again.params, again.shadow = restored.params, restored
  tf.train.Checkpoint(module=again).read(prefix).assert_existing_objects_matched()
  assert int(restored.params.size()) == 3
  # A SavedModel holds the float32 scalar it is to TensorFlow, and serves the rows.
  tf.saved_model.save(module, str(tmp_path / "saved"))
  loaded = tf.saved_model.load(str(tmp_path / "saved"))
  np.testing.assert_array_equal(loaded.lookup(tf.constant([2, 9], tf.int64)), [[1, 1], [0.5, 0.5]])


def test_a_cpu_the_process_lacks_is_its_cpu(request):
  var = de.get_variable(_name(request), dim=2, devices=["/CPU:0", "/CPU:1"])
  assert var.shard_num == 2
  var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
  assert [int(var.size(i)) for i in range(2)] == [1, 1]


def test_a_tf1_step_trains_tables_beside_dense_variables_without_gradients():
  """minimize() without var_list: every trainable variable, some not in the loss (as TFRA's)."""
  with tf.Graph().as_default():
    unused = tf.Variable([1.0, 2.0], name="unused")
    var = de.get_variable("minimized", dim=2, initializer=1.0)
    rows, _ = de.embedding_lookup(var, tf.constant([4], tf.int64), return_trainable=True)
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
    train = optimizer.minimize(tf.reduce_sum(rows * rows), global_step=step)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train)
      assert session.run(step) == 1 and session.run(var.size()) == 1
      np.testing.assert_array_equal(session.run(unused), [1.0, 2.0])

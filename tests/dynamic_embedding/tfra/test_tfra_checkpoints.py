"""TFRA checkpoints restore into tf_ext.tfra Variables, with no TFRA installed.

The fixtures (fixtures/README.md) were written by TFRA 0.7.2 itself, with what TFRA exported of
every Variable and slot, and one more TFRA training step: each restores with rows and slots
exact, and one more tf_ext step gives TFRA's next step (which proves the slot mapping and the
update count that stands for Adam's beta powers). The converter's checkpoints restore with
TensorFlow's own savers. Truncated and corrupt files are errors naming them that change nothing.
"""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

import tf_ext.tfra as de
from tf_ext.dynamic_embedding.tfra import checkpoints, convert

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
LEARNING_RATE = 0.05
TF1_VARIABLES = {
  "tf1/emb_adam": (1, ["m", "v"]),
  "tf1/emb_adagrad": (1, ["accumulator"]),
  "tf1/emb_momentum": (2, ["momentum"]),
}


def _tf1_optimizer(name):
  if name.endswith("adam"):
    return tf.compat.v1.train.AdamOptimizer(LEARNING_RATE)
  if name.endswith("adagrad"):
    return tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE, initial_accumulator_value=0.1)
  return tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, momentum=0.9)


def _fixture(name, *parts):
  return os.path.join(FIXTURES, name, *parts)


def _expected(name):
  return np.load(_fixture(name, "expected.npz"))


@pytest.fixture(autouse=True)
def _fresh_variable_store():
  # Each test makes Variables of the fixtures' names (de.get_variable refuses a second one).
  tf.compat.v1.reset_default_graph()
  yield


def _sorted(keys):
  keys = np.asarray(keys)
  return keys.astype(bytes) if keys.dtype == object else keys


def _assert_exact(expected, name, exports, slots):
  """The tables' exports ([(keys, values, slots, update_counts, last_steps, initial)]) hold
  exactly TFRA's rows and slots of the Variable `name`."""
  keys = _sorted(np.concatenate([e[0] for e in exports]))
  values = np.concatenate([e[1] for e in exports])
  slot_values = np.concatenate([e[2] for e in exports])
  want_keys = _sorted(expected[f"{name}/keys"])
  ours, theirs = np.argsort(keys), np.argsort(want_keys)
  np.testing.assert_array_equal(keys[ours], want_keys[theirs])
  np.testing.assert_array_equal(values[ours], expected[f"{name}/values"][theirs])
  dim = values.shape[1]
  assert slot_values.shape[1] == dim * len(slots)
  for index, slot in enumerate(slots):
    slot_keys = _sorted(expected[f"{name}/slot/{slot}/keys"])
    order = np.argsort(slot_keys)
    np.testing.assert_array_equal(slot_keys[order], want_keys[theirs])
    np.testing.assert_array_equal(
      slot_values[ours][:, index * dim : (index + 1) * dim],
      expected[f"{name}/slot/{slot}/values"][order],
    )


def _numpy_exports(variable):
  return [[t.numpy() for t in table.export_with_slots()] for table in variable.tables]


def _loss(rows, weights):
  return tf.reduce_sum(rows * weights) + 0.5 * tf.reduce_sum(rows * rows)


def _assert_next(expected, name, rows):
  np.testing.assert_allclose(rows, expected[f"{name}/next/values"], rtol=1e-5, atol=1e-6)


# ---- what the reader finds -----------------------------------------------------------------------


def _bytewise_crc(crc, data):
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc


def test_crc32c_matches_the_check_value_and_the_bytewise_loop():
  assert checkpoints.standard_crc32c(0, b"123456789") == 0xE3069283
  data = np.random.default_rng(1).integers(0, 256, 70001, dtype=np.uint8).tobytes()
  for size in (0, 1, 4095, 4096, 9999, 70001):
    crc = _bytewise_crc(0xDEADBEEF, data[:size])
    assert checkpoints.crc32c_extend(0xDEADBEEF, data[:size]) == crc


def test_the_reader_finds_tfra_tables_and_slots_by_their_names():
  tf1 = checkpoints.TfraCheckpoint(_fixture("tf1_saver"))
  assert tf1.kind == "saver"
  assert sorted(g.name for g in tf1.variables()) == [
    "tf1_emb_adagrad",
    "tf1_emb_adam",
    "tf1_emb_momentum",
  ]
  adam = tf1.group_of("tf1/emb_adam")
  assert [s.keys for s in adam.shards] == ["emb_adam/tf1_emb_adam_mht_1of1-keys"]
  assert sorted(tf1.slot_groups("tf1/emb_adam")["Adam"]) == ["m", "v"]
  assert len(tf1.group_of("tf1/emb_momentum").shards) == 2
  assert checkpoints.step_count(tf1) == 3  # beta1_power = 0.9 ** 4
  keras = checkpoints.TfraCheckpoint(_fixture("keras_weights", "weights"))
  group = keras.group_of("item_emb-parameter")
  assert group.exact and group.path == "emb/params"
  assert group.shards[0].keys == "emb/params/tables_of_item_emb-parameter/0/.ATTRIBUTES/table-keys"
  assert sorted(keras.slot_groups(group.name)) == ["DynamicEmbedding/item_emb-shadow"]
  described = checkpoints.describe(_fixture("eager_checkpoint"))
  assert described["variables"]["eager_user_emb"]["slots"] == {"user_shadow": ["m", "v"]}
  files = checkpoints.TfraCheckpoint(_fixture("file_system_saver", "kv"))
  assert files.kind == "files" and [g.name for g in files.variables()] == ["fs_emb"]
  assert checkpoints.TfraCheckpoint(_fixture("saved_model")).group_of("ad_emb-parameter")


# ---- restore_from_tfra ---------------------------------------------------------------------------


def test_tf1_saver_checkpoint_restores_exactly_and_trains_on_as_tfra():
  expected = _expected("tf1_saver")
  with tf.Graph().as_default():
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    weights = tf.compat.v1.placeholder(tf.float32, [None, 4])
    built = []
    for name, (shards, slots) in TF1_VARIABLES.items():
      var = de.get_variable(name, dim=4, devices=["/CPU:0"] * shards)
      rows, wrapper = de.embedding_lookup(
        var, ids, return_trainable=True, name=name.split("/")[-1] + "_lookup"
      )
      optimizer = _tf1_optimizer(name)
      train = de.DynamicEmbeddingOptimizer(optimizer).minimize(
        _loss(rows, weights), var_list=[wrapper]
      )
      built.append((name, var, optimizer, train, slots))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(tf.compat.v1.local_variables_initializer())
      for name, var, optimizer, _, slots in built:
        report = de.checkpoints.restore_from_tfra(
          _fixture("tf1_saver"), [var], optimizer, session=session
        )
        assert report[name]["rows"] == len(expected[f"{name}/keys"])
        assert report[name]["update_count"] == 3
        exports = [session.run(t.export_with_slots()) for t in var.tables]
        _assert_exact(expected, name, exports, slots)
        assert all((e[3] == 3).all() and (e[4] == 2).all() for e in exports)
        if name.endswith("adagrad"):
          np.testing.assert_array_equal(exports[0][5], np.float32([0.1]))
      for name, var, _, train, _ in built:
        feed = {ids: expected[f"{name}/next/ids"], weights: expected[f"{name}/next/weights"]}
        session.run(train, feed)
        _assert_next(expected, name, session.run(var.lookup(tf.constant(feed[ids]))))


def test_adam_needs_the_step_count_for_its_next_step():
  # Restored with update count 0 (as if tf_ext kept no step), Adam's next step is not TFRA's:
  # the bias correction at TFRA's step 4 is what the update count carries.
  expected = _expected("eager_checkpoint")
  name = "eager_user_emb"
  var = de.get_variable(name, key_dtype=tf.string, dim=4)
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  de.checkpoints.restore_from_tfra(_fixture("eager_checkpoint"), [var], optimizer, update_count=0)
  shadow = de.shadow_ops.ShadowVariable(var, name="user_shadow")
  ids = tf.constant(expected[f"{name}/next/ids"])
  with tf.GradientTape() as tape:
    loss = _loss(de.shadow_ops.embedding_lookup(shadow, ids), expected[f"{name}/next/weights"])
  optimizer.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))
  difference = np.abs(var.lookup(ids).numpy() - expected[f"{name}/next/values"]).max()
  assert difference > 1e-3


def _eager_next_step(expected, name, var, optimizer, shadow_name):
  shadow = de.shadow_ops.ShadowVariable(var, name=shadow_name)
  ids = tf.constant(expected[f"{name}/next/ids"])
  with tf.GradientTape() as tape:
    loss = _loss(de.shadow_ops.embedding_lookup(shadow, ids), expected[f"{name}/next/weights"])
  optimizer.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))
  _assert_next(expected, name, var.lookup(ids).numpy())
  exports = _numpy_exports(var)
  keys = _sorted(exports[0][0])
  where = {k: i for i, k in enumerate(keys.tolist())}
  rows = [where[k] for k in _sorted(expected[f"{name}/next/ids"]).tolist()]
  for index, slot in enumerate(["m", "v"]):
    np.testing.assert_allclose(
      exports[0][2][rows, index * 4 : (index + 1) * 4],
      expected[f"{name}/next/slot/{slot}"],
      rtol=1e-5,
      atol=1e-7,
    )


def test_eager_checkpoint_of_string_keys_restores_and_trains_on():
  expected = _expected("eager_checkpoint")
  name = "eager_user_emb"
  var = de.get_variable(name, key_dtype=tf.string, dim=4)
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  report = de.checkpoints.restore_from_tfra(_fixture("eager_checkpoint"), [var], optimizer)
  assert report[name]["kind"] == "adam" and report[name]["update_count"] == 3
  _assert_exact(expected, name, _numpy_exports(var), ["m", "v"])
  _eager_next_step(expected, name, var, optimizer, "user_shadow")


def test_keras_weights_restore_into_a_layer_and_train_on():
  expected = _expected("keras_weights")
  layer = de.keras.layers.Embedding(4, name="item_emb")
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  de.checkpoints.restore_from_tfra(_fixture("keras_weights", "weights"), None, optimizer)
  name = layer.params.name
  _assert_exact(expected, name, _numpy_exports(layer.params), ["m", "v"])
  ids = expected[f"{name}/next/ids"]
  with tf.GradientTape() as tape:
    loss = _loss(layer(tf.constant(ids)), expected[f"{name}/next/weights"])
  variables = layer.trainable_variables
  optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
  _assert_next(expected, name, layer.params.lookup(tf.constant(ids)).numpy())


def test_saved_model_restores():
  expected = _expected("saved_model")
  layer = de.keras.layers.Embedding(4, name="ad_emb")
  de.checkpoints.restore_from_tfra(_fixture("saved_model"), [layer.params])
  _assert_exact(expected, layer.params.name, _numpy_exports(layer.params), ["m", "v"])


@pytest.mark.parametrize("where", ["kv", "de_ckpt"])
def test_file_system_saver_files_restore_and_train_on(where):
  expected = _expected("file_system_saver")
  var = de.get_variable("fs_emb", dim=4)
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  # Key/value files keep no step: it is given; DECheckpoint's index has the optimizer's.
  steps = 3 if where == "kv" else None
  report = de.checkpoints.restore_from_tfra(
    _fixture("file_system_saver", where), [var], optimizer, update_count=steps
  )
  assert report["fs_emb"]["update_count"] == 3
  _assert_exact(expected, "fs_emb", _numpy_exports(var), ["m", "v"])
  _eager_next_step(expected, "fs_emb", var, optimizer, "fs_shadow")


def test_slots_in_another_order_missing_or_extra_are_joined_by_key(tmp_path):
  # A TF1-named checkpoint of TFRA's layout, written here: the slot's keys in another order,
  # one key without a slot row, one slot row without a key; read in chunks of 3 rows.
  keys = np.array([5, -2, 2**40, 7, 11, 13, 17], np.int64)
  rows = np.arange(28, dtype=np.float32).reshape(7, 4)
  slot_keys = np.array([13, 7, 99, 5, 2**40, 17, 11], np.int64)  # no -2; 99 has no row
  slot_rows = 100.0 + slot_keys[:, None].astype(np.float32) % 1000 * np.ones((1, 4), np.float32)
  tensors = {
    "emb/emb_mht_1of1-keys": keys,
    "emb/emb_mht_1of1-values": rows,
    "accumulator/emb_Adagrad_accumulator_mht_1of1-keys": slot_keys,
    "accumulator/emb_Adagrad_accumulator_mht_1of1-values": slot_rows,
    "global_step": np.int64(5),
  }
  prefix = str(tmp_path / "model")
  _save_tfra_layout(prefix, tensors)
  var = de.get_variable("emb", dim=4)
  optimizer = tf.keras.optimizers.Adagrad(initial_accumulator_value=0.25)
  report = de.checkpoints.restore_from_tfra(prefix, [var], optimizer, chunk_rows=3)
  assert report["emb"]["missing_slot_rows"] == 1 and report["emb"]["dropped_slot_rows"] == 1
  assert report["emb"]["update_count"] == 5
  got_keys, got_rows, got_slots, counts, _, initial = _numpy_exports(var)[0]
  order = np.argsort(got_keys)
  np.testing.assert_array_equal(got_keys[order], np.sort(keys))
  np.testing.assert_array_equal(got_rows[order], rows[np.argsort(keys)])
  by_key = dict(zip(slot_keys.tolist(), slot_rows))
  for key, slot in zip(got_keys.tolist(), got_slots):
    np.testing.assert_array_equal(slot, by_key.get(key, np.full(4, 0.25, np.float32)))
  np.testing.assert_array_equal(initial, np.float32([0.25]))
  assert (counts == 5).all()


def _save_tfra_layout(prefix, tensors):
  """A checkpoint of TFRA's TF1 layout, written here with SaveV2 ({name: numpy value})."""
  tf.raw_ops.SaveV2(
    prefix=prefix,
    tensor_names=list(tensors),
    shape_and_slices=[""] * len(tensors),
    tensors=[tf.constant(v) for v in tensors.values()],
  )


@pytest.mark.parametrize("value_dtype", [tf.float64, tf.float16, tf.int64])
def test_rows_of_other_dtypes_and_int32_keys_restore_exactly(tmp_path, value_dtype):
  keys = np.array([3, -9, 2**30, 12], np.int32)
  rows = np.array([[1e-300, -2.5], [7.0, 3.25], [0.1, -0.0], [65504.0, 1.0]])
  if value_dtype == tf.int64:
    rows = np.array([[2**62 + 1, -1], [7, 3], [0, -(2**63)], [5, 9]])
  rows = rows.astype(value_dtype.as_numpy_dtype)
  prefix = str(tmp_path / "model")
  _save_tfra_layout(prefix, {"ids/ids_mht_1of1-keys": keys, "ids/ids_mht_1of1-values": rows})
  var = de.get_variable("ids", key_dtype=tf.int32, value_dtype=value_dtype, dim=2)
  de.checkpoints.restore_from_tfra(prefix, [var])
  got = var.lookup(tf.constant(keys)).numpy()
  assert got.dtype == rows.dtype
  np.testing.assert_array_equal(got.view(np.uint8), rows.view(np.uint8))


def test_string_keys_stream_in_small_chunks():
  var = de.get_variable("eager_user_emb", key_dtype=tf.string, dim=4)
  de.checkpoints.restore_from_tfra(_fixture("eager_checkpoint"), [var], chunk_rows=7)
  _assert_exact(_expected("eager_checkpoint"), var.name, _numpy_exports(var), ["m", "v"])


def test_a_table_of_many_blocks_streams_and_joins_slots_by_key(tmp_path):
  # 40000 rows with Adam's slots: several 1 MiB blocks in each snapshot file; the v slot's rows
  # in another order are read by key, in runs of consecutive rows.
  rng = np.random.default_rng(3)
  keys = rng.permutation(np.unique(rng.integers(0, 2**40, 50000))[:40000]).astype(np.int64)
  rows, m, v = (rng.normal(size=(40000, 8)).astype(np.float32) for _ in range(3))
  order = np.concatenate([np.arange(20000, 40000), np.arange(20000)])
  _save_tfra_layout(
    str(tmp_path / "model"),
    {
      "big/big_mht_1of1-keys": keys,
      "big/big_mht_1of1-values": rows,
      "m/big_Adam_m_mht_1of1-keys": keys,
      "m/big_Adam_m_mht_1of1-values": m,
      "v/big_Adam_v_mht_1of1-keys": keys[order],
      "v/big_Adam_v_mht_1of1-values": v[order],
      "beta1_power": np.float32(0.9**11),
    },
  )
  var = de.get_variable("big", dim=8, devices=["/CPU:0"] * 2)
  report = de.checkpoints.restore_from_tfra(str(tmp_path / "model"), [var], chunk_rows=10000)
  assert report["big"]["update_count"] == 10 and report["big"]["kind"] == "adam"
  for index, (got_keys, got_rows, got_slots, counts, steps, _) in enumerate(_numpy_exports(var)):
    assert (np.mod(got_keys, 2) == index).all() and (counts == 10).all() and (steps == 9).all()
    where = np.searchsorted(np.sort(keys), got_keys)
    position = np.argsort(keys)[where]
    np.testing.assert_array_equal(got_rows, rows[position])
    np.testing.assert_array_equal(got_slots[:, :8], m[position])
    np.testing.assert_array_equal(got_slots[:, 8:], v[position])


def test_more_shards_than_tfra_had_route_by_the_partitioner():
  expected = _expected("tf1_saver")
  var = de.get_variable("tf1/emb_adam", dim=4, devices=["/CPU:0"] * 3)
  de.checkpoints.restore_from_tfra(_fixture("tf1_saver"), [var])
  exports = _numpy_exports(var)
  for index, export in enumerate(exports):
    assert (np.mod(export[0], 3) == index).all()
  _assert_exact(expected, "tf1/emb_adam", exports, ["m", "v"])


# ---- bad files ---------------------------------------------------------------------------------


def _copy(tmp_path, fixture):
  target = tmp_path / fixture
  shutil.copytree(_fixture(fixture), target)
  return target


def _damage(path, how, at=None):
  """Cuts the file at `at` (default: its middle), or flips a bit of the byte there."""
  with open(path, "r+b") as f:
    data = f.read()
    at = len(data) // 2 if at is None else at
    if how == "truncate":
      f.truncate(at)
    else:
      f.seek(at)
      f.write(bytes([data[at] ^ 0x40]))


@pytest.mark.parametrize("how", ["truncate", "corrupt"])
@pytest.mark.parametrize("fixture", ["tf1_saver", "eager_checkpoint"])
def test_a_damaged_checkpoint_is_data_loss_naming_it_and_changes_nothing(tmp_path, fixture, how):
  copy = _copy(tmp_path, fixture)
  data = next(p for p in os.listdir(copy) if p.endswith(".data-00000-of-00001"))
  # Inside the rows of the Variable restored (a restore reads only its Variables' tables).
  tensor = "emb_adam/tf1_emb_adam_mht_1of1-values"
  if fixture == "eager_checkpoint":
    tensor = "emb/tables_of_eager_user_emb/0/.ATTRIBUTES/table-keys"
  bundle = checkpoints.Bundle(str(copy / data.split(".data-")[0]))
  entry = bundle.entries[tensor]
  _damage(copy / data, how, entry.offset + entry.size // 2)
  if fixture == "tf1_saver":
    var = de.get_variable("tf1/emb_adam", dim=4)
  else:
    var = de.get_variable("eager_user_emb", key_dtype=tf.string, dim=4)
  keys = tf.constant([1, 2], tf.int64) if fixture == "tf1_saver" else tf.constant(["a", "b"])
  var.upsert(keys, tf.ones([2, 4]))
  before = _numpy_exports(var)
  with pytest.raises(tf.errors.DataLossError, match=data):
    de.checkpoints.restore_from_tfra(str(copy), [var])
  after = _numpy_exports(var)
  for old, new in zip(before[0], after[0]):
    np.testing.assert_array_equal(old, new)
  dst = tmp_path / "converted"
  assert convert.main([str(copy), str(dst), "--quiet"]) == 2
  assert not dst.exists()
  assert sorted(os.listdir(tmp_path)) == [fixture]  # no temporary directory left


@pytest.mark.parametrize("how", ["truncate", "corrupt"])
def test_a_damaged_index_is_data_loss_naming_it(tmp_path, how):
  copy = _copy(tmp_path, "keras_weights")
  _damage(copy / "weights.index", how)
  with pytest.raises(tf.errors.DataLossError, match="weights.index"):
    checkpoints.TfraCheckpoint(str(copy / "weights"))


def test_not_a_checkpoint_is_a_one_line_error_with_status_2(tmp_path, capsys):
  junk = tmp_path / "junk.bin"
  junk.write_bytes(b"not a checkpoint")
  assert convert.main([str(junk), str(tmp_path / "out")]) == 2
  error = capsys.readouterr().err.strip()
  assert error.count("\n") == 0 and "junk.bin" in error
  assert not (tmp_path / "out").exists()


def test_truncated_file_system_saver_files_are_data_loss(tmp_path):
  copy = _copy(tmp_path, "file_system_saver")
  _damage(copy / "kv" / "fs_emb_mht_1of1_rank0_size1-values", "truncate")
  var = de.get_variable("fs_emb", dim=4)
  with pytest.raises(tf.errors.DataLossError, match="fs_emb_mht_1of1_rank0_size1-values"):
    de.checkpoints.restore_from_tfra(str(copy / "kv"), [var])
  assert int(var.size()) == 0


# ---- the converter -------------------------------------------------------------------------------


def test_converted_tf1_checkpoint_restores_with_saver(tmp_path, capsys):
  dst = tmp_path / "native"
  assert convert.main([_fixture("tf1_saver"), str(dst)]) == 0
  expected = _expected("tf1_saver")
  total = sum(len(expected[f"{name}/keys"]) for name in TF1_VARIABLES)
  assert f"{total}/{total}" in capsys.readouterr().err.replace(" ", "")  # progress: done/total
  with tf.Graph().as_default():
    variables = {
      name: de.get_variable(name, dim=4, devices=["/CPU:0"] * shards)
      for name, (shards, _) in TF1_VARIABLES.items()
    }
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      saver.restore(session, tf.train.latest_checkpoint(str(dst)))
      for name, var in variables.items():
        exports = [session.run(t.export_with_slots()) for t in var.tables]
        _assert_exact(expected, name, exports, TF1_VARIABLES[name][1])
        assert all((e[3] == 3).all() for e in exports)


def test_converted_object_checkpoint_restores_with_tf_train_checkpoint(tmp_path):
  dst = tmp_path / "native"
  prefix = convert.convert(_fixture("eager_checkpoint"), str(dst), progress=False)
  var = de.get_variable("eager_user_emb", key_dtype=tf.string, dim=4)
  optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  tf.train.Checkpoint(emb=var, optimizer=optimizer).restore(prefix)
  expected = _expected("eager_checkpoint")
  _assert_exact(expected, "eager_user_emb", _numpy_exports(var), ["m", "v"])
  assert int(optimizer.iterations.numpy()) == 3
  # TFRA's slot Variables and shadow state are out of the object graph.
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  names = [c.local_name for n in graph.nodes for c in n.children]
  assert "tables" in names and not any("tables_of_" in n or "/" in n for n in names)
  _eager_next_step(expected, "eager_user_emb", var, optimizer, "user_shadow")


class _KerasModel(tf.keras.Model):
  def __init__(self):
    super().__init__()
    self.emb = de.keras.layers.Embedding(4, name="item_emb")
    self.dense = tf.keras.layers.Dense(1)

  def call(self, ids):
    return self.dense(tf.reduce_sum(self.emb(ids), 1))


def test_converted_keras_weights_load_into_a_tf_ext_model(tmp_path):
  prefix = convert.convert(
    _fixture("keras_weights", "weights"), str(tmp_path / "n"), progress=False
  )
  model = _KerasModel()
  model(tf.constant([[1, 2]], tf.int64))
  model.load_weights(prefix)
  _assert_exact(
    _expected("keras_weights"), "item_emb-parameter", _numpy_exports(model.emb.params), ["m", "v"]
  )
  reader = tf.train.load_checkpoint(_fixture("keras_weights", "weights"))
  np.testing.assert_array_equal(
    model.dense.kernel.numpy(), reader.get_tensor("dense/kernel/.ATTRIBUTES/VARIABLE_VALUE")
  )


@pytest.mark.parametrize("source", [("saved_model",), ("file_system_saver", "de_ckpt")])
def test_other_sources_convert_and_restore(tmp_path, source):
  prefix = convert.convert(_fixture(*source), str(tmp_path / "n"), progress=False)
  name = "ad_emb-parameter" if source[0] == "saved_model" else "fs_emb"
  var = de.Variable(name=name, dim=4)
  root = tf.train.Checkpoint()
  # Attach the Variable where the checkpoint has it (a layer's params, or the root's emb).
  if source[0] == "saved_model":
    layer = tf.Module()
    layer.params = var
    setattr(root, "layer_with_weights-0", layer)
  else:
    root.emb = var
  root.restore(prefix).expect_partial()
  _assert_exact(_expected(source[0]), name, _numpy_exports(var), ["m", "v"])


def test_the_converter_refuses_an_existing_destination(tmp_path):
  dst = tmp_path / "native"
  dst.mkdir()
  assert convert.main([_fixture("tf1_saver"), str(dst), "--quiet"]) == 2
  assert os.listdir(dst) == []

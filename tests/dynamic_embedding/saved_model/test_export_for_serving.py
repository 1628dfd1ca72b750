"""tf_ext.saved_model: SavedModels of core TensorFlow ops only, served by plain TensorFlow in a
process where tf_ext cannot be imported, by `saved_model_cli run`, and by TensorFlow's C API (the
C++ loader and session that tensorflow_model_server embeds)."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from _keras_models import two_table_model
from tensorflow.core.protobuf import saved_model_pb2

import tf_ext
from tf_ext.saved_model import saved_model_files, serving

# The child process must not reach tf_ext, neither this checkout nor the editable install.
_NO_TF_EXT = """
import sys
sys.modules["tf_ext"] = None  # `import tf_ext` raises ImportError from here on
import tensorflow as tf
from tensorflow.python.framework import op_def_registry
try:
  import tf_ext
  raise AssertionError("tf_ext was importable")
except ImportError:
  pass
"""


def run_without_tf_ext(code):
  """Runs `code` in a fresh Python where importing tf_ext fails; returns its last stdout line
  parsed as JSON. It also checks that no tf_ext op was registered there."""
  check = '\nassert op_def_registry.get("TfExtTableFind") is None\n'
  script = _NO_TF_EXT + textwrap.dedent(code) + check
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("PYTHONPATH", None)
  proc = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def c_api_serve(tmp_path_factory):
  """c_api_serve.c built against this TensorFlow's C library: serves a SavedModel in the C++
  runtime that tensorflow_model_server embeds, with no Python and no tf_ext."""
  binary = str(tmp_path_factory.mktemp("c_api") / "c_api_serve")
  lib = tf.sysconfig.get_lib()
  subprocess.run(
    [
      "cc",
      "-O1",
      "-I" + tf.sysconfig.get_include(),
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "c_api_serve.c"),
      "-o",
      binary,
      "-L" + lib,
      "-l:libtensorflow_cc.so.2",
      "-l:libtensorflow_framework.so.2",
      "-Wl,-rpath," + lib,
    ],
    check=True,
    capture_output=True,
  )

  def serve(export, signature, output, **inputs):
    """Runs `signature` of `export` on inputs {name: (dtype, columns, values)}; the floats."""
    tensors = serving_tensors(export, signature)
    feeds = [
      f"{tensors[name]}={dtype}:{columns}:{','.join(str(v) for v in values)}"
      for name, (dtype, columns, values) in inputs.items()
    ]
    proc = subprocess.run(
      [binary, export, tensors[output], *feeds],
      capture_output=True,
      text=True,
      timeout=120,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return np.array([float(v) for v in proc.stdout.split()], np.float32)

  return serve


def serving_tensors(export, signature):
  """{input or output name: graph tensor name} of a signature of a SavedModel's serve graph."""
  proto = saved_model_pb2.SavedModel()
  with open(os.path.join(export, "saved_model.pb"), "rb") as f:
    proto.ParseFromString(f.read())
  (meta_graph,) = [m for m in proto.meta_graphs if "serve" in m.meta_info_def.tags]
  found = meta_graph.signature_def[signature]
  return {name: info.name for name, info in [*found.inputs.items(), *found.outputs.items()]}


@pytest.fixture(scope="module")
def model():
  return two_table_model(city_initializer=0.5, output_name="click")


TRAINED = {"ids": [1, 2, 3, 42], "city": [b"c1", b"c7", b"c3", b"c19"]}


def test_keras_model_served_without_tf_ext_matches(model, tmp_path, c_api_serve):
  export = str(tmp_path / "serving")
  rows = tf_ext.saved_model.export_for_serving(model, export)
  assert rows == {"ids_emb": 100, "city_emb": 20}
  assert saved_model_files._tf_ext_ops_in(export) == []  # pylint: disable=protected-access
  expected = model.predict({k: np.array(v) for k, v in TRAINED.items()}, verbose=0)
  served = run_without_tf_ext(f"""
    import json
    loaded = tf.saved_model.load({export!r})
    signature = loaded.signatures["serving_default"]
    ids, city = tf.constant({TRAINED["ids"]}, tf.int64), tf.constant({TRAINED["city"]})
    out = signature(ids=ids, city=city)
    print(json.dumps(out["click"].numpy().tolist()))
  """)
  np.testing.assert_allclose(np.array(served), expected, rtol=1e-6, atol=1e-7)
  cities = [c.decode() for c in TRAINED["city"]]
  served = c_api_serve(
    export, "serving_default", "click", ids=("int64", 0, TRAINED["ids"]), city=("string", 0, cities)
  )
  np.testing.assert_allclose(served, expected.ravel(), rtol=1e-6, atol=1e-7)


def test_saved_model_cli_runs_the_exported_signature(model, tmp_path):
  export = str(tmp_path / "serving")
  tf_ext.saved_model.export_for_serving(model, export)
  expected = model.predict({k: np.array(v) for k, v in TRAINED.items()}, verbose=0)
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  city = "[" + ",".join(f'b"{c.decode()}"' for c in TRAINED["city"]) + "]"
  proc = subprocess.run(
    [
      cli,
      "run",
      "--dir",
      export,
      "--tag_set",
      "serve",
      "--signature_def",
      "serving_default",
      "--input_exprs",
      f"ids={TRAINED['ids']};city={city}",
    ],
    capture_output=True,
    text=True,
    timeout=240,
    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  printed = proc.stdout.split("Result for output key click:")[1]
  values = [float(v) for v in re.findall(r"[-+]?\d*\.\d+(?:e[-+]?\d+)?", printed)]
  np.testing.assert_allclose(values, expected.ravel(), rtol=1e-5)


def test_module_rows_exact_and_unseen_ids_read_the_default_row(model, tmp_path):
  ids_table = model.get_layer("ids_emb").table
  city_table = model.get_layer("city_emb").table

  class Rows(tf.Module):
    def __init__(self):
      super().__init__()
      self.ids_table, self.city_table = ids_table, city_table

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64)])
    def ids_rows(self, ids):
      return self.ids_table.lookup(ids)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def city_rows(self, city):
      return {"rows": tf_ext.embedding_lookup(self.city_table, city)}

  module = Rows()
  export = str(tmp_path / "rows")
  tf_ext.saved_model.export_for_serving(
    module, export, signatures={"ids": module.ids_rows, "city": module.city_rows}
  )
  unseen = 10**15
  served = run_without_tf_ext(f"""
    import json
    loaded = tf.saved_model.load({export!r})
    ids = loaded.ids_rows(tf.constant([[1, 2], [3, {unseen}]], tf.int64))  # methods stay callable
    city = loaded.signatures["city"](city=tf.constant([b"c1", b"never seen"]))["rows"]
    print(json.dumps({{"ids": ids.numpy().tolist(), "city": city.numpy().tolist()}}))
  """)
  ids = np.array(served["ids"], np.float32)
  assert ids.shape == (2, 2, 4)
  np.testing.assert_array_equal(ids[0], ids_table.lookup([1, 2]).numpy())  # trained: exact
  np.testing.assert_array_equal(ids[1, 0], ids_table.lookup([3]).numpy()[0])
  np.testing.assert_array_equal(ids[1, 1], np.zeros(4))  # normal(0, .05): its mean
  city = np.array(served["city"], np.float32)
  np.testing.assert_array_equal(city[0], city_table.lookup([b"c1"]).numpy()[0])
  np.testing.assert_array_equal(city[1], np.full(4, 0.5))  # constant initializer: the constant


def test_sharded_table_exports_whole(tmp_path, c_api_serve):
  table = tf_ext.get_dynamic_embedding_variable("sharded_rows", 2, num_shards=3, initializer=-1.0)
  keys = np.arange(30, dtype=np.int64)
  table.insert(keys, np.stack([keys, -keys], 1).astype(np.float32))

  class Rows(tf.Module):
    def __init__(self):
      super().__init__()
      self.table = table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def rows(self, ids):
      return {"rows": self.table.lookup(ids)}

  export = str(tmp_path / "sharded")
  assert tf_ext.saved_model.export_for_serving(Rows(), export) == {"sharded_rows": 30}
  served = c_api_serve(export, "serving_default", "rows", ids=("int64", 0, [5, 29, 1000]))
  np.testing.assert_array_equal(served, [5, -5, 29, -29, -1, -1])


def test_default_row_is_the_initializer_mean():
  def row(initializer):
    table = tf_ext.DynamicEmbeddingVariable("t", 3, initializer=initializer)
    return serving.default_row(table).tolist()

  assert row(None) == [0.0] * 3  # uniform(-0.05, 0.05)
  assert row(tf.keras.initializers.RandomUniform(0.1, 0.3)) == pytest.approx([0.2] * 3)
  assert row(tf.keras.initializers.RandomNormal(1.5, 0.1)) == [1.5] * 3
  assert row(2.0) == [2.0] * 3
  assert row("zeros") == [0.0] * 3


def test_string_table_fed_int64_is_a_clear_error(model, tmp_path):
  city_table = model.get_layer("city_emb").table

  class Wrong(tf.Module):
    def __init__(self):
      super().__init__()
      self.table = city_table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def rows(self, city):
      return self.table.lookup(city)

  with pytest.raises(tf.errors.InvalidArgumentError, match=r"city_emb.*feeds int64.*string"):
    tf_ext.saved_model.export_for_serving(Wrong(), str(tmp_path / "wrong"))
  assert not os.path.exists(tmp_path / "wrong" / "saved_model.pb")


def test_a_tf_function_set_on_a_plain_module_is_its_default_signature(model, tmp_path):
  table = model.get_layer("ids_emb").table
  module = tf.Module()
  module.table = table
  module.serve = tf.function(table.lookup, input_signature=[tf.TensorSpec([None], tf.int64)])
  export = str(tmp_path / "plain")
  tf_ext.saved_model.export_for_serving(module, export)
  served = run_without_tf_ext(f"""
    import json
    serve = tf.saved_model.load({export!r}).signatures["serving_default"]
    rows = serve(ids=tf.constant([1, 2], tf.int64))
    print(json.dumps(list(rows.values())[0].numpy().tolist()))
  """)
  np.testing.assert_array_equal(np.array(served, np.float32), table.lookup([1, 2]).numpy())


def test_signature_choices_are_checked(model, tmp_path):
  table = model.get_layer("ids_emb").table

  class Two(tf.Module):
    def __init__(self):
      super().__init__()
      self.table = table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def a(self, ids):
      return self.table.lookup(ids)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def b(self, ids):
      return self.table.lookup(ids)

    @tf.function
    def unsigned(self, ids):
      return self.table.lookup(ids)

  two = Two()
  with pytest.raises(ValueError, match=r"pass signatures=.*2 tf.functions"):
    tf_ext.saved_model.export_for_serving(two, str(tmp_path / "x"))
  with pytest.raises(TypeError, match="tf.function itself rather than a concrete function"):
    tf_ext.saved_model.export_for_serving(two, str(tmp_path / "x"), two.a.get_concrete_function())
  with pytest.raises(ValueError, match="without an input_signature"):
    tf_ext.saved_model.export_for_serving(two, str(tmp_path / "x"), two.unsigned)
  estimator = tf.estimator.LinearClassifier([tf.feature_column.numeric_column("x")])
  with pytest.raises(TypeError, match="export_estimator_for_serving"):
    tf_ext.saved_model.export_for_serving(estimator, str(tmp_path / "x"))


def test_estimator_without_checkpoint_is_a_clear_error(tmp_path):
  estimator = tf.estimator.LinearClassifier(
    [tf.feature_column.numeric_column("x")], model_dir=str(tmp_path / "never_trained")
  )
  with pytest.raises(ValueError, match="no checkpoint in .*never_trained; train the Estimator"):
    tf_ext.saved_model.export_estimator_for_serving(estimator, str(tmp_path / "x"), lambda: None)


@pytest.mark.parametrize("num_shards", [None, 2])
def test_estimator_custom_model_fn_served_without_tf_ext(tmp_path, c_api_serve, num_shards):
  """A TF1 model_fn over input_layer (tables made by get-or-create in a variable scope), with a
  plain and with a sharded table."""
  user = tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("user", tf.string)
  column = tf_ext.feature_column.dynamic_embedding_column(
    user, 4, initializer=0.25, num_shards=num_shards
  )

  def model_fn(features, labels, mode):
    with tf.compat.v1.variable_scope("tower"):
      net = tf.compat.v1.feature_column.input_layer(features, [column])
      logits = tf.compat.v1.layers.dense(net, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.5))
    step = tf.compat.v1.train.get_or_create_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, step))

  users = np.array([[b"u%d" % i] for i in range(50)])
  labels = np.array([[i % 2] for i in range(50)], np.float32)
  estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
  estimator.train(
    lambda: tf.data.Dataset.from_tensor_slices(({"user": users}, labels)).repeat(4).batch(10)
  )

  def serving_input():
    user = tf.compat.v1.placeholder(tf.string, [None, 1], name="user")
    return tf.estimator.export.ServingInputReceiver({"user": user}, {"user": user})

  export = tf_ext.saved_model.export_estimator_for_serving(
    estimator, str(tmp_path / "export"), serving_input
  ).decode()
  query = [[b"u1"], [b"u2"], [b"never seen"]]
  expected = [
    p["logits"][0]
    for p in estimator.predict(lambda: tf.data.Dataset.from_tensors({"user": np.array(query)}))
  ]
  served = run_without_tf_ext(f"""
    import json
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], {export!r})
      signature = meta.signature_def["serving_default"]
      out = sess.run(signature.outputs["logits"].name, {{signature.inputs["user"].name: {query}}})
    print(json.dumps(out.ravel().tolist()))
  """)
  # Trained ids read their rows exactly; the unseen one reads 0.25 (the constant initializer),
  # as Estimator.predict does.
  np.testing.assert_allclose(served, expected, rtol=1e-6)
  users = [u[0].decode() for u in query]
  served = c_api_serve(export, "serving_default", "logits", user=("string", 1, users))
  np.testing.assert_allclose(served, expected, rtol=1e-6)


# ---- streamed rows ------------------------------------------------------------------------------


def _varint(data, pos):
  value, shift = 0, 0
  while True:
    byte = data[pos]
    value |= (byte & 0x7F) << shift
    pos, shift = pos + 1, shift + 7
    if byte < 0x80:
      return value, pos


def _block_entries(data, offset, size):
  """The (key, value) pairs of an uncompressed block of TensorFlow's table format (the
  LevelDB one a bundle's index is written in)."""
  block = data[offset : offset + size]
  assert data[offset + size] == 0, "a compressed index block"
  restarts = int.from_bytes(block[-4:], "little")
  end, pos, key = len(block) - 4 - 4 * restarts, 0, b""
  while pos < end:
    shared, pos = _varint(block, pos)
    unshared, pos = _varint(block, pos)
    value_size, pos = _varint(block, pos)
    key = key[:shared] + block[pos : pos + unshared]
    pos += unshared
    yield key, block[pos : pos + value_size]
    pos += value_size


def bundle_slices(prefix):
  """{tensor name: how many slices the bundle holds it in (0: whole)}, from its index."""
  from tensorflow.core.protobuf import tensor_bundle_pb2

  with open(prefix + ".index", "rb") as f:
    data = f.read()
  footer = data[-48:]
  _, pos = _varint(footer, _varint(footer, 0)[1])  # skips the metaindex handle
  index_offset, pos = _varint(footer, pos)
  index_size, _ = _varint(footer, pos)
  slices = {}
  for _, handle in _block_entries(data, index_offset, index_size):
    offset, pos = _varint(handle, 0)
    for key, value in _block_entries(data, offset, _varint(handle, pos)[0]):
      if key and key[0] != 0:  # the header's key is empty; a slice's starts with byte 0
        slices[key.decode()] = len(tensor_bundle_pb2.BundleEntryProto.FromString(value).slices)
  return slices


def test_streaming_refuses_a_string_table_it_cannot_write_readably(tmp_path):
  """RestoreV2 misreads string tensors written in slices, so the streaming op refuses string ids
  (the export writes those tables whole) and leaves no bundle behind."""
  table = tf_ext.DynamicEmbeddingVariable("streamed_strings", 2, key_dtype=tf.string)
  table.insert(tf.constant(["a", "b"]), tf.ones([2, 2]))
  prefix = str(tmp_path / "bundle")
  with pytest.raises(tf.errors.UnimplementedError, match="'streamed_strings'.*string ids"):
    tf_ext._ops_loader.load().tf_ext_table_write_serving_bundle(
      table.resource_handle, prefix, "keys", "values", 0, -1
    )
  assert not any(name.startswith("bundle") for name in os.listdir(tmp_path))


def test_rows_are_streamed_in_slices_and_served_exactly(tmp_path, monkeypatch):
  dim, chunk_rows = 3, 100
  monkeypatch.setenv("TF_EXT_SERVING_EXPORT_CHUNK_BYTES", str(chunk_rows * (8 + 4 * dim)))

  def no_whole_copy(table, name=None):
    raise AssertionError(f"{table.name}: the serving export copied the table whole")

  rng = np.random.default_rng(3)
  plain = tf_ext.DynamicEmbeddingVariable("streamed_plain", dim, initializer=0.25)
  plain_keys = rng.choice(10**12, 1050, replace=False)
  plain.insert(plain_keys, rng.normal(size=(1050, dim)).astype(np.float32))
  split = tf_ext.get_dynamic_embedding_variable("streamed_sharded", dim, num_shards=3)
  split_keys = np.arange(500, dtype=np.int64) * 7
  split.insert(split_keys, rng.normal(size=(500, dim)).astype(np.float32))
  empty = tf_ext.DynamicEmbeddingVariable("streamed_empty", dim, initializer=-2.0)
  expected = {
    "plain": plain.lookup(plain_keys).numpy(),
    "sharded": split.lookup(split_keys).numpy(),
    "empty": np.full([3, dim], -2.0, np.float32),
  }

  class Rows(tf.Module):
    def __init__(self):
      super().__init__()
      self.tables = [plain, split, empty]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def rows(self, ids):
      return {name: table.lookup(ids) for name, table in zip(expected, self.tables)}

  monkeypatch.setattr(tf_ext.DynamicEmbeddingVariable, "export", no_whole_copy)
  export = str(tmp_path / "streamed")
  exported = tf_ext.saved_model.export_for_serving(Rows(), export)
  assert exported == {"streamed_plain": 1050, "streamed_sharded": 500, "streamed_empty": 0}

  shard_rows = [int(shard.size()) for shard in split.shards]
  slices_by_rows = {
    1050: -(-1050 // chunk_rows),
    500: sum(-(-rows // chunk_rows) for rows in shard_rows),
    0: 0,
  }
  prefix = os.path.join(export, "variables", "variables")
  shapes = dict(tf.train.list_variables(prefix))
  slices = bundle_slices(prefix)
  tables = [name[: -len("keys")] for name in shapes if name.endswith("/table-keys")]
  assert len(tables) == 3
  for table in tables:
    rows = shapes[table + "keys"][0]
    assert shapes[table + "values"] == [rows, dim]
    assert slices[table + "keys"] == slices[table + "values"] == slices_by_rows[rows]

  served = run_without_tf_ext(f"""
    import json
    rows = tf.saved_model.load({export!r}).signatures["serving_default"]
    answers = {{}}
    for name, keys in [("plain", {plain_keys.tolist()}), ("sharded", {split_keys.tolist()}),
                       ("empty", [1, 2, 3])]:
      answers[name] = rows(ids=tf.constant(keys, tf.int64))[name].numpy().tolist()
    print(json.dumps(answers))
  """)
  for name, rows in expected.items():
    np.testing.assert_array_equal(np.array(served[name], np.float32), rows, err_msg=name)


@pytest.mark.parametrize("num_shards", [None, 2])
def test_estimator_rows_are_streamed_in_slices(tmp_path, monkeypatch, num_shards):
  """export_estimator_for_serving streams an int64-keyed table too, a sharded one by ranges."""
  chunk_rows = 8
  monkeypatch.setenv("TF_EXT_SERVING_EXPORT_CHUNK_BYTES", str(chunk_rows * (8 + 4 * 2)))
  item = tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("item", tf.int64)
  column = tf_ext.feature_column.dynamic_embedding_column(item, 2, num_shards=num_shards)

  def model_fn(features, labels, mode):
    logits = tf.reduce_sum(tf.compat.v1.feature_column.input_layer(features, [column]), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    step = tf.compat.v1.train.get_or_create_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, step))

  items = np.arange(60, dtype=np.int64).reshape(-1, 1) * 11
  labels = np.arange(60, dtype=np.float32) / 60
  estimator = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "model"))
  estimator.train(lambda: tf.data.Dataset.from_tensor_slices(({"item": items}, labels)).batch(20))

  def serving_input():
    item = tf.compat.v1.placeholder(tf.int64, [None, 1], name="item")
    return tf.estimator.export.ServingInputReceiver({"item": item}, {"item": item})

  def no_whole_copy(table, name=None):
    raise AssertionError(f"{table.name}: the serving export copied the table whole")

  monkeypatch.setattr(tf_ext.DynamicEmbeddingVariable, "export", no_whole_copy)
  export = tf_ext.saved_model.export_estimator_for_serving(
    estimator, str(tmp_path / "export"), serving_input
  ).decode()
  prefix = os.path.join(export, "variables", "variables")
  shapes = dict(tf.train.list_variables(prefix))
  (keys,) = [name for name in shapes if name.endswith("-keys")]
  assert shapes[keys] == [60]
  assert bundle_slices(prefix)[keys] >= 60 // chunk_rows  # a shard's last slice may be short
  expected = [
    p["logits"] for p in estimator.predict(lambda: tf.data.Dataset.from_tensors({"item": items}))
  ]
  served = run_without_tf_ext(f"""
    import json
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], {export!r})
      signature = meta.signature_def["serving_default"]
      out = sess.run(signature.outputs["logits"].name,
                     {{signature.inputs["item"].name: {items.tolist()}}})
    print(json.dumps(out.ravel().tolist()))
  """)
  np.testing.assert_allclose(served, expected, rtol=1e-6)

"""The public API: get-or-create, table operations, initializers, placement, library loading."""

import os

import numpy as np
import pytest
import tensorflow as tf
from _subprocess import ROOT, run_python

import tf_ext


def test_get_or_create_by_name_with_variable_scope_reuse():
  with tf.Graph().as_default():
    with tf.compat.v1.variable_scope("tower"):
      a = tf_ext.get_dynamic_embedding_variable("user", 8)
    with tf.compat.v1.variable_scope("tower", reuse=True):
      b = tf_ext.get_dynamic_embedding_variable("user", 8)
    with tf.compat.v1.variable_scope("other"):
      c = tf_ext.get_dynamic_embedding_variable("user", 8)
    assert a is b and a is not c
    assert a.name == "tower/user" and c.name == "other/user"
    with (
      tf.compat.v1.variable_scope("tower"),
      pytest.raises(tf.errors.InvalidArgumentError, match="'tower/user'.*dim 8"),
    ):
      tf_ext.get_dynamic_embedding_variable("user", 16)
  with tf.Graph().as_default():  # another graph: another table
    assert tf_ext.get_dynamic_embedding_variable("tower/user", 8) is not a


def test_functional_form_reuses_the_table():
  a = tf_ext.dynamic_embedding(tf.constant([1, 2]), 4, name="functional")
  b = tf_ext.dynamic_embedding(tf.constant([[1], [2]]), 4, name="functional")
  np.testing.assert_array_equal(a.numpy(), b.numpy()[:, 0])


def test_table_operations():
  t = tf_ext.DynamicEmbeddingVariable("ops", 3, initializer="zeros")
  assert int(t.size()) == 0
  empty_bytes = int(t.memory_bytes())
  t.insert([[1, 2], [3, 4]], np.arange(12, dtype=np.float32).reshape(2, 2, 3))
  assert int(t.size()) == 4
  assert int(t.memory_bytes()) > empty_bytes
  np.testing.assert_array_equal(t.lookup([4, 1, 99]).numpy(), [[9, 10, 11], [0, 1, 2], [0, 0, 0]])
  assert int(t.size()) == 4  # the lookup of 99 inserted nothing
  t.remove([1, 99])
  keys, values = (x.numpy() for x in t.export())
  assert sorted(keys) == [2, 3, 4]
  np.testing.assert_array_equal(values[np.argsort(keys)][0], [3, 4, 5])
  t.insert([2, 2], [[1, 1, 1], [2, 2, 2]])  # duplicates in one insert: the last wins
  np.testing.assert_array_equal(t.lookup([2]).numpy(), [[2, 2, 2]])
  t.clear()
  assert int(t.size()) == 0
  assert t.lookup(tf.zeros([0, 5], tf.int64)).shape == (0, 5, 3)


def test_memory_grows_with_ids_and_is_reused_after_removal():
  t = tf_ext.DynamicEmbeddingVariable("mem", 64, initializer="zeros")
  rows = np.ones([50_000, 64], np.float32)
  t.insert(np.arange(50_000), rows)
  full = int(t.memory_bytes())
  assert full / (50_000 * (8 + 64 * 4)) < 1.3  # bytes per entry over the raw key + row
  t.remove(np.arange(50_000))
  t.insert(np.arange(50_000), rows)
  after_one_cycle = int(t.memory_bytes())  # + the free-id lists' capacity (4 B per id)
  assert after_one_cycle <= full + 50_000 * 4 * 2
  t.remove(np.arange(50_000))
  t.insert(np.arange(50_000), rows)
  assert int(t.memory_bytes()) == after_one_cycle  # same ids, same shards: exact reuse
  t.remove(np.arange(50_000))
  t.insert(np.arange(50_000, 100_000), rows)
  # Other ids spread a little differently over the shards, so a few shards need a new chunk and
  # the arena may add one slab (an eighth of its size); without reuse it would double.
  assert int(t.memory_bytes()) <= full * 1.15


@pytest.mark.parametrize(
  "initializer,check",
  [
    ("zeros", lambda v: np.all(v == 0)),
    (0.5, lambda v: np.all(v == 0.5)),
    (tf.keras.initializers.Constant(-2.0), lambda v: np.all(v == -2.0)),
    (
      tf.keras.initializers.RandomUniform(-0.1, 0.3, seed=4),
      lambda v: v.min() >= -0.1 and v.max() < 0.3 and abs(v.mean() - 0.1) < 0.01,
    ),
    (
      tf.compat.v1.random_normal_initializer(1.0, 0.5, seed=1),
      lambda v: abs(v.mean() - 1) < 0.02 and abs(v.std() - 0.5) < 0.02,
    ),
    (
      tf.keras.initializers.TruncatedNormal(0.0, 1.0, seed=2),
      lambda v: np.abs(v).max() <= 2.0 and abs(v.std() - 0.88) < 0.03,
    ),
  ],
)
def test_initializers_are_deterministic_per_key_and_seed(initializer, check):
  t = tf_ext.DynamicEmbeddingVariable("init", 64, initializer=initializer)
  ids = np.arange(1000) * 7919
  rows = t.lookup(ids).numpy()
  assert check(rows)
  shuffled = np.random.default_rng(0).permutation(len(ids))
  np.testing.assert_array_equal(t.lookup(ids[shuffled]).numpy(), rows[shuffled])  # order-free
  np.testing.assert_array_equal(t.lookup(ids[:5]).numpy(), rows[:5])  # batch-free
  again = tf_ext.DynamicEmbeddingVariable("init_again", 64, initializer=initializer)
  np.testing.assert_array_equal(again.lookup(ids).numpy(), rows)


def test_seed_changes_initial_rows_and_training_starts_from_them():
  a = tf_ext.DynamicEmbeddingVariable(
    "seed_a", 8, initializer=tf.keras.initializers.RandomNormal(seed=1)
  )
  b = tf_ext.DynamicEmbeddingVariable(
    "seed_b", 8, initializer=tf.keras.initializers.RandomNormal(seed=2)
  )
  assert not np.allclose(a.lookup([5]).numpy(), b.lookup([5]).numpy())
  before = a.lookup([5]).numpy()
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))
  opt.apply_gradients(
    [(tf.IndexedSlices(tf.ones([1, 8]), tf.constant([5], tf.int64)), a.gradient_anchor)]
  )
  np.testing.assert_allclose(a.lookup([5]).numpy(), before - 1.0, rtol=1e-6)


def test_device_placement():
  with tf.device("/cpu:0"):
    t = tf_ext.DynamicEmbeddingVariable("placed", 4)
  assert t.device.endswith("CPU:0")
  with tf.Graph().as_default():
    with tf.device("/job:ps/task:0"):
      g = tf_ext.get_dynamic_embedding_variable("ps_table", 4)
    assert g.resource_handle.device == "/job:ps/task:0"
    assert g.lookup([1]).device == "/job:ps/task:0"


def test_keras_layer_config_round_trip():
  layer = tf_ext.keras.layers.DynamicEmbedding(
    6, key_dtype=tf.string, combiner="mean", initializer=tf.keras.initializers.RandomUniform(seed=3)
  )
  clone = tf_ext.keras.layers.DynamicEmbedding.from_config(layer.get_config())
  assert clone.get_config() == layer.get_config()
  ragged = tf.ragged.constant([["a", "b"], [], ["c"]])
  np.testing.assert_array_equal(layer(ragged).shape, [3, 6])
  np.testing.assert_array_equal(layer(ragged)[1].numpy(), np.zeros(6))


def test_library_built_for_another_tensorflow_is_reported(tmp_path):
  fake = tmp_path / "_tf_ext_ops.so"
  raw = open(os.path.join(ROOT, "tf_ext", "_tf_ext_ops.so"), "rb").read()
  fake.write_bytes(
    raw.replace(
      b"tensorflow=" + tf.__version__.encode(),
      b"tensorflow=9.99.0"[: len("tensorflow=" + tf.__version__)],
    )
  )
  proc = run_python(
    """
    import tf_ext  # importing must still work
    try:
      tf_ext.DynamicEmbeddingVariable("x", 4)
    except ImportError as error:
      print("ERROR:", error)
  """,
    check=True,
  )
  del proc  # the real library loads: no error expected there
  env_code = f"""
    import os
    os.environ["TF_EXT_OPS_LIBRARY"] = {str(fake)!r}
    import tf_ext
    try:
      tf_ext.DynamicEmbeddingVariable("x", 4)
    except ImportError as error:
      print("ERROR:", error)
  """
  out = run_python(env_code).stdout
  assert "built for TensorFlow 9.99." in out and f"runs TensorFlow {tf.__version__}" in out
  missing = run_python(env_code.replace(str(fake), str(tmp_path / "nope.so"))).stdout
  assert "does not exist" in missing and "make build" in missing


def test_dense_ids_with_a_combiner():
  t = tf_ext.DynamicEmbeddingVariable("dense_combiner", 2, initializer="zeros")
  t.insert([1, 2, 3], [[1.0, 1.0], [2.0, 2.0], [6.0, 6.0]])
  np.testing.assert_allclose(
    tf_ext.embedding_lookup(t, [[1, 2], [3, 3]], combiner="mean").numpy(), [[1.5, 1.5], [6, 6]]
  )
  np.testing.assert_allclose(
    tf_ext.embedding_lookup(t, [[1, 2]], combiner="sqrtn").numpy(), [[3 / 2**0.5] * 2], rtol=1e-6
  )
  # Rank-1 ids are one id per row: the combiner leaves them as they are.
  np.testing.assert_allclose(
    tf_ext.embedding_lookup(t, [1, 3], combiner="sum").numpy(), [[1, 1], [6, 6]]
  )


@pytest.mark.parametrize("dim,key_dtype", [(1, tf.int64), (4096, tf.string)])
def test_extreme_dims_train_and_export(dim, key_dtype):
  t = tf_ext.DynamicEmbeddingVariable(f"dim_{dim}", dim, key_dtype=key_dtype, initializer="zeros")
  keys = tf.constant([5, 6, 5], tf.int64) if key_dtype == tf.int64 else tf.constant(["a", "b", "a"])
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(1.0))
  opt.apply_gradients([(tf.IndexedSlices(tf.ones([3, dim]), keys), t.gradient_anchor)])
  rows = t.lookup(keys).numpy()
  assert rows.shape == (3, dim)
  # Key 5 / "a" had its two gradients summed (2), Adagrad: -lr * g / sqrt(0.1 + g^2).
  np.testing.assert_allclose(rows[0], -2 / np.sqrt(0.1 + 4 + 1e-7), rtol=1e-5)
  np.testing.assert_allclose(rows[1], -1 / np.sqrt(0.1 + 1 + 1e-7), rtol=1e-5)
  keys_out, values, slots, *_ = t.export_with_slots()
  assert values.shape == (2, dim) and slots.shape == (2, dim)


@pytest.mark.parametrize("splits_dtype", [tf.int32, tf.int64])
def test_ragged_lookups_take_their_segment_ids_from_one_op(splits_dtype):
  """Lookups of RaggedTensor ids compute the rows' segment ids with TfExtRaggedSegmentIds, which
  equals value_rowids() (empty rows and tensors included) and names bad row_splits."""
  ops = tf_ext._ops_loader.load()
  rng = np.random.default_rng(0)
  for lengths in ([], [0], [3, 0, 2], rng.integers(0, 11, 500)):
    ragged = tf.RaggedTensor.from_row_lengths(
      tf.zeros([int(np.sum(lengths))], tf.int64), tf.constant(lengths, tf.int64)
    ).with_row_splits_dtype(splits_dtype)
    ids = ops.tf_ext_ragged_segment_ids(ragged.row_splits)
    assert ids.dtype == tf.int64
    np.testing.assert_array_equal(ids.numpy(), ragged.value_rowids().numpy())
  for splits, message in [
    ([1, 2], "must start at 0, got 1"),
    ([0, 3, 2], "must not decrease, got 3 then 2 at 1"),
    ([], "at least one entry"),
  ]:
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
      ops.tf_ext_ragged_segment_ids(tf.constant(splits, splits_dtype))
  with tf.Graph().as_default():
    table = tf_ext.get_dynamic_embedding_variable("ragged_ids", 2)
    tf_ext.embedding_lookup(table, tf.ragged.constant([[1, 2], [], [3]], tf.int64))
    types = [op.type for op in tf.compat.v1.get_default_graph().get_operations()]
    assert "TfExtRaggedSegmentIds" in types

"""Bad input gives InvalidArgumentError naming the table, never a crash or a silent wrong answer."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ext


def _table(name="bad", dim=4, key_dtype=tf.int64):
  return tf_ext.DynamicEmbeddingVariable(name, dim, key_dtype=key_dtype, initializer="zeros")


def test_wrong_key_dtype_on_lookup():
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'bad_dtype'.*ids must be int64, got string"
  ):
    _table("bad_dtype").lookup(tf.constant(["a"]))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'bad_float'.*ids must be int64, got float32"
  ):
    _table("bad_float").lookup(tf.constant([1.0]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="'bad_str'.*must be string, got int64"):
    _table("bad_str", key_dtype=tf.string).lookup(tf.constant([1], tf.int64))


def test_int32_ids_are_widened_not_rejected():
  t = _table("int32_ok")
  t.insert(tf.constant([3], tf.int32), [[1.0, 2.0, 3.0, 4.0]])
  np.testing.assert_array_equal(t.lookup(tf.constant([3], tf.int32)).numpy(), [[1, 2, 3, 4]])


def test_unsupported_table_dtypes_and_dims():
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'kd'.*key_dtype must be tf.int64 or tf.string"
  ):
    tf_ext.DynamicEmbeddingVariable("kd", 4, key_dtype=tf.float32)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'vd'.*value_dtype must be tf.float32"):
    tf_ext.DynamicEmbeddingVariable("vd", 4, value_dtype=tf.float16)
  for dim in (0, 4097, -1, 2.5, "8"):
    with pytest.raises(
      tf.errors.InvalidArgumentError, match=r"'dims'.*dim must be an int in \[1, 4096\]"
    ):
      tf_ext.DynamicEmbeddingVariable("dims", dim)
  with pytest.raises(tf.errors.InvalidArgumentError, match="'ini'.*unknown initializer 'glorot'"):
    tf_ext.DynamicEmbeddingVariable("ini", 4, initializer="glorot")
  with pytest.raises(tf.errors.InvalidArgumentError, match="'ini2'.*unsupported initializer"):
    tf_ext.DynamicEmbeddingVariable("ini2", 4, initializer=tf.keras.initializers.GlorotUniform())


def test_mismatched_dim_on_insert():
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'ins'.*values have dim 5, the table has dim 4"
  ):
    _table("ins").insert([1], np.ones([1, 5], np.float32))


def test_mismatched_dim_on_insert_found_only_at_run_time():
  t = _table("ins_graph")

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec(None, tf.float32)])
  def insert(keys, values):
    t.insert(keys, values)

  with pytest.raises(tf.errors.InvalidArgumentError, match="'ins_graph'.*keys.shape \\+ \\[dim\\]"):
    insert(tf.constant([1, 2], tf.int64), tf.ones([2, 3]))
  assert int(t.size()) == 0


def test_mismatched_dim_on_import():
  t = _table("imp")
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'imp'.*has dim 3 but the table has dim 4"
  ):
    t.import_with_slots([1], np.ones([1, 3]), np.zeros([1, 0]), [0], [0], np.zeros([0]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="'imp'.*slots must have shape"):
    t.import_with_slots([1], np.ones([1, 4]), np.zeros([1, 3]), [0], [0], np.zeros([1]))


def test_wrong_rank():
  t = _table("rank")
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'rank'.*values must have rank keys.rank \\+ 1 = 2"
  ):
    t.insert([1, 2], np.ones([2, 2, 4], np.float32))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'rank'.*SparseTensor ids must have rank 2, got 3"
  ):
    tf_ext.embedding_lookup(t, tf.sparse.from_dense(tf.ones([1, 1, 1], tf.int64)), combiner="sum")
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'rank'.*combiner needs ids of rank >= 1"
  ):
    tf_ext.embedding_lookup(t, tf.constant(1, tf.int64), combiner="sum")
  with pytest.raises(tf.errors.InvalidArgumentError, match="'rank'.*combiner must be one of"):
    tf_ext.embedding_lookup(t, tf.constant([1], tf.int64), combiner="max")
  with pytest.raises(tf.errors.InvalidArgumentError, match="'rank'.*is a SparseTensor"):
    t.lookup(tf.sparse.from_dense(tf.ones([1, 1], tf.int64)))


def test_empty_batches():
  t = _table("empty")
  assert t.lookup(tf.zeros([0], tf.int64)).shape == (0, 4)
  t.insert(tf.zeros([0], tf.int64), tf.zeros([0, 4]))
  t.remove(tf.zeros([0], tf.int64))
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam())
  opt.apply_gradients(
    [(tf.IndexedSlices(tf.zeros([0, 4]), tf.zeros([0], tf.int64)), t.gradient_anchor)]
  )
  empty_ragged = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64), [0, 0])
  np.testing.assert_array_equal(
    tf_ext.embedding_lookup(t, empty_ragged, combiner="mean").numpy(), np.zeros([2, 4])
  )
  assert int(t.size()) == 0


def test_huge_ids_are_exact():
  t = _table("huge")
  big = np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 2**62 + 1, 2**62], np.int64)
  t.insert(big, np.arange(16, dtype=np.float32).reshape(4, 4))
  np.testing.assert_array_equal(t.lookup(big[::-1]).numpy(), np.arange(16).reshape(4, 4)[::-1])
  assert int(t.size()) == 4
  with pytest.raises(tf.errors.InvalidArgumentError, match="'huge'.*cannot be converted"):
    t.lookup([2**64])


def test_dense_gradient_for_a_table_is_rejected():
  t = _table("dense_grad")
  opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))
  with pytest.raises(
    tf.errors.InvalidArgumentError, match="'dense_grad'.*expected an IndexedSlices"
  ):
    opt.apply_gradients([(tf.ones([]), t.gradient_anchor)])


class _OwnV1Optimizer(tf.compat.v1.train.Optimizer):
  """A TF1 optimizer of the program's own: tf_ext does not know its update."""


def test_unsupported_optimizers_fail_at_wrap_time():
  with pytest.raises(tf.errors.InvalidArgumentError, match="Adafactor is not supported"):
    tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adafactor())
  with pytest.raises(tf.errors.InvalidArgumentError, match="_OwnV1Optimizer is not supported"):
    tf_ext.DynamicEmbeddingOptimizer(_OwnV1Optimizer(False, "own"))


def test_unsupported_keras_options_fail_at_wrap_time():
  for make in (tf.keras.optimizers.Adam, tf.keras.optimizers.SGD, tf.keras.optimizers.Ftrl):
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{make.__name__} with weight_decay"):
      tf_ext.DynamicEmbeddingOptimizer(make(weight_decay=0.1))

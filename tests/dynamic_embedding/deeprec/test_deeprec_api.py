"""`import tf_ext.deeprec as deeprec`: DeepRec's EmbeddingVariable API over tf_ext tables.

The first part ports the cases of DeepRec's tensorflow/python/ops/embedding_variable_ops_test.py
that stock TensorFlow 2.15 can run, in TF1 graphs as there (each test names its DeepRec case).
Where tf_ext's semantics differ from DeepRec's (a filter counts training steps, not occurrences in
lookups; FTRL is stock TensorFlow's), the expectations are tf_ext's and the comment says how
DeepRec's differ. Then what tf_ext.deeprec adds (eager, tf.function, the sparse lookups against
TensorFlow's, the mappings of the options) and a test for each clear error.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
import tf_ext.deeprec as deeprec
from tf_ext.dynamic_embedding import deeprec as deeprec_home
from tf_ext.dynamic_embedding.deeprec import options as deeprec_options

v1 = tf.compat.v1


def _ones():
  return v1.ones_initializer()


def _partitioner(n):
  return v1.fixed_size_partitioner(num_shards=n)


def _optimizer(kind):
  """DeepRec's test optimizers that stock TensorFlow has (_CreateOptimizer)."""
  if kind == "Adagrad":
    return v1.train.AdagradOptimizer(0.1)
  if kind == "Adam":
    return v1.train.AdamOptimizer(0.1)
  if kind == "FTRL":
    return v1.train.FtrlOptimizer(
      0.1, l1_regularization_strength=2.0, l2_regularization_strength=1e-5
    )
  if kind == "GradientDescent":
    return v1.train.GradientDescentOptimizer(0.1)
  raise ValueError(kind)


OPTIMIZERS = ["Adagrad", "Adam", "FTRL", "GradientDescent"]


def _train_op(optimizer, loss, read, global_step=None, tables=True):
  """The training op, after `read` (the lookup fetched with it reads the rows before the step).

  Tables are trained through tf_ext.DynamicEmbeddingOptimizer; dense variables by `optimizer`.
  """
  if tables:
    optimizer = tf_ext.DynamicEmbeddingOptimizer(optimizer)
  with tf.control_dependencies([read]):
    return optimizer.apply_gradients(optimizer.compute_gradients(loss), global_step=global_step)


def _init(sess):
  # A partitioned EmbeddingVariable's shards have local gradient anchors (tf_ext's sharded.py).
  sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])


def _export_sorted(sess, ev):
  keys, values, versions, freqs = sess.run(deeprec.export(ev))
  order = np.argsort(keys)
  return keys[order], values[order], versions[order], freqs[order]


def _dense_run(ids, optimizer_kind, steps, rows=100, dim=3):
  """DeepRec's reference: the same loss on a dense variable of ones; the rows after `steps`."""
  with tf.Graph().as_default():
    var = v1.get_variable("dense", [rows, dim], initializer=_ones(), use_resource=True)
    emb = tf.nn.embedding_lookup(var, tf.constant(ids, tf.int64))
    loss = tf.reduce_sum(emb * 2.0)
    train = _train_op(_optimizer(optimizer_kind), loss, emb, tables=False)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(steps):
        sess.run(train)
      return sess.run(emb)


# ---- ported from DeepRec's embedding_variable_ops_test.py -----------------------------------


def test_save_version_with_global_step_eviction(tmp_path):
  """testSaveVersionWithGlobalStepEviction: the saved version is the last update's step."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1", embedding_dim=6, initializer=v1.ones_initializer, steps_to_live=5
    )
    emb = deeprec.embedding_lookup(var, tf.constant([5], tf.int64))
    loss = tf.reduce_sum(emb * 2.0)
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer("Adagrad"), loss, emb, gs)
    saver = deeprec.Saver(sharded=True)
    with v1.Session() as sess:
      _init(sess)
      sess.run([emb, train])
      sess.run([emb, train])
      path = saver.save(sess, str(tmp_path / "model.ckpt"))
    with v1.Session() as sess:
      saver.restore(sess, path)
      keys, _, versions, freqs = _export_sorted(sess, var)
  np.testing.assert_array_equal(keys, [5])
  np.testing.assert_array_equal(versions, [1])
  np.testing.assert_array_equal(freqs, [2])


def test_init_from_proto():
  """testEmbeddingVariableForInitFromProto: the graph of a partitioned EmbeddingVariable with
  steps_to_live round-trips through a MetaGraphDef and trains after import."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_dist",
      embedding_dim=6,
      initializer=v1.ones_initializer,
      steps_to_live=4,
      partitioner=_partitioner(4),
    )
    emb = deeprec.embedding_lookup(var, tf.constant([0, 1, 2, 5, 6, 7], tf.int64))
    loss = tf.reduce_sum(emb * 2.0)
    train = _train_op(_optimizer("FTRL"), loss, emb)
    saver = v1.train.Saver(sharded=True)
    meta_graph_def = v1.train.export_meta_graph(saver_def=saver.as_saver_def())
    names = emb.name, train.name
  with tf.Graph().as_default() as graph:
    v1.train.import_meta_graph(meta_graph_def)
    tables = [op for op in graph.get_operations() if op.type == "TfExtDynamicTable"]
    assert len(tables) == 4
    with v1.Session() as sess:
      _init(sess)
      sess.run(names[1])
      got = sess.run(names[0])
  # One FTRL step of gradient 2 from 1.0, as on a dense variable.
  np.testing.assert_allclose(got, _dense_run([0, 1, 2, 5, 6, 7], "FTRL", 1, dim=6), rtol=1e-6)


@pytest.mark.parametrize("ht_partition_num", [None, 20])
def test_lookup_int64_and_ht_partition_num(ht_partition_num):
  """testEmbeddingVariableForLookupInt64 and testEmbeddingVariableForHTPartitionNum: a negative
  id, 4 partitions, 5 FTRL steps (ht_partition_num a hint) give a dense variable's rows."""
  ev_option = None
  if ht_partition_num is not None:
    ev_option = deeprec.EmbeddingVariableOption(ht_partition_num=ht_partition_num)
  ids = [0, 1, 2, 5, 6, -7]
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      partitioner=_partitioner(4),
      ev_option=ev_option,
    )
    emb = deeprec.embedding_lookup(var, tf.constant(ids, tf.int64))
    loss = tf.reduce_sum(emb * 2.0)
    train = _train_op(_optimizer("FTRL"), loss, emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(5):
        got, _ = sess.run([emb, train])
  # The dense reference indexes rows 0..5 (a dense variable has no row -7).
  np.testing.assert_allclose(got, _dense_run(list(range(6)), "FTRL", 4, rows=6), rtol=1e-6)


def test_lookup_int32_saves_and_restores(tmp_path):
  """testEmbeddingVariableForLookupInt32: int32 keys (held as int64), Adam, save and restore."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      key_dtype=tf.int32,
      initializer=_ones(),
      partitioner=_partitioner(4),
    )
    ids = tf.constant([0, 1, 2, 5, 6, -7], tf.int32)
    emb = deeprec.embedding_lookup(var, ids)
    loss = tf.reduce_sum(emb * 2.0)
    train = _train_op(v1.train.AdamOptimizer(0.01), loss, emb)
    saver = v1.train.Saver(sharded=True)
    with v1.Session() as sess:
      _init(sess)
      sess.run(train)
      trained = sess.run(emb)
      save_path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=12345)
    with v1.Session() as sess:
      sess.run(v1.local_variables_initializer())
      saver.restore(sess, save_path)
      restored = sess.run(emb)
      keys, *_ = _export_sorted(sess, var)
  np.testing.assert_allclose(trained, np.full([6, 3], 0.99), rtol=1e-5)  # Adam's first step
  np.testing.assert_array_equal(restored, trained)
  assert keys.dtype == np.int32
  np.testing.assert_array_equal(keys, [-7, 0, 1, 2, 5, 6])


def test_get_shape():
  """testEmbeddingVariableForGetShape: total_count is [rows, embedding_dim] after training."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable("var_1", embedding_dim=3, initializer=_ones())
    emb = deeprec.embedding_lookup(var, tf.constant([0, 1, 2, 5, 6, 7], tf.int64))
    train = _train_op(v1.train.AdamOptimizer(0.01), tf.reduce_sum(emb * 2.0), emb)
    shape = deeprec.total_count(var)
    with v1.Session() as sess:
      _init(sess)
      np.testing.assert_array_equal(sess.run(shape), [0, 3])
      sess.run(train)
      np.testing.assert_array_equal(sess.run(shape), [6, 3])


def _ftrl_reference():
  """FTRL's rows after one step on ids [0, 0, 0, 1, 1, 2] (gradients 6, 4, 2), on a dense
  variable: stock TensorFlow's values, which tf_ext computes. DeepRec's test expects 0.8282884
  and 0.7927219 for ids 0 and 1 (its own FTRL kernel)."""
  return _dense_run([0, 0, 0, 1, 1, 2], "FTRL", 1, rows=3)[[0, 3, 5]]


@pytest.mark.parametrize("sparse", [True, False])
def test_l2_feature_eviction(tmp_path, sparse):
  """testEmbeddingVariableForL2FeatureEviction (dense lookup) and ...FromContribFeatureColumn
  (there a contrib embedding column, here embedding_lookup_sparse with its "mean" combiner):
  the save evicts the rows whose 0.5 * sum(w^2) < 0.9, and they read their initial rows after
  the restore."""
  reference = _ftrl_reference()
  np.testing.assert_allclose(reference[:, 0], [0.8142196, 0.7716551, 0.6462797], rtol=1e-6)
  l2_weights = 0.5 * np.sum(reference**2, axis=1)
  kept = l2_weights >= 0.9  # id 0 only (DeepRec's FTRL values keep id 1 too)
  np.testing.assert_array_equal(kept, [True, False, False])
  evict = deeprec.L2WeightEvict(l2_weight_threshold=0.9)
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(evict_option=evict),
    )
    ids = tf.constant([0, 0, 0, 1, 1, 2], tf.int64)
    if sparse:
      sp_ids = tf.SparseTensor([[i, 0] for i in range(6)], ids, [6, 1])
      emb = deeprec.embedding_lookup_sparse(var, sp_ids, None, combiner="mean")
    else:
      emb = deeprec.embedding_lookup(var, ids)
    train = _train_op(_optimizer("FTRL"), tf.reduce_sum(emb * 2.0), emb)
    saver = deeprec.Saver(sharded=True)
    with v1.Session() as sess:
      _init(sess)
      sess.run([emb, train])
      np.testing.assert_allclose(sess.run(emb), reference[[0, 0, 0, 1, 1, 2]], rtol=1e-6)
      saver.save(sess, str(tmp_path / "model1.ckpt"), global_step=12345)
    with v1.Session() as sess:
      saver.restore(sess, str(tmp_path / "model1.ckpt-12345"))
      keys, *_ = _export_sorted(sess, var)
      restored = sess.run(emb)
  np.testing.assert_array_equal(keys, [0])
  expected = np.where(kept[:, None], reference, 1.0)[[0, 0, 0, 1, 1, 2]]
  np.testing.assert_allclose(restored, expected, rtol=1e-6)


def test_l2_feature_eviction_dram(tmp_path):
  """testEmbeddingVariableForL2FeatureEvictionDRAM: the same with StorageOption(DRAM)."""
  reference = _ftrl_reference()
  storage = deeprec.StorageOption(storage_type=deeprec.StorageType.DRAM)
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(
        evict_option=deeprec.L2WeightEvict(0.9), storage_option=storage
      ),
    )
    emb = deeprec.embedding_lookup(var, tf.constant([0, 0, 0, 1, 1, 2], tf.int64))
    train = _train_op(_optimizer("FTRL"), tf.reduce_sum(emb * 2.0), emb)
    saver = deeprec.Saver(sharded=True)
    with v1.Session() as sess:
      _init(sess)
      sess.run([emb, train])
      saver.save(sess, str(tmp_path / "model1.ckpt"), global_step=12345)
    with v1.Session() as sess:
      saver.restore(sess, str(tmp_path / "model1.ckpt-12345"))
      restored = sess.run(emb)
  np.testing.assert_allclose(restored[:3], np.repeat(reference[:1], 3, 0), rtol=1e-6)
  np.testing.assert_array_equal(restored[3:], np.ones([3, 3]))


def test_global_step_eviction(tmp_path):
  """testEmbeddingVariableForGlobalStepEviction: with steps_to_live=2, the save at global step 4
  drops id 1 (last updated at step 0) and keeps ids 2 and 3 (step 3)."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(evict_option=deeprec.GlobalStepEvict(2)),
    )
    ids = v1.placeholder(tf.int64, name="ids")
    emb = deeprec.embedding_lookup(var, ids)
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 2.0), emb, gs)
    saver = deeprec.Saver(sharded=True)
    path = str(tmp_path / "model1.ckpt")
    with v1.Session() as sess:
      _init(sess)
      for batch in ([1, 2, 3], [2, 3], [2, 3], [2, 3]):
        sess.run(train, {ids: batch})
      saver.save(sess, path)
    with v1.Session() as sess:
      saver.restore(sess, path)
      keys, _, versions, _ = _export_sorted(sess, var)
  np.testing.assert_array_equal(keys, [2, 3])
  np.testing.assert_array_equal(versions, [3, 3])


def test_feature_filter_from_sparse_lookup():
  """testEmbeddingVariableForFeatureFilterFromContribFeatureColumn (a contrib embedding column
  there, embedding_lookup_sparse here): CounterFilter(3) on ids [1,1,1,1,2,2,2,3,3,4].

  tf_ext counts training steps, so every id of the batch is admitted at the 3rd step and reads
  0.0 (default_value_no_permission) until then; DeepRec counts occurrences, admitting ids 1 and
  2 (4 and 3 of them) at the first step."""
  values = [1, 1, 1, 1, 2, 2, 2, 3, 3, 4]
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "col_emb",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(3)),
    )
    sp_ids = tf.SparseTensor([[i, 0] for i in range(10)], tf.constant(values, tf.int64), [10, 1])
    emb = deeprec.embedding_lookup_sparse(var, sp_ids, None, combiner="mean")
    train = _train_op(_optimizer("FTRL"), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(3):
        got, _ = sess.run([emb, train])
        np.testing.assert_array_equal(got, np.zeros([10, 3]))
      got = sess.run(emb)
  # Admitted at the 3rd step, each row got one FTRL step with its batch's gradient.
  reference = _dense_run(values, "FTRL", 1, rows=5)
  np.testing.assert_allclose(got, reference, rtol=1e-6)
  assert np.all(got != 1.0) and np.all(got != 0.0)


def test_sparse_lookup_trains_as_a_dense_variable():
  """testEmbeddingVariableForSparseColumnEmbeddingCol (a contrib embedding column there, whose
  combiner is "mean"): 3 FTRL steps of a sparse lookup give a dense variable's rows."""

  def run(make_params, lookup):
    with tf.Graph().as_default():
      params, tables = make_params()
      indices = [[0, 0], [1, 1], [2, 2], [3, 3], [4, 4]]
      sp_ids = tf.SparseTensor(indices, tf.constant([1, 2, 3, 4, 5], tf.int64), [5, 5])
      emb = lookup(params, sp_ids, None, combiner="mean")
      train = _train_op(_optimizer("FTRL"), tf.reduce_sum(emb * 2.0), emb, tables=tables)
      with v1.Session() as sess:
        _init(sess)
        for _ in range(3):
          sess.run(train)
        return sess.run(emb)

  def table():
    return deeprec.get_embedding_variable("col_emb", embedding_dim=3, initializer=_ones()), True

  def dense():
    return v1.get_variable("v", [6, 3], initializer=_ones(), use_resource=True), False

  got = run(table, deeprec.embedding_lookup_sparse)
  expected = run(dense, v1.nn.embedding_lookup_sparse)
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert np.all(got != 1.0)


def test_shrink_none():
  """testEmbeddingVariableForShrinkNone: scalar ids fed one by one, each a new row of ones; with
  no global step the rows record step 0, so eviction removes none."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1", embedding_dim=3, steps_to_live=5, initializer=_ones()
    )
    ids = v1.placeholder(tf.int64, name="ids")
    emb = deeprec.embedding_lookup(var, ids)
    loss = tf.reduce_sum(emb * 2.0)
    train = _train_op(_optimizer("FTRL"), loss, emb)
    v1.train.get_or_create_global_step()
    evicted = deeprec.evict()
    with v1.Session() as sess:
      _init(sess)
      for i in range(10):
        row, _, value = sess.run([emb, train, loss], {"ids:0": 2 * i})
        np.testing.assert_array_equal(row, [1.0, 1.0, 1.0])
        assert value == 6.0
      assert sess.run(evicted) == 0
      np.testing.assert_array_equal(sess.run(deeprec.total_count(var)), [10, 3])


def _adagrad_step(value, gradient, accumulator=0.1, lr=0.1):
  accumulator += gradient**2
  return value - lr * gradient / np.sqrt(accumulator), accumulator


@pytest.mark.parametrize("counter_type", [None, tf.uint32, tf.uint8, tf.uint16])
def test_bloom_filter(counter_type):
  """testEmbeddingVariableForBloomFilterInt64/Int32/Int8/Int16 (AdagradDecay there, which stock
  TensorFlow lacks; Adagrad here): id 1 reads 0.0 for its first 3 steps, then its trained row."""
  kwargs = {} if counter_type is None else {"counter_type": counter_type}
  cbf = deeprec.CBFFilter(
    filter_freq=3, max_element_size=5, false_positive_probability=0.01, **kwargs
  )
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(filter_option=cbf),
      partitioner=_partitioner(4),
    )
    emb = deeprec.embedding_lookup(var, tf.constant([1], tf.int64))
    train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(3):
        got, _ = sess.run([emb, train])
        np.testing.assert_array_equal(got, np.zeros([1, 3]))
      got, _ = sess.run([emb, train])
  np.testing.assert_allclose(got, np.full([1, 3], _adagrad_step(1.0, 2.0)[0]), rtol=1e-6)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_counter_filter(optimizer):
  """testEmbeddingVariableFor{Adagrad,Adam,Ftrl,GradientDescent}Filter (_CounterFilterTemplate):
  CounterFilter(3) on ids [1,1,1,1,2,2,2,3,3,4] in every batch.

  tf_ext admits every id at its 3rd step (zeros until then), with that step's update applied to
  its initial row: the 4th read is a dense variable's rows after one step. DeepRec counts
  occurrences and admits ids 1 and 2 at the first step."""
  values = [1, 1, 1, 1, 2, 2, 2, 3, 3, 4]
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(3)),
      partitioner=_partitioner(1),
    )
    emb = deeprec.embedding_lookup(var, tf.constant(values, tf.int64))
    train = _train_op(_optimizer(optimizer), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(3):
        got, _ = sess.run([emb, train])
        np.testing.assert_array_equal(got, np.zeros([10, 3]))
      got = sess.run(emb)
  np.testing.assert_allclose(got, _dense_run(values, optimizer, 1, rows=5), rtol=1e-6)
  assert np.all(got != 1.0)


@pytest.mark.parametrize("optimizer", ["GradientDescent", "Adagrad", "Adam"])
def test_optimizer_matches_a_dense_variable(optimizer):
  """testEmbeddingVariableFor{GradientDescent,Adagrad,Adam} (_OpitmizerTestTemplate): 5 steps
  on an EmbeddingVariable give a dense variable's rows (to the bit but for Adam's rounding)."""
  ids = [0, 1, 2, 5, 6, 7]
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1", embedding_dim=3, initializer=_ones(), partitioner=_partitioner(1)
    )
    emb = deeprec.embedding_lookup(var, tf.constant(ids, tf.int64))
    train = _train_op(_optimizer(optimizer), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(5):
        got, _ = sess.run([emb, train])
  expected = _dense_run(ids, optimizer, 4)
  if optimizer == "Adam":  # its float steps are ordered otherwise: DeepRec's delta, 1e-5
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
  else:
    np.testing.assert_array_equal(got, expected)
  assert np.all(got != 1.0)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_record_freq_and_version(tmp_path, optimizer):
  """testEmbeddingVariableForRecordFreq, testEmbeddingVariableFor*RecrodFreq and
  *RecordVersion (_RecordFreqTestTemplate, _RecordVersionTemplate) for the stock optimizers:
  after 2 steps on ids [1, 1, 1, 2, 2, 3], the checkpoint holds each row's last step (1) and its
  update count, one per step (2); DeepRec's freqs count occurrences in lookups: 6, 4, 2."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable("var_1", embedding_dim=3, initializer=_ones())
    emb = deeprec.embedding_lookup(var, tf.constant([1, 1, 1, 2, 2, 3], tf.int64))
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer(optimizer), tf.reduce_sum(emb * 2.0), emb, gs)
    saver = v1.train.Saver(sharded=True)
    path = str(tmp_path / "model1.ckpt")
    with v1.Session() as sess:
      _init(sess)
      sess.run([emb, train])
      sess.run([emb, train])
      saver.save(sess, path)
    with v1.Session() as sess:
      saver.restore(sess, path)
      keys, _, versions, freqs = _export_sorted(sess, var)
  np.testing.assert_array_equal(keys, [1, 2, 3])
  np.testing.assert_array_equal(versions, [1, 1, 1])
  np.testing.assert_array_equal(freqs, [2, 2, 2])


def test_weighted_sparse_lookup_matches_a_dense_variable():
  """testEmbeddingVariableWeightedCategoricalColumn (weighted_categorical_column over DeepRec's
  categorical_column_with_embedding there, embedding_lookup_sparse with weights here): 5
  Adagrad steps of a weighted mean give an identity column's dense variable's rows."""
  indices = [[0, 0], [0, 1], [1, 1], [2, 2], [3, 3], [4, 3], [4, 4]]

  def run(make_params, lookup, tables):
    with tf.Graph().as_default():
      sp_ids = tf.SparseTensor(indices, tf.constant([1, 3, 2, 3, 4, 5, 3], tf.int64), [5, 5])
      sp_weights = tf.SparseTensor(indices, [2.0, 5.0, 4.0, 8.0, 3.0, 1.0, 2.5], [5, 5])
      emb = lookup(make_params(), sp_ids, sp_weights, combiner="mean")
      train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 2.0), emb, tables=tables)
      with v1.Session() as sess:
        _init(sess)
        for _ in range(5):
          got, _ = sess.run([emb, train])
        return got

  got = run(
    lambda: deeprec.get_embedding_variable("col_emb", embedding_dim=3, initializer=_ones()),
    deeprec.embedding_lookup_sparse,
    True,
  )
  expected = run(
    lambda: v1.get_variable("v", [6, 3], initializer=_ones(), use_resource=True),
    v1.nn.embedding_lookup_sparse,
    False,
  )
  np.testing.assert_allclose(got, expected, rtol=1e-6)
  assert np.all(got != 1.0)


def test_restore_saved_model(tmp_path):
  """testEmbeddingVariableRestoreSavedModel (string ids through a contrib shared embedding
  column there, embedding_lookup_sparse here): SavedModelBuilder saves the trained table and
  saved_model.loader.load restores it into a new graph."""
  path = str(tmp_path / "save_model")
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "col_emb", embedding_dim=3, key_dtype=tf.string, initializer=_ones()
    )
    sp_ids = tf.SparseTensor([[0, 0], [1, 0], [2, 0]], ["aaaa", "bbbbb", "ccc"], [3, 5])
    emb = deeprec.embedding_lookup_sparse(var, sp_ids, None, combiner="mean")
    train = _train_op(_optimizer("FTRL"), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      sess.run(train)
      trained = sess.run(emb)
      builder = v1.saved_model.Builder(path)
      builder.add_meta_graph_and_variables(sess, ["tag_string"])
      builder.save()
    emb_name = emb.name
  with tf.Graph().as_default(), v1.Session() as sess:
    v1.saved_model.loader.load(sess, ["tag_string"], path)
    restored = sess.run(emb_name)
  np.testing.assert_allclose(trained, np.full([3, 3], 0.6462797), rtol=1e-6)
  np.testing.assert_array_equal(restored, trained)


def test_general_const_initializer():
  """testEmbeddingVariableForGeneralConstInitializer."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1", embedding_dim=3, initializer=_ones(), partitioner=_partitioner(4)
    )
    emb = deeprec.embedding_lookup(var, tf.constant([1, 6], tf.int64))
    with v1.Session() as sess:
      _init(sess)
      np.testing.assert_array_equal(sess.run(emb), np.ones([2, 3]))


def test_general_random_initializer():
  """testEmbeddingVariableForGeneralRandomInitializer: DeepRec's default initializer is
  truncated_normal_initializer() (stddev 1): rows differ per id, within two stddevs."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable("var_1", embedding_dim=3, partitioner=_partitioner(4))
    emb = deeprec.embedding_lookup(var, tf.range(1000, dtype=tf.int64))
    with v1.Session() as sess:
      _init(sess)
      got = sess.run(emb)
  assert np.all(got[1] != got[6])
  assert np.all(np.abs(got) <= 2.0)
  assert 0.7 < np.std(got) < 0.95  # a standard normal truncated at 2: stddev 0.88


@pytest.mark.parametrize("use_cbf", [False, True])
def test_ev_initializer_with_feature_filter(use_cbf):
  """testEVInitializerWithCounterFeatureFilter and ...WithBloomFeatureFilter: with
  InitializerOption(glorot_uniform(seed=1), default_value_dim=8) and a filter of frequency 3,
  id 3 reads zeros for 3 steps (a zero loss gradient), then its initial row.

  DeepRec's initial row is row 3 of TensorFlow's glorot matrix [8, 3] (seed 1); tf_ext draws the
  same distribution (uniform in +-sqrt(6 / (8 + 3))) per id: the row of a tf_ext table with
  that spec."""
  filter_option = (
    deeprec.CBFFilter(filter_freq=3, max_element_size=10, false_positive_probability=0.01)
    if use_cbf
    else deeprec.CounterFilter(filter_freq=3)
  )
  limit = math.sqrt(6.0 / (8 + 3))
  with tf.Graph().as_default():
    init_option = deeprec.InitializerOption(
      initializer=v1.glorot_uniform_initializer(seed=1), default_value_dim=8
    )
    ev_option = deeprec.EmbeddingVariableOption(
      init_option=init_option, filter_option=filter_option
    )
    var = deeprec.get_embedding_variable("emb_var", embedding_dim=3, ev_option=ev_option)
    reference = tf_ext.get_dynamic_embedding_variable(
      "reference", 3, initializer=tf_ext.InitializerSpec("uniform", -limit, limit, 1)
    )
    emb = deeprec.embedding_lookup(var, tf.constant([3], tf.int64))
    train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 0.0), emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(3):
        got, _ = sess.run([emb, train])
        np.testing.assert_array_equal(got, np.zeros([1, 3]))
      got = sess.run(emb)
      expected = sess.run(reference.lookup(tf.constant([3], tf.int64)))
  np.testing.assert_array_equal(got, expected)
  assert np.all(got != 0.0) and np.all(np.abs(got) <= limit)


def test_dram_storage():
  """testEmbeddingVariableForDRAM: StorageOption(DRAM), 2048 ids of dim 128, Adagrad."""
  storage = deeprec.StorageOption(storage_type=deeprec.StorageType.DRAM)
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=128,
      initializer=_ones(),
      partitioner=_partitioner(1),
      steps_to_live=5,
      ev_option=deeprec.EmbeddingVariableOption(storage_option=storage),
    )
    emb = deeprec.embedding_lookup(var, tf.range(2048, dtype=tf.int64))
    train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      np.testing.assert_array_equal(sess.run(emb), np.ones([2048, 128]))
      sess.run([emb, train])
      got, _ = sess.run([emb, train])
  np.testing.assert_allclose(got, np.full([2048, 128], 0.90122706), rtol=1e-6)


def test_record_freq_with_counter_filter(tmp_path):
  """testEmbeddingVariableForRecordFreqWithCounterFilter: CounterFilter(3) on ids
  [1, 1, 1, 2, 2, 3]. tf_ext has no row for any id after 2 steps, and all three after the 3rd
  (one update each, at step 2); DeepRec, counting occurrences, saves ids 1 and 2 after 2 steps
  with freqs 6 and 4."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(3)),
    )
    emb = deeprec.embedding_lookup(var, tf.constant([1, 1, 1, 2, 2, 3], tf.int64))
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 2.0), emb, gs)
    saver = v1.train.Saver(sharded=True)
    with v1.Session() as sess:
      _init(sess)
      sess.run([emb, train])
      sess.run([emb, train])
      assert _export_sorted(sess, var)[0].size == 0
      sess.run([emb, train])
      path = saver.save(sess, str(tmp_path / "model1.ckpt"))
    with v1.Session() as sess:
      saver.restore(sess, path)
      keys, _, versions, freqs = _export_sorted(sess, var)
  np.testing.assert_array_equal(keys, [1, 2, 3])
  np.testing.assert_array_equal(versions, [2, 2, 2])
  np.testing.assert_array_equal(freqs, [1, 1, 1])


def test_default_value_no_permission():
  """testEmbeddingVariableForDefaultValueNoPermission: InitializerOption(zeros,
  default_value_no_permission=0.2) wins over initializer=ones; id 1 reads 0.2 until it is
  admitted (CounterFilter(3)), then its row: 0 - 0.1 * 2 after one SGD step.

  tf_ext admits at the 3rd update, so the 4th read is the first that differs; DeepRec's test
  expects the 3rd to differ."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable(
      "var_1",
      embedding_dim=3,
      ev_option=deeprec.EmbeddingVariableOption(
        filter_option=deeprec.CounterFilter(filter_freq=3),
        init_option=deeprec.InitializerOption(
          initializer=v1.zeros_initializer(), default_value_no_permission=0.2
        ),
      ),
      initializer=_ones(),
      partitioner=_partitioner(4),
    )
    emb = deeprec.embedding_lookup(var, tf.constant([1], tf.int64))
    train = _train_op(_optimizer("GradientDescent"), tf.reduce_sum(emb * 2.0), emb)
    with v1.Session() as sess:
      _init(sess)
      for _ in range(3):
        got, _ = sess.run([emb, train])
        np.testing.assert_array_equal(got, np.full([1, 3], 0.2, np.float32))
      got, _ = sess.run([emb, train])
  np.testing.assert_allclose(got, np.full([1, 3], -0.2), rtol=1e-6)


def test_inference_lookups_create_no_rows():
  """testEmbeddingVariableForInference: lookups alone never insert (total_count [0, 3])."""
  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable("var_1", embedding_dim=3, initializer=_ones())
    ids = v1.placeholder(tf.int64, name="ids")
    emb = deeprec.embedding_lookup(var, ids)
    shape = deeprec.total_count(var)
    with v1.Session() as sess:
      _init(sess)
      for batch in ([1, 2, 3], [1, 3, 5], [1, 5, 7]):
        np.testing.assert_array_equal(sess.run(emb, {"ids:0": batch}), np.ones([3, 3]))
      np.testing.assert_array_equal(sess.run(shape), [0, 3])


def test_save_v3(tmp_path):
  """testSaveV3: an EmbeddingVariable beside a dense variable, saved before and after training,
  restores its trained rows."""
  path = str(tmp_path / "model.ckpt")
  with tf.Graph().as_default():
    emb_var = deeprec.get_embedding_variable("emb_var", 10)
    var = v1.get_variable("var", [10, 10], use_resource=True)
    ids = tf.constant([1, 2, 3], tf.int64)
    emb = deeprec.embedding_lookup(emb_var, ids) + tf.nn.embedding_lookup(var, ids)
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer("Adagrad"), tf.reduce_sum(emb * 2.0), emb, gs)
    saver = v1.train.Saver(sharded=True)
    rows = deeprec.embedding_lookup(emb_var, ids)
    with v1.Session() as sess:
      _init(sess)
      initial = sess.run(rows)
      saver.save(sess, path)
      sess.run(train)
      sess.run(train)
      trained = sess.run(rows)
      saver.save(sess, path)
    with v1.Session() as sess:
      saver.restore(sess, path)
      restored = sess.run(rows)
  assert np.all(trained != initial)
  np.testing.assert_array_equal(restored, trained)


def test_save_and_restore_single_tier(tmp_path):
  """testEmbeddingVariableForSaveAndRestoreForSingleTier: a partitioned and a plain DRAM
  EmbeddingVariable restore into the same, and into each other's layouts (plain <-> 2 parts).

  DeepRec's loss is 0 * emb, whose restored rows equal initial ones even without a restore
  (tf_ext computes initial rows per id); here the rows are trained. DeepRec passes
  Saver([var, var_2]); tf_ext's Saver takes tables from GraphKeys.SAVEABLE_OBJECTS (Saver())."""
  dram = deeprec.EmbeddingVariableOption(
    storage_option=deeprec.StorageOption(storage_type=deeprec.StorageType.DRAM)
  )
  ids = [0, 1, 2, 5, 6, 7]

  def build(first_parts, second_parts):
    var = deeprec.get_embedding_variable(
      "var_1", embedding_dim=3, initializer=_ones(), partitioner=first_parts, ev_option=dram
    )
    var_2 = deeprec.get_embedding_variable(
      "var_2", embedding_dim=3, initializer=_ones(), partitioner=second_parts, ev_option=dram
    )
    emb = deeprec.embedding_lookup(var, tf.constant(ids, tf.int64))
    emb_1 = deeprec.embedding_lookup(var_2, tf.constant(ids, tf.int64))
    return var, var_2, emb, emb_1

  prefix = str(tmp_path / "model.ckpt")
  with tf.Graph().as_default():
    var, var_2, emb, emb_1 = build(_partitioner(2), None)
    loss = tf.reduce_sum(emb * 2.0 + emb_1 * 3.0)
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer("Adagrad"), loss, tf.group(emb, emb_1), gs)
    saver = v1.train.Saver(sharded=True)
    with v1.Session() as sess:
      _init(sess)
      sess.run(train)
      emb_ori, emb_ori_2 = sess.run([emb, emb_1])
      save_path = saver.save(sess, prefix, global_step=12345)
  assert np.all(emb_ori != 1.0) and np.all(emb_ori_2 != emb_ori)
  for layout in ((_partitioner(2), None), (None, _partitioner(2))):
    with tf.Graph().as_default():
      var, var_2, emb, emb_1 = build(*layout)
      saver = v1.train.Saver(sharded=True)
      with v1.Session() as sess:
        sess.run(v1.local_variables_initializer())
        saver.restore(sess, save_path)
        ret, ret_1 = sess.run([emb, emb_1])
        sizes = sess.run([var.size(), var_2.size()])
    np.testing.assert_array_equal(ret, emb_ori)
    np.testing.assert_array_equal(ret_1, emb_ori_2)
    assert sizes == [6, 6]


@pytest.mark.parametrize("dense_second", [False, True])
def test_counts_with_gradient_descent(dense_second):
  """testCountsTensorWithGradientDescent and testCountsDenseAndSparseTensorWithGradientDescent:
  two lookups of one table (sparse + sparse, or sparse + dense) train it in one step, each row
  once with its summed gradient, as a dense variable. DeepRec's freqs count occurrences
  (3, 3, 1, 3, 2); tf_ext's count the row's updates (1 each)."""
  sp1 = ([[i, 0] for i in range(6)], [0, 0, 0, 1, 1, 2])
  second = [3, 3, 3, 4, 4, 1]

  def run(params, lookup_sparse, lookup, tables):
    sp = tf.SparseTensor(sp1[0], tf.constant(sp1[1], tf.int64), [6, 1])
    emb1 = lookup_sparse(params, sp, None)
    if dense_second:
      emb2 = lookup(params, tf.constant(second, tf.int64))
    else:
      emb2 = lookup_sparse(
        params, tf.SparseTensor(sp1[0], tf.constant(second, tf.int64), [6, 1]), None
      )
    emb = emb1 + emb2
    return _train_op(_optimizer("GradientDescent"), tf.reduce_sum(emb * 2.0), emb, tables=tables)

  with tf.Graph().as_default():
    var = deeprec.get_embedding_variable("var_1", embedding_dim=3, initializer=_ones())
    train = run(var, deeprec.embedding_lookup_sparse, deeprec.embedding_lookup, True)
    with v1.Session() as sess:
      _init(sess)
      sess.run(train)
      keys, values, _, freqs = _export_sorted(sess, var)
  with tf.Graph().as_default():
    dense = v1.get_variable("v", [5, 3], initializer=_ones(), use_resource=True)
    train = run(dense, v1.nn.embedding_lookup_sparse, tf.nn.embedding_lookup, False)
    with v1.Session() as sess:
      _init(sess)
      sess.run(train)
      expected = sess.run(dense)
  np.testing.assert_array_equal(keys, [0, 1, 2, 3, 4])
  np.testing.assert_array_equal(freqs, [1, 1, 1, 1, 1])
  np.testing.assert_allclose(values, expected, rtol=1e-6)
  np.testing.assert_allclose(values[:, 0], [0.4, 0.4, 0.8, 0.4, 0.6], rtol=1e-6)


# ---- tf_ext.deeprec: paths, eager, tf.function, lookups against TensorFlow's -----------------


def test_the_public_path_is_the_capability_package():
  assert deeprec is deeprec_home
  assert deeprec.options is deeprec_options
  assert deeprec.EvictionHook is tf_ext.train.EvictionHook
  assert set(deeprec.__all__) <= set(dir(deeprec))


def test_the_returned_object_is_the_tf_ext_table(request):
  name = request.node.name
  ev = deeprec.get_embedding_variable(name, 4)
  assert isinstance(ev, tf_ext.DynamicEmbeddingVariable)
  assert ev is tf_ext.get_dynamic_embedding_variable(name, 4)
  assert deeprec.get_embedding_variable(name, 4) is ev
  sharded = deeprec.get_embedding_variable(name + "_p", 4, partitioner=_partitioner(3))
  assert isinstance(sharded, tf_ext.ShardedDynamicEmbeddingVariable)
  assert [s.name for s in sharded.shards] == [f"{name}_p/part_{i}" for i in range(3)]


def test_variable_scope_prefixes_the_name():
  with tf.Graph().as_default():
    with v1.variable_scope("tower"):
      ev = deeprec.get_embedding_variable("emb", 2)
    assert ev.name == "tower/emb"


def test_eager_training_with_a_filter_and_tf_function(request):
  """Eagerly, with a Keras optimizer: ids read 0.0 until their 2nd update admits them; a
  tf.function lookup reads the same rows."""
  ev = deeprec.get_embedding_variable(
    request.node.name,
    4,
    initializer=tf.keras.initializers.Ones(),
    ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(2)),
  )
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.125))
  ids = tf.constant([3, 4], tf.int64)
  seen = []
  for _ in range(3):
    with tf.GradientTape() as tape:
      emb = deeprec.embedding_lookup(ev, ids)
      loss = tf.reduce_sum(emb)
    seen.append(emb.numpy()[:, 0].tolist())
    grads = tape.gradient(loss, [ev.gradient_anchor])
    optimizer.apply_gradients(zip(grads, [ev.gradient_anchor]))
  assert seen == [[0.0, 0.0], [0.0, 0.0], [0.875, 0.875]]

  @tf.function
  def lookup(x):
    return deeprec.embedding_lookup(ev, x)

  np.testing.assert_array_equal(lookup(tf.constant([[3, 9]], tf.int32))[..., 0], [[0.75, 0.0]])
  np.testing.assert_array_equal(deeprec.total_count(ev), [2, 4])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn", None])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_lookup_sparse_is_tensorflows(request, combiner, weighted):
  """Shapes (up to the last row holding an id, as TensorFlow's), combiners and weights."""
  rows = np.arange(24, dtype=np.float32).reshape(8, 3) / 10.0
  ev = deeprec.get_embedding_variable(request.node.name, 3)
  ev.insert(tf.range(8, dtype=tf.int64), rows)
  indices = [[0, 0], [0, 1], [0, 2], [2, 0], [3, 1]]
  sp_ids = tf.SparseTensor(indices, tf.constant([5, 1, 5, 7, 0], tf.int64), [6, 3])
  sp_weights = tf.SparseTensor(indices, [0.5, 2.0, 1.0, 3.0, 0.25], [6, 3]) if weighted else None
  got = deeprec.embedding_lookup_sparse(ev, sp_ids, sp_weights, combiner=combiner)
  expected = v1.nn.embedding_lookup_sparse(tf.constant(rows), sp_ids, sp_weights, combiner=combiner)
  assert got.shape == expected.shape == (4, 3)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_safe_embedding_lookup_sparse(request):
  """One row per input row; weights <= 0 dropped; empty rows zeros or default_id's row;
  negative ids are keys (not pruned); ids of rank 3."""
  ev = deeprec.get_embedding_variable(request.node.name, 2)
  ev.insert(tf.constant([-4, 1, 9], tf.int64), [[1.0, 1.0], [2.0, 4.0], [10.0, 20.0]])
  sp_ids = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([-4, 1, 1], tf.int64), [4, 2])
  sp_weights = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], [1.0, 0.0, 2.0], [4, 2])
  got = deeprec.safe_embedding_lookup_sparse(ev, sp_ids, sp_weights, combiner="sum")
  np.testing.assert_array_equal(got, [[1, 1], [0, 0], [4, 8], [0, 0]])
  got = deeprec.safe_embedding_lookup_sparse(ev, sp_ids, None, combiner="mean", default_id=9)
  np.testing.assert_array_equal(got, [[1.5, 2.5], [10, 20], [2, 4], [10, 20]])
  rank3 = tf.SparseTensor([[0, 0, 0], [1, 1, 0]], tf.constant([1, 9], tf.int64), [2, 2, 1])
  got = deeprec.safe_embedding_lookup_sparse(ev, rank3, None)
  np.testing.assert_array_equal(got, [[[2, 4], [0, 0]], [[0, 0], [10, 20]]])


def test_embedding_lookup_max_norm_and_shapes(request):
  ev = deeprec.get_embedding_variable(request.node.name, 2)
  ev.insert(tf.constant([1, 2], tf.int64), [[3.0, 4.0], [0.3, 0.4]])
  got = deeprec.embedding_lookup(ev, tf.constant([[1, 2]], tf.int64), max_norm=1.0)
  assert got.shape == (1, 2, 2)
  np.testing.assert_allclose(got[0], [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
  np.testing.assert_allclose(deeprec.embedding_lookup([ev], 2), [0.3, 0.4], rtol=1e-6)


def test_lookups_of_tensorflow_params_are_tensorflows():
  params = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  np.testing.assert_array_equal(
    deeprec.embedding_lookup(params, [2, 0]), tf.nn.embedding_lookup(params, [2, 0])
  )
  sp_ids = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([0, 2], tf.int64), [1, 2])
  np.testing.assert_array_equal(deeprec.embedding_lookup_sparse(params, sp_ids, None), [[3, 4]])
  np.testing.assert_array_equal(deeprec.safe_embedding_lookup_sparse(params, sp_ids), [[3, 4]])


def test_string_keys(request):
  ev = deeprec.get_embedding_variable(request.node.name, 2, key_dtype=tf.string, initializer=0.5)
  ev.insert(tf.constant(["a"]), [[1.0, 2.0]])
  np.testing.assert_array_equal(
    deeprec.embedding_lookup(ev, tf.constant(["a", "zz"])), [[1, 2], [0.5, 0.5]]
  )


def test_cbf_filter_sizes_the_sketch_from_the_bloom_filter():
  # n = 5, p = 0.01: m = 48 counters, k = 7 hashes -> 7 rows of the smallest width (1024).
  small = deeprec_options.sketch_of(deeprec.CBFFilter(3, 5, 0.01))
  assert small == {"sketch_depth": 7, "sketch_bytes": 1024 * 4 * 7}
  # n = 2^20, p = 0.001: m = 15.1M counters, k = 10 -> 10 rows of 2^21 (>= 1.51M) counters.
  large = deeprec_options.sketch_of(deeprec.CBFFilter(3, 1 << 20, 0.001))
  m = math.ceil(-(1 << 20) * math.log(0.001) / math.log(2) ** 2)
  assert large == {"sketch_depth": 10, "sketch_bytes": (1 << 21) * 4 * 10}
  assert large["sketch_bytes"] // 4 >= m
  assert deeprec_options.sketch_of(deeprec.CBFFilter(3)) == {}
  with tf.Graph().as_default():
    ev = deeprec.get_embedding_variable(
      "cbf",
      2,
      ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CBFFilter(3, 5, 0.01)),
    )
    assert ev.admission == tf_ext.FrequencyAdmission(3, sketch_bytes=1024 * 4 * 7, sketch_depth=7)
    counter = deeprec.get_embedding_variable(
      "counter",
      2,
      ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(5)),
    )
    assert counter.admission == tf_ext.FrequencyAdmission(5, exact=True)
    plain = deeprec.get_embedding_variable(
      "plain",
      2,
      ev_option=deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(0)),
    )
    assert plain.admission is None


def test_l2_weight_evict_keeps_deeprecs_threshold(request):
  """DeepRec evicts when 0.5 * sum(w^2) < threshold: rows just above stay, just below go."""
  ev = deeprec.get_embedding_variable(
    request.node.name,
    2,
    trainable=False,
    ev_option=deeprec.EmbeddingVariableOption(evict_option=deeprec.L2WeightEvict(0.5)),
  )
  assert ev.eviction == tf_ext.EvictionPolicy(min_l2_norm=1.0)  # sqrt(2 * 0.5)
  # 0.5 * (0.71^2 + 0.71^2) = 0.5041 stays; 0.5 * (0.7^2 + 0.71^2) = 0.49705 goes.
  ev.insert(tf.constant([1, 2], tf.int64), [[0.71, 0.71], [0.7, 0.71]])
  assert int(deeprec.evict([ev])) == 1
  np.testing.assert_array_equal(deeprec.export(ev)[0], [1])


def test_global_step_evict_keeps_deeprecs_steps_to_live():
  """DeepRec evicts when global_step - last update step > steps_to_live."""
  with tf.Graph().as_default():
    ev = deeprec.get_embedding_variable(
      "ev",
      2,
      initializer=_ones(),
      ev_option=deeprec.EmbeddingVariableOption(evict_option=deeprec.GlobalStepEvict(3)),
    )
    assert ev.eviction == tf_ext.EvictionPolicy(ttl_steps=4)
    ids = v1.placeholder(tf.int64, [None])
    emb = deeprec.embedding_lookup(ev, ids)
    gs = v1.train.get_or_create_global_step()
    train = _train_op(_optimizer("GradientDescent"), tf.reduce_sum(emb), emb, gs)
    evict = deeprec.evict()
    with v1.Session() as sess:
      _init(sess)
      for batch in ([1], [2], [9], [9]):  # steps 0 to 3; the global step is then 4
        sess.run(train, {ids: batch})
      assert sess.run(evict) == 1  # id 1: 4 - 0 > 3 goes; id 2: 4 - 1 = 3 stays
      keys, *_ = _export_sorted(sess, ev)
  np.testing.assert_array_equal(keys, [2, 9])


def test_variance_scaling_initializers_keep_their_distribution():
  """glorot, he, lecun and VarianceScaling: DeepRec's [default_value_dim, dim] matrix's fans."""
  with tf.Graph().as_default():
    glorot = deeprec.get_embedding_variable(
      "glorot", 4, initializer=v1.glorot_uniform_initializer(seed=7)
    )
    limit = math.sqrt(6.0 / (4096 + 4))
    assert glorot.initializer_spec == tf_ext.InitializerSpec("uniform", -limit, limit, 7)
    he = deeprec.get_embedding_variable(
      "he",
      4,
      initializer=tf.keras.initializers.HeNormal(seed=3),
      ev_option=deeprec.EmbeddingVariableOption(
        init_option=deeprec.InitializerOption(default_value_dim=100)
      ),
    )
    stddev = math.sqrt(2.0 / 100) / 0.87962566103423978
    assert he.initializer_spec.kind == "truncated_normal"
    np.testing.assert_allclose(he.initializer_spec.b, stddev)
    assert he.initializer_spec.seed == 3
    plain = deeprec.get_embedding_variable(
      "plain",
      4,
      initializer=tf.keras.initializers.VarianceScaling(distribution="untruncated_normal"),
    )
    assert plain.initializer_spec == tf_ext.InitializerSpec("normal", 0.0, math.sqrt(1 / 4096), 0)
    default = deeprec.get_embedding_variable("default", 4)
    assert default.initializer_spec == tf_ext.InitializerSpec("truncated_normal", 0.0, 1.0, 0)


def test_saver_evicts_before_each_save_and_evict_takes_var_list(tmp_path):
  with tf.Graph().as_default():
    kept = deeprec.get_embedding_variable("kept", 2, initializer=_ones())
    ev = deeprec.get_embedding_variable(
      "ev",
      2,
      initializer=_ones(),
      trainable=False,
      ev_option=deeprec.EmbeddingVariableOption(evict_option=deeprec.L2WeightEvict(0.25)),
    )
    inserts = tf.group(
      ev.insert(tf.constant([1, 2], tf.int64), [[0.1, 0.1], [1.0, 1.0]]),
      kept.insert(tf.constant([1], tf.int64), [[0.1, 0.1]]),
    )
    saver = deeprec.Saver()
    with pytest.raises(ValueError, match="'kept' has no eviction policy"):
      deeprec.evict([kept])
    with v1.Session() as sess:
      _init(sess)
      sess.run(inserts)
      saver.save(sess, str(tmp_path / "model"))
      assert sess.run([ev.size(), kept.size()]) == [1, 1]


# ---- clear errors on bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
  "storage_type",
  [
    deeprec.StorageType.PMEM_MEMKIND,
    deeprec.StorageType.PMEM_LIBPMEM,
    deeprec.StorageType.SSDHASH,
    deeprec.StorageType.LEVELDB,
    deeprec.StorageType.HBM,
    deeprec.StorageType.DRAM_PMEM,
    deeprec.StorageType.DRAM_SSDHASH,
    deeprec.StorageType.HBM_DRAM,
    deeprec.StorageType.DRAM_LEVELDB,
    deeprec.StorageType.DRAM_PMEM_SSDHASH,
    deeprec.StorageType.HBM_DRAM_SSDHASH,
  ],
)
def test_storage_tiers_other_than_dram_are_not_offered(storage_type):
  name = deeprec.StorageType.Name(storage_type)
  with pytest.raises(NotImplementedError, match=rf"storage_type=StorageType\.{name} .*DRAM"):
    deeprec.StorageOption(storage_type=storage_type)


def test_bad_storage_options():
  with pytest.raises(NotImplementedError, match="storage_path"):
    deeprec.StorageOption(storage_type=deeprec.StorageType.DRAM, storage_path="/tmp/leveldb/")
  with pytest.raises(ValueError, match="storage_size must be a list"):
    deeprec.StorageOption(storage_size=1024)
  with pytest.raises(ValueError, match="cache_strategy"):
    deeprec.StorageOption(cache_strategy=7)
  with pytest.raises(ValueError, match="unknown StorageType value 999"):
    deeprec.StorageType.Name(999)


@pytest.mark.parametrize(
  "make, error, match",
  [
    (lambda: deeprec.CounterFilter(-1), ValueError, "CounterFilter filter_freq must be an int"),
    (lambda: deeprec.CounterFilter(2.5), ValueError, "CounterFilter filter_freq must be an int"),
    (lambda: deeprec.CBFFilter(-3), ValueError, "CBFFilter filter_freq must be an int"),
    (
      lambda: deeprec.EmbeddingVariableOption(ht_type="dense_hash_map"),
      NotImplementedError,
      "ht_type='dense_hash_map'",
    ),
    (
      lambda: deeprec.EmbeddingVariableOption(ht_partition_num=0),
      ValueError,
      "ht_partition_num must be a positive int",
    ),
    (
      lambda: deeprec.EmbeddingVariableOption(ckpt=deeprec.CheckpointOption("/tmp/ckpt")),
      NotImplementedError,
      "ckpt .*not offered.*Saver",
    ),
    (lambda: deeprec.GlobalStepEvict(-3), ValueError, "steps_to_live must be a positive int"),
    (lambda: deeprec.GlobalStepEvict(2.5), ValueError, "steps_to_live must be a positive int"),
    (lambda: deeprec.L2WeightEvict(0.0), ValueError, "l2_weight_threshold must be > 0"),
    (lambda: deeprec.L2WeightEvict(-0.5), ValueError, "l2_weight_threshold must be > 0"),
    (lambda: "filter", TypeError, "filter_option must be a CounterFilter or CBFFilter"),
  ],
)
def test_bad_ev_options(make, error, match):
  made = make()
  if isinstance(made, deeprec.EmbeddingVariableOption):
    ev_option = made
  elif isinstance(made, (deeprec.CounterFilter, deeprec.CBFFilter, str)):
    ev_option = deeprec.EmbeddingVariableOption(filter_option=made)
  else:
    ev_option = deeprec.EmbeddingVariableOption(evict_option=made)
  with tf.Graph().as_default(), pytest.raises(error, match=match):
    deeprec.get_embedding_variable("var", 4, ev_option=ev_option)


def test_bad_option_objects():
  with pytest.raises(TypeError, match="ev_option must be a tf_ext.deeprec.EmbeddingVariableOption"):
    deeprec.get_embedding_variable("var", 4, ev_option={"filter_option": 3})
  for field, message in [
    ("evict", "evict_option must be a GlobalStepEvict or L2WeightEvict"),
    ("storage_option", "storage_option must be a StorageOption"),
    ("init", "init_option must be an InitializerOption"),
  ]:
    ev_option = deeprec.EmbeddingVariableOption()
    setattr(ev_option, field, object())
    with pytest.raises(TypeError, match=message):
      deeprec.get_embedding_variable("var", 4, ev_option=ev_option)


def test_bad_filter_and_initializer_option_values():
  with pytest.raises(ValueError, match="false_positive_probability must be in"):
    deeprec.CBFFilter(3, 5, 1.5)
  with pytest.raises(ValueError, match="max_element_size must be a positive int"):
    deeprec.CBFFilter(3, 0, 0.01)
  with pytest.raises(ValueError, match="max_element_size can't be set"):
    deeprec.CBFFilter(3, 5)
  with pytest.raises(ValueError, match="counter_type must be an integer dtype"):
    deeprec.CBFFilter(3, 5, 0.01, counter_type=tf.float32)
  with pytest.raises(ValueError, match="default_value_dim must be a positive int"):
    deeprec.InitializerOption(default_value_dim=0)
  with pytest.raises(ValueError, match="default_value_no_permission must be a number"):
    deeprec.InitializerOption(default_value_no_permission="zero")


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"regularizer": tf.keras.regularizers.L2(0.1)}, "regularizer is not offered"),
    ({"collections": ["embeddings"]}, "collections is not offered"),
    ({"custom_getter": lambda getter, *a, **k: getter(*a, **k)}, "custom_getter is not offered"),
    ({"constraint": tf.keras.constraints.MaxNorm(1.0)}, "constraint is not offered"),
    ({"init_data_source": "/data/emb"}, "init_data_source is not offered"),
  ],
)
def test_arguments_not_offered(kwargs, match):
  with tf.Graph().as_default(), pytest.raises(NotImplementedError, match=match):
    deeprec.get_embedding_variable("var", 4, **kwargs)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"embedding_dim": 0}, r"embedding_dim must be an int in \[1, 4096\]"),
    ({"embedding_dim": 5000}, r"embedding_dim must be an int in \[1, 4096\]"),
    ({"embedding_dim": "8"}, r"embedding_dim must be an int in \[1, 4096\]"),
    ({"key_dtype": tf.float32}, "key_dtype must be tf.int64, tf.int32 or tf.string"),
    ({"value_dtype": tf.float16}, "value_dtype must be tf.float32"),
    ({"name": ""}, "name must be a non-empty str"),
    ({"partitioner": 4}, "partitioner must be callable"),
    (
      {"partitioner": v1.variable_axis_size_partitioner(1 << 20)},
      "fixed number of partitions.*fixed_size_partitioner",
    ),
    (
      {
        "trainable": False,
        "ev_option": deeprec.EmbeddingVariableOption(filter_option=deeprec.CounterFilter(3)),
      },
      "CounterFilter admits ids at their training updates.*trainable=False",
    ),
    ({"trainable": False, "steps_to_live": 10}, "steps_to_live judges rows.*trainable=False"),
    (
      {
        "steps_to_live": 5,
        "ev_option": deeprec.EmbeddingVariableOption(evict_option=deeprec.L2WeightEvict(0.9)),
      },
      "steps_to_live and l2_weight_threshold can't be enabled at the same time",
    ),
  ],
)
def test_bad_get_embedding_variable_arguments(kwargs, match):
  kwargs = {"name": "var", "embedding_dim": 4, **kwargs}
  with tf.Graph().as_default(), pytest.raises(ValueError, match=match):
    deeprec.get_embedding_variable(**kwargs)


def test_unsupported_initializer_names_the_table():
  with (
    tf.Graph().as_default(),
    pytest.raises(tf.errors.InvalidArgumentError, match="'var': unsupported initializer"),
  ):
    deeprec.get_embedding_variable("var", 4, initializer=v1.orthogonal_initializer())


def test_the_same_name_with_other_options_raises():
  with tf.Graph().as_default():
    deeprec.get_embedding_variable("var", 4, steps_to_live=10)
    with pytest.raises(ValueError, match="'var' exists with other options"):
      deeprec.get_embedding_variable("var", 4, steps_to_live=20)
    with pytest.raises(ValueError, match="'var' exists with other options"):
      deeprec.get_embedding_variable("var", 4, steps_to_live=10, initializer=_ones())


def test_bad_lookups(request):
  ev = deeprec.get_embedding_variable(request.node.name, 2)
  other = deeprec.get_embedding_variable(request.node.name + "_other", 2)
  with pytest.raises(ValueError, match="not a list of 2"):
    deeprec.embedding_lookup([ev, other], [1])
  with pytest.raises(tf.errors.InvalidArgumentError, match="ids must be int64, got string"):
    deeprec.embedding_lookup(ev, tf.constant(["a"]))
  with pytest.raises(TypeError, match="sp_ids must be a SparseTensor"):
    deeprec.embedding_lookup_sparse(ev, tf.constant([[1]], tf.int64), None)
  with pytest.raises(ValueError, match="var_list holds"):
    deeprec.evict([tf.Variable(1.0)])


def test_global_step_evict_wins_over_steps_to_live(request):
  ev = deeprec.get_embedding_variable(
    request.node.name,
    2,
    steps_to_live=7,
    ev_option=deeprec.EmbeddingVariableOption(evict_option=deeprec.GlobalStepEvict(3)),
  )
  assert ev.eviction == tf_ext.EvictionPolicy(ttl_steps=4)


if __name__ == "__main__":
  raise SystemExit(pytest.main([os.path.abspath(__file__), "-q"]))

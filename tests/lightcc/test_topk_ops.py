"""The TOPK compression ops (TfExtTopKCompress / TfExtTopKDecompress) in one process, no Horovod."""

import numpy as np
import pytest
import tensorflow as tf

from tf_ext import _ops_loader

ops = _ops_loader.load()


def compress(gradient, residual, lengths, counts, half=False, offset=0):
  return ops.tf_ext_top_k_compress(
    tf.constant(gradient, tf.float32),
    residual.handle,
    segment_lengths=lengths,
    segment_counts=counts,
    half_values=half,
    residual_offset=offset,
  )


def decode(payload, k, half):
  payload = np.asarray(payload)
  indices = payload[:k]
  values = (
    payload[k:].view(np.float16)[:k].astype(np.float32) if half else payload[k:].view(np.float32)
  )
  return indices, values


@pytest.mark.parametrize("half", [False, True])
def test_selects_each_segments_largest_and_keeps_the_rest(half):
  rng = np.random.default_rng(0)
  lengths, counts = [1000, 30000, 7], [10, 300, 7]
  g = rng.standard_normal(sum(lengths)).astype(np.float32)
  residual = tf.Variable(tf.zeros([sum(lengths)]))
  payload = compress(g, residual, lengths, counts, half).numpy()
  k = sum(counts)
  assert payload.shape == (k + ((k + 1) // 2 if half else k),)
  indices, values = decode(payload, k, half)
  start = 0
  for length, count in zip(lengths, counts):
    part = np.abs(g[start : start + length])
    expected = set((np.argsort(-part, kind="stable")[:count] + start).tolist())
    chosen = [i for i in indices.tolist() if start <= i < start + length]
    assert set(chosen) == expected
    start += length
  sent = np.zeros_like(g)
  sent[indices] = values
  np.testing.assert_array_equal(sent + residual.numpy(), g)  # nothing lost, fp16 rounding included
  dense = ops.tf_ext_top_k_decompress(payload, num_selected=k, half_values=half, length=g.size)
  np.testing.assert_array_equal(dense.numpy(), sent)


def test_decompress_sums_payloads_in_order_and_scales():
  rng = np.random.default_rng(1)
  n, k = 5000, 50
  payloads, expected = [], np.zeros(n, np.float32)
  for _ in range(3):  # three "ranks"
    g = rng.standard_normal(n).astype(np.float32)
    payload = compress(g, tf.Variable(tf.zeros([n])), [n], [k]).numpy()
    indices, values = decode(payload, k, False)
    for i, v in zip(indices, values):
      expected[i] += v * np.float32(0.25)
    payloads.append(payload)
  dense = ops.tf_ext_top_k_decompress(
    np.concatenate(payloads), num_selected=k, length=n, scale=0.25
  )
  np.testing.assert_array_equal(dense.numpy(), expected)


def test_residual_offset_touches_only_its_slice_and_accumulates():
  residual = tf.Variable(tf.fill([10], 5.0))
  payload = compress(np.array([1.0, -3.0, 2.0], np.float32), residual, [3], [1], offset=4).numpy()
  indices, values = decode(payload, 1, False)
  # g + residual[4:7] = [6, 2, 7]: the largest is buffer index 2 (indices are into the buffer).
  assert indices.tolist() == [2] and values.tolist() == [7.0]
  np.testing.assert_array_equal(residual.numpy(), [5, 5, 5, 5, 6, 2, 0, 5, 5, 5])


def test_selection_uses_accumulated_residual():
  residual = tf.Variable([0.0, 10.0, 0.0])
  payload = compress(np.array([3.0, -0.5, 1.0], np.float32), residual, [3], [1]).numpy()
  indices, values = decode(payload, 1, False)
  assert indices.tolist() == [1] and values.tolist() == [9.5]
  np.testing.assert_array_equal(residual.numpy(), [3.0, 0.0, 1.0])


def test_a_value_read_before_compression_is_not_changed_by_it():
  residual = tf.Variable(tf.ones([4]))
  before = residual.read_value()
  compress(np.ones(4, np.float32), residual, [4], [2])
  np.testing.assert_array_equal(before.numpy(), np.ones(4))
  assert sorted(residual.numpy().tolist()) == [0.0, 0.0, 2.0, 2.0]


def test_graph_mode_session():
  with tf.Graph().as_default():
    residual = tf.compat.v1.get_variable("r", initializer=tf.zeros([6]), use_resource=True)
    g = tf.compat.v1.placeholder(tf.float32, [6])
    payload = ops.tf_ext_top_k_compress(g, residual.handle, segment_lengths=[6], segment_counts=[2])
    dense = ops.tf_ext_top_k_decompress(payload, num_selected=2, length=6)
    assert payload.shape.as_list() == [4] and dense.shape.as_list() == [6]
    with tf.compat.v1.Session() as session:
      session.run(residual.initializer)
      out = session.run(dense, {g: [1, -9, 2, 8, 0, 3]})
  assert out.tolist() == [0, -9, 0, 8, 0, 0]


def test_bad_inputs_raise_invalid_argument():
  residual = tf.Variable(tf.zeros([5]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="gradient must be a vector of 5"):
    ops.tf_ext_top_k_compress(
      tf.zeros([4]), residual.handle, segment_lengths=[5], segment_counts=[1]
    )
  with pytest.raises(tf.errors.InvalidArgumentError, match="count 6 must be in"):
    compress(np.zeros(5, np.float32), residual, [5], [6])
  with pytest.raises(tf.errors.InvalidArgumentError, match="differ in size"):
    compress(np.zeros(5, np.float32), residual, [5], [1, 1])
  with pytest.raises(tf.errors.InvalidArgumentError, match="at least 7 entries"):
    compress(np.zeros(5, np.float32), residual, [5], [1], offset=2)
  with pytest.raises(tf.errors.InvalidArgumentError, match="float32 vector"):
    compress(np.zeros(5, np.float32), tf.Variable(tf.zeros([5], tf.float64)), [5], [1])
  payload = compress(np.arange(5, dtype=np.float32), residual, [5], [2]).numpy()
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"outside \[0, 3\)"):
    ops.tf_ext_top_k_decompress(payload, num_selected=2, length=3)
  with pytest.raises(tf.errors.InvalidArgumentError, match="whole payloads of 4 words"):
    ops.tf_ext_top_k_decompress(payload[:3], num_selected=2, length=5)

"""LightCC's collectives, built on Horovod's: 2D allreduce and TOPK compression with error feedback.

Groups (nodes) are LIGHT_INTRA_SIZE consecutive ranks, the way horovodrun numbers the ranks of one
host. For a tensor of S bytes on G groups of L ranks, 2D allreduce sends per rank
(L-1)/L·S inside the group (reduce-scatter) + 2(G-1)/G·S/L across groups (allreduce of one
1/L-th) + (L-1)/L·S inside the group (allgather): the slow inter-node link carries 1/L of what a
flat ring allreduce would put on it.
"""

import math

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.tensorflow import (
  Average,
  Compression,
  Sum,
  global_process_set,
  handle_average_backwards_compatibility,
)

from tf_ext import _ops_loader
from tf_ext.lightcc import state

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def ring_allreduce_bytes(size_bytes, ranks):
  return 2 * (ranks - 1) / ranks * size_bytes if ranks > 1 else 0


def _static_bytes(tensor):
  if not tensor.shape.is_fully_defined():
    return None
  return tensor.shape.num_elements() * tensor.dtype.size


def grouped_allreduce_2d(tensors, op, topology, traffic=None):
  """Sum or Average of each tensor over all ranks through the group-then-column path. Tensors of
  one dtype travel as one buffer: one collective per leg."""
  results = [None] * len(tensors)
  by_dtype = {}
  for index, tensor in enumerate(tensors):
    by_dtype.setdefault(tensor.dtype, []).append(index)
  # Average scales once, by the world size, as Horovod's own allreduce does (postscale).
  scale = 1.0 / topology.world_size if op == _hvd.Average else 1.0
  for indices in by_dtype.values():
    lengths = [tensors[i].shape.num_elements() for i in indices]
    total = sum(lengths)
    flat = tf.concat([tf.reshape(tensors[i], [-1]) for i in indices], 0)
    if topology.intra_set is not None:
      splits = [topology.chunk_range(total, q)[1] for q in range(topology.intra_size)]
      flat = reduce_scatter_in_group(flat, splits, topology)
    if topology.inter_set is not None:
      flat = _hvd.allreduce(
        flat, op=_hvd.Sum, postscale_factor=scale, process_set=topology.inter_set
      )
    elif scale != 1.0:
      flat = _scale(flat, scale)
    if topology.intra_set is not None:
      flat = tf.ensure_shape(_hvd.allgather(flat, process_set=topology.intra_set), [total])
    for i, piece in zip(indices, tf.split(flat, lengths)):
      results[i] = tf.reshape(piece, tensors[i].shape)
  if traffic is None:
    return results
  size = sum(_static_bytes(t) for t in tensors)
  L, G = topology.intra_size, topology.num_groups
  record = traffic.record(
    2 * (L - 1) / L * size,
    ring_allreduce_bytes(size / L, G),
    ring_allreduce_bytes(size, topology.world_size),
  )
  return [_after(record, r) for r in results]


def reduce_scatter_in_group(send, splits, topology):
  """Sum over this rank's group of `send`, whose first splits[0] elements belong to position 0,
  the next splits[1] to position 1, ...; returns this rank's sum (splits[position] elements).

  Done as Horovod's alltoall (each rank sends every peer that peer's part: the (L-1)/L·S bytes
  of a reduce-scatter) plus a local sum: Horovod 0.28's Gloo reducescatter took 4-5x longer
  for the same result on 2-rank groups (731-867 ms against 180 ms for 102 MB).
  """
  received, _ = _hvd.alltoall(send, splits=splits, process_set=topology.intra_set)
  return tf.reduce_sum(tf.reshape(received, [topology.intra_size, splits[topology.position]]), 0)


def _scale(tensor, factor):
  if tensor.dtype in _FLOAT_DTYPES:
    return tensor * tf.cast(factor, tensor.dtype)
  # Integers: as Horovod's ScaleBuffer, multiply in double and truncate.
  return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def _after(dependency, tensor):
  with tf.control_dependencies([dependency]):
    return tf.identity(tensor)


def topk_piece_lengths(lengths, topology):
  """Per gradient, the number of its elements this rank compresses: with 2D each gradient is
  split over the group's positions (its own piece, whatever the bucketing), else all of it."""
  if topology is None or topology.intra_set is None:
    return list(lengths)
  return [topology.chunk_range(n)[1] for n in lengths]


def topk_grouped_allreduce(
  gradients, op, config, topology, residual, residual_offset, traffic=None
):
  """TOPK exchange with error feedback of a group of float gradients (float32 on the wire).

  With 2D (a topology), every gradient is reduce-scattered densely inside the group (this rank
  keeps its piece of each), the pieces go TOPK across groups, and the reduced pieces are
  allgathered inside the group; without 2D whole gradients go TOPK over all ranks. Each piece
  sends ceil(ratio·m) of its m entries; one allgather carries every piece's indices and values
  (kernels/lightcc/core). This rank's pieces of the group occupy
  residual[residual_offset : residual_offset + sum(topk_piece_lengths(...))], a float32 variable
  whose layout does not depend on how gradients are grouped (so fusion may regroup freely).
  """
  ops = _ops_loader.load()
  lengths = [g.shape.num_elements() for g in gradients]
  flats = [tf.reshape(tf.cast(g, tf.float32), [-1]) for g in gradients]
  two_d = topology is not None and topology.intra_set is not None
  if topology is not None:
    world, inter_ranks, inter_set = topology.world_size, topology.num_groups, topology.inter_set
  else:
    world = inter_ranks = _hvd.size()
    inter_set = _hvd.global_process_set
  L = topology.intra_size if two_d else 1
  # ranges[t][q]: (start, length) of gradient t's piece at group position q.
  ranges = [[topology.chunk_range(n, q) for q in range(L)] if two_d else [(0, n)] for n in lengths]
  piece_lengths = topk_piece_lengths(lengths, topology)  # the residual layout, as callers see it
  if two_d:  # position-major: everything for position 0, then position 1, ...
    send = tf.concat(
      [flats[t][r[q][0] : r[q][0] + r[q][1]] for q in range(L) for t, r in enumerate(ranges)], 0
    )
    chunk = reduce_scatter_in_group(
      send, [sum(r[q][1] for r in ranges) for q in range(L)], topology
    )
  else:
    chunk = tf.concat(flats, 0)
  counts = [min(m, max(1, math.ceil(config.topk_ratio * m))) if m else 0 for m in piece_lengths]
  payload = ops.tf_ext_top_k_compress(
    chunk,
    residual.handle,
    segment_lengths=piece_lengths,
    segment_counts=counts,
    half_values=config.topk_fp16,
    residual_offset=residual_offset,
  )
  payload_bytes = payload.shape.num_elements() * 4
  if inter_ranks > 1:
    payload = _hvd.allgather(payload, process_set=inter_set)
  reduced = ops.tf_ext_top_k_decompress(
    payload,
    num_selected=sum(counts),
    half_values=config.topk_fp16,
    length=sum(piece_lengths),
    scale=1.0 / world if op == _hvd.Average else 1.0,
  )
  if two_d:
    gathered = tf.split(
      _hvd.allgather(reduced, process_set=topology.intra_set),
      [r[q][1] for q in range(L) for r in ranges],
    )
    pieces = [
      tf.concat([gathered[q * len(ranges) + t] for q in range(L)], 0) for t in range(len(ranges))
    ]
  else:
    pieces = tf.split(reduced, lengths)
  results = [tf.cast(tf.reshape(piece, g.shape), g.dtype) for piece, g in zip(pieces, gradients)]
  if traffic is None:
    return results
  intra = 2 * (L - 1) / L * sum(lengths) * 4
  dense = ring_allreduce_bytes(sum(_static_bytes(g) for g in gradients), world)
  record = traffic.record(intra, payload_bytes * (inter_ranks - 1), dense)
  return [_after(record, r) for r in results]


def is_compressible(gradient, config):
  size = _static_bytes(gradient)
  return (
    config.topk
    and size is not None
    and size >= config.topk_threshold
    and gradient.dtype in _FLOAT_DTYPES
  )


def uses_2d(tensor, config, topology):
  size = _static_bytes(tensor)
  return (
    config.two_d
    and topology is not None
    and size is not None
    and size <= config.hierarchical_threshold
  )


# ---- horovod.tensorflow's allreduce and grouped_allreduce, 2D when LIGHT_2D_ALLREDUCE is on --


def allreduce(
  tensor,
  average=None,
  device_dense="",
  device_sparse="",
  compression=Compression.none,
  op=None,
  prescale_factor=1.0,
  postscale_factor=1.0,
  name=None,
  process_set=global_process_set,
  ignore_name_scope=False,
):
  """horovod.tensorflow.allreduce; dense Sum/Average go 2D with LIGHT_2D_ALLREDUCE on."""
  op = handle_average_backwards_compatibility(op, average)
  dense = tensor if isinstance(tensor, tf.IndexedSlices) else tf.convert_to_tensor(tensor)
  if not _goes_2d([dense], op, prescale_factor, postscale_factor, process_set):
    return _hvd.allreduce(
      tensor,
      device_dense=device_dense,
      device_sparse=device_sparse,
      compression=compression,
      op=op,
      prescale_factor=prescale_factor,
      postscale_factor=postscale_factor,
      name=name,
      process_set=process_set,
      ignore_name_scope=ignore_name_scope,
    )
  return _compressed_2d([dense], op, compression)[0]


def grouped_allreduce(
  tensors,
  average=None,
  device_dense="",
  device_sparse="",
  compression=Compression.none,
  op=None,
  prescale_factor=1.0,
  postscale_factor=1.0,
  process_set=global_process_set,
):
  """horovod.tensorflow.grouped_allreduce; each tensor goes 2D when allreduce would."""
  op = handle_average_backwards_compatibility(op, average)
  tensors = [t if isinstance(t, tf.IndexedSlices) else tf.convert_to_tensor(t) for t in tensors]
  if not _goes_2d(tensors, op, prescale_factor, postscale_factor, process_set):
    return _hvd.grouped_allreduce(
      tensors,
      device_dense=device_dense,
      device_sparse=device_sparse,
      compression=compression,
      op=op,
      prescale_factor=prescale_factor,
      postscale_factor=postscale_factor,
      process_set=process_set,
    )
  return _compressed_2d(tensors, op, compression)


def _compressed_2d(tensors, op, compression):
  """2D allreduce of `tensors` (Horovod compression applied around it), counted in traffic()."""
  compressed = [compression.compress(t) for t in tensors]
  reduced = grouped_allreduce_2d(
    [c for c, _ in compressed], op, state.process.topology, state.traffic_counter()
  )
  return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


def _goes_2d(tensors, op, prescale_factor, postscale_factor, process_set):
  """Whether 2D allreduce serves this call; everything else is left to Horovod."""
  return (
    process_set is global_process_set
    and op in (Sum, Average)
    and prescale_factor == 1.0
    and postscale_factor == 1.0
    and all(
      not isinstance(t, tf.IndexedSlices)
      and uses_2d(t, state.process.config, state.process.topology)
      for t in tensors
    )
  )

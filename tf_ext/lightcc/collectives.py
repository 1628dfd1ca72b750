"""LightCC's collectives, built on Horovod's: 2D allreduce and TOPK compression with error feedback.

Groups (nodes) are LIGHT_INTRA_SIZE consecutive ranks, the way horovodrun numbers the ranks of one
host. For a tensor of S bytes on G groups of L ranks, 2D allreduce sends per rank
(L-1)/L·S inside the group (reduce-scatter) + 2(G-1)/G·S/L across groups (allreduce of one
1/L-th) + (L-1)/L·S inside the group (allgather): the slow inter-node link carries 1/L of what a
flat ring allreduce would put on it.
"""
import math
import threading

import horovod.tensorflow as _hvd
import tensorflow as tf

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


class Topology:
  """The process sets of 2D allreduce for this rank."""

  def __init__(self, world_size, intra_size):
    self.world_size = world_size
    self.intra_size = intra_size
    self.num_groups = world_size // intra_size
    groups = [list(range(g * intra_size, (g + 1) * intra_size)) for g in range(self.num_groups)]
    columns = [list(range(p, world_size, intra_size)) for p in range(intra_size)]
    # Singleton sets carry nothing; a set equal to the whole world is the global set.
    self._intra_ranks = groups if 1 < intra_size < world_size else []
    self._inter_ranks = columns if 1 < self.num_groups < world_size else []
    self.process_sets = [_hvd.ProcessSet(r) for r in self._intra_ranks + self._inter_ranks]
    self.intra_set = self.inter_set = None

  def bind(self, rank):
    """Picks this rank's sets once Horovod is initialized."""
    sets = iter(self.process_sets)
    intra = [next(sets) for _ in self._intra_ranks]
    inter = [next(sets) for _ in self._inter_ranks]
    if self.intra_size == self.world_size:
      self.intra_set = _hvd.global_process_set
    elif self.intra_size > 1:
      self.intra_set = intra[rank // self.intra_size]
    if self.num_groups == self.world_size:
      self.inter_set = _hvd.global_process_set
    elif self.num_groups > 1:
      self.inter_set = inter[rank % self.intra_size]
    self.position = rank % self.intra_size

  def chunk_length(self, n):
    """Elements this rank holds after the in-group reduce-scatter of n elements (Horovod splits
    the first dimension evenly, the first n % L ranks taking one more)."""
    return n // self.intra_size + (1 if self.position < n % self.intra_size else 0)


class Traffic:
  """Per-step bytes this rank sends, by link, as variables readable from Python and graphs."""

  def __init__(self):
    with tf.init_scope():
      self.intra_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="lightcc_intra_bytes")
      self.inter_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="lightcc_inter_bytes")
      # What Horovod's flat ring allreduce would have sent for the same tensors.
      self.dense_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="lightcc_dense_bytes")

  def record(self, intra, inter, dense):
    return tf.group(self.intra_bytes.assign_add(int(intra)), self.inter_bytes.assign_add(int(inter)),
                    self.dense_bytes.assign_add(int(dense)))

  def reset(self):
    return tf.group([v.assign(0) for v in (self.intra_bytes, self.inter_bytes, self.dense_bytes)])

  def snapshot(self):
    if not tf.executing_eagerly():  # graph mode: tensors to run
      sent = tf.cast(self.intra_bytes + self.inter_bytes, tf.float64)
      ratio = tf.where(sent > 0, tf.cast(self.dense_bytes, tf.float64) / tf.maximum(sent, 1.0), 1.0)
      return {"intra_bytes": self.intra_bytes.read_value(), "inter_bytes": self.inter_bytes.read_value(),
              "dense_equivalent_bytes": self.dense_bytes.read_value(), "compression_ratio": ratio}
    intra, inter, dense = (int(v.numpy()) for v in (self.intra_bytes, self.inter_bytes, self.dense_bytes))
    sent = intra + inter
    return {"intra_bytes": intra, "inter_bytes": inter, "dense_equivalent_bytes": dense,
            "compression_ratio": dense / sent if sent else 1.0}


def ring_allreduce_bytes(size_bytes, ranks):
  return 2 * (ranks - 1) / ranks * size_bytes if ranks > 1 else 0


def _static_bytes(tensor):
  if not tensor.shape.is_fully_defined():
    return None
  return tensor.shape.num_elements() * tensor.dtype.size


def grouped_allreduce_2d(tensors, op, topology, traffic=None):
  """Sum or Average of each tensor over all ranks through the group-then-column path, as one
  group per leg (Horovod fuses a group into one collective)."""
  shapes = [tf.shape(t) for t in tensors]
  flats = [tf.reshape(t, [-1]) for t in tensors]
  if topology.intra_set is not None:
    flats = _hvd.grouped_reducescatter(flats, op=_hvd.Sum, process_set=topology.intra_set)
  # Average scales once, by the world size, as Horovod's own allreduce does (postscale).
  scale = 1.0 / topology.world_size if op == _hvd.Average else 1.0
  if topology.inter_set is not None:
    flats = _hvd.grouped_allreduce(flats, op=_hvd.Sum, postscale_factor=scale,
                                   process_set=topology.inter_set)
  elif scale != 1.0:
    flats = [_scale(f, scale) for f in flats]
  if topology.intra_set is not None:
    flats = _hvd.grouped_allgather(flats, process_set=topology.intra_set)
  results = [tf.reshape(f, shape) for f, shape in zip(flats, shapes)]
  if traffic is None:
    return results
  size = sum(_static_bytes(t) or 0 for t in tensors)
  L, G = topology.intra_size, topology.num_groups
  record = traffic.record(2 * (L - 1) / L * size, ring_allreduce_bytes(size / L, G),
                          ring_allreduce_bytes(size, topology.world_size))
  return [_after(record, r) for r in results]


def allreduce_2d(tensor, op, topology, traffic=None):
  return grouped_allreduce_2d([tensor], op, topology, traffic)[0]


def _scale(tensor, factor):
  if tensor.dtype in _FLOAT_DTYPES:
    return tensor * tf.cast(factor, tensor.dtype)
  # Integers: as Horovod's ScaleBuffer, multiply in double and truncate.
  return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def _after(dependency, tensor):
  with tf.control_dependencies([dependency]):
    return tf.identity(tensor)


class Residuals:
  """Error-feedback residuals, one float32 variable per (gradient, shape), created on first use."""

  def __init__(self):
    self._lock = threading.Lock()
    self._by_key = {}

  def get(self, key, length):
    with self._lock:
      residual = self._by_key.get(key)
      if residual is None:
        with tf.init_scope():
          residual = tf.Variable(tf.zeros([length], tf.float32), trainable=False,
                                 name=f"lightcc_residual_{len(self._by_key)}")
        self._by_key[key] = residual
      return residual


def topk_allreduce(gradient, op, config, residual, process_set, world_ranks, traffic=None,
                   dense_bytes=0, name=None):
  """Sparse exchange of the k largest |g + r| entries of a flat float gradient.

  Each rank sends (indices, values) by allgather; everyone scatter-adds what all ranks sent.
  The residual keeps what was not sent (including fp16 rounding), so over many steps everything
  a rank computed is eventually communicated. Returns the flat reduced gradient (float32).
  """
  n = gradient.shape.num_elements()
  ranks = process_set.size() if process_set is not None else 1
  k = max(1, math.ceil(config.topk_ratio * n))
  accumulated = tf.cast(gradient, tf.float32) + residual
  _, indices = tf.math.top_k(tf.abs(accumulated), k=k, sorted=False)
  values = tf.gather(accumulated, indices)
  wire_values = tf.cast(values, tf.float16) if config.topk_fp16 else values
  sent = tf.scatter_nd(tf.expand_dims(indices, 1), tf.cast(wire_values, tf.float32), [n])
  update_residual = residual.assign(accumulated - sent)
  if process_set is not None:
    all_values = _hvd.allgather(wire_values, process_set=process_set, name=f"{name}_vals" if name else None)
    all_indices = _hvd.allgather(indices, process_set=process_set, name=f"{name}_idx" if name else None)
    reduced = tf.math.unsorted_segment_sum(tf.cast(all_values, tf.float32), all_indices, n)
  else:
    reduced = sent
  if op == _hvd.Average:
    reduced = reduced / float(world_ranks)
  deps = [update_residual]
  if traffic is not None:
    wire = k * (wire_values.dtype.size + indices.dtype.size) * (ranks - 1)
    deps.append(traffic.record(0, wire, dense_bytes))  # TOPK always runs on the inter-group leg
  with tf.control_dependencies(deps):
    return tf.identity(reduced)


def topk_allreduce_2d(gradient, op, config, topology, residuals, key, traffic=None, name=None):
  """2D with TOPK on the inter-group leg only: dense reduce-scatter and allgather in the group."""
  shape, dtype = gradient.shape, gradient.dtype
  n = shape.num_elements()
  size = n * dtype.size
  L = topology.intra_size
  flat = tf.reshape(tf.cast(gradient, tf.float32), [-1])
  if topology.intra_set is not None:
    flat = _hvd.reducescatter(flat, op=_hvd.Sum, process_set=topology.intra_set,
                              name=f"{name}_intra_rs" if name else None)
  chunk_length = topology.chunk_length(n)
  flat = tf.ensure_shape(flat, [chunk_length])
  intra_bytes = 2 * (L - 1) / L * size
  record_intra = traffic.record(intra_bytes, 0, 0) if traffic is not None else tf.no_op()
  reduced = topk_allreduce(flat, _hvd.Sum, config, residuals.get(key, chunk_length),
                           topology.inter_set, topology.num_groups, traffic,
                           ring_allreduce_bytes(size, topology.world_size), name=name)
  if op == _hvd.Average:
    reduced = reduced / float(topology.world_size)
  if topology.intra_set is not None:
    reduced = _hvd.allgather(reduced, process_set=topology.intra_set,
                             name=f"{name}_intra_ag" if name else None)
  with tf.control_dependencies([record_intra]):
    return tf.cast(tf.reshape(reduced, shape), dtype)


def is_compressible(gradient, config):
  size = _static_bytes(gradient)
  return (config.topk and size is not None and size >= config.topk_threshold
          and gradient.dtype in _FLOAT_DTYPES)


def uses_2d(tensor, config, topology):
  size = _static_bytes(tensor)
  return (config.two_d and topology is not None and size is not None
          and size <= config.hierarchical_threshold)

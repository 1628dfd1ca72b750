"""LightCC's state: the configuration and 2D topology set by init(), and what it keeps per graph
(traffic counters, error-feedback residuals, fusion policies)."""

import logging
import os
import threading
import weakref

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.runner.common.util import env as _horovod_env

from tf_ext import harp as _harp
from tf_ext.lightcc import config as _config


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

  def chunk_range(self, n, position=None):
    """(start, length) of the elements the rank at `position` in its group (default: this rank)
    holds after the in-group reduce-scatter of n elements: an even split, the first n % L
    positions taking one more (as Horovod's reducescatter)."""
    position = self.position if position is None else position
    base, extra = divmod(n, self.intra_size)
    return position * base + min(position, extra), base + (1 if position < extra else 0)


class Traffic:
  """Per-step bytes this rank sends, by link, as variables readable from Python and graphs."""

  def __init__(self):
    with tf.init_scope():
      self.intra_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="lightcc_intra_bytes")
      self.inter_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="lightcc_inter_bytes")
      # What Horovod's flat ring allreduce would have sent for the same tensors.
      self.dense_bytes = tf.Variable(0, dtype=tf.int64, trainable=False, name="lightcc_dense_bytes")

  def record(self, intra, inter, dense):
    return tf.group(
      self.intra_bytes.assign_add(int(intra)),
      self.inter_bytes.assign_add(int(inter)),
      self.dense_bytes.assign_add(int(dense)),
    )

  def reset(self):
    return tf.group([v.assign(0) for v in (self.intra_bytes, self.inter_bytes, self.dense_bytes)])

  def snapshot(self):
    if not tf.executing_eagerly():  # graph mode: tensors to run
      sent = tf.cast(self.intra_bytes + self.inter_bytes, tf.float64)
      ratio = tf.where(sent > 0, tf.cast(self.dense_bytes, tf.float64) / tf.maximum(sent, 1.0), 1.0)
      return {
        "intra_bytes": self.intra_bytes.read_value(),
        "inter_bytes": self.inter_bytes.read_value(),
        "dense_equivalent_bytes": self.dense_bytes.read_value(),
        "compression_ratio": ratio,
      }
    intra, inter, dense = (
      int(v.numpy()) for v in (self.intra_bytes, self.inter_bytes, self.dense_bytes)
    )
    sent = intra + inter
    return {
      "intra_bytes": intra,
      "inter_bytes": inter,
      "dense_equivalent_bytes": dense,
      "compression_ratio": dense / sent if sent else 1.0,
    }


class Residuals:
  """Error-feedback residuals, one float32 variable per group of gradients (and chunk length),
  created on first use."""

  def __init__(self):
    self._lock = threading.Lock()
    self._by_key = {}

  def get(self, key, length):
    with self._lock:
      residual = self._by_key.get(key)
      if residual is None:
        with tf.init_scope():
          residual = tf.Variable(
            tf.zeros([length], tf.float32),
            trainable=False,
            name=f"lightcc_residual_{len(self._by_key)}",
          )
        self._by_key[key] = residual
      return residual

  def items(self):
    """(key, variable) of every residual, in creation order."""
    with self._lock:
      return list(self._by_key.items())


class _Process:
  """Set by init(): the configuration in force and, with 2D on, this rank's topology."""

  config = _config.LightConfig()
  topology = None
  init_call = ((), {})  # init's arguments, for elastic.run's re-init after a reset


process = _Process()


class _GraphState:
  """What LightCC keeps per graph (eager code shares one): traffic counters, error-feedback
  residuals and fusion policies. TF1 programs often build several graphs in one process."""

  def __init__(self):
    self.traffic = Traffic()
    self.residuals = Residuals()
    self.fusions = {}


_graph_states = weakref.WeakKeyDictionary()
_EAGER = type("_Eager", (), {})()


def graph_state():
  """The _GraphState of the current graph (or of eager code)."""
  with tf.init_scope():
    key = _EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    state = _graph_states.get(key)
    if state is None:
      state = _graph_states[key] = _GraphState()
    return state


def traffic_counter():
  """The current graph's Traffic, or None with LightCC off (nothing is counted then)."""
  return graph_state().traffic if process.config.enabled else None


def init(*args, **kwargs):
  """horovod.tensorflow.init, plus LightCC's settings (`light_<name>=...` keywords override env)."""
  process.init_call = (args, dict(kwargs))
  env_rank_size = _horovod_env.get_env_rank_and_size()
  world_size = env_rank_size[1] if env_rank_size else 1
  config = _config.resolve(world_size, kwargs)
  topology = None
  if config.two_d:
    topology = Topology(world_size, config.intra_size)
    process_sets = kwargs.get("process_sets", args[1] if len(args) > 1 else None)
    if process_sets == "dynamic":
      raise ValueError("LIGHT_2D_ALLREDUCE needs static process sets; drop process_sets='dynamic'")
    if len(args) > 1:
      args = args[:1]
    kwargs["process_sets"] = list(process_sets or []) + topology.process_sets
  if config.harp:
    _use_harp()
  _hvd.init(*args, **kwargs)
  if topology is not None:
    if _hvd.size() != world_size:
      raise ValueError(
        f"LIGHT_2D_ALLREDUCE: the launcher announced {world_size} ranks but Horovod "
        f"has {_hvd.size()}"
      )
    topology.bind(_hvd.rank())
  process.config, process.topology = config, topology


def _use_harp():
  """LIGHT_HARP: NCCL reads its plugin settings once, when it starts (at Horovod's first NCCL
  collective, after init), so setting them here is in time."""
  wanted = {"NCCL_NET_PLUGIN": _harp.plugin_path(), "NCCL_NET": "HARP"}
  for name, value in wanted.items():
    given = os.environ.get(name)
    if given not in (None, "", value):
      raise ValueError(
        f"LIGHT_HARP=1 sets {name}={value}, but the environment already has {name}={given}: "
        "unset it, or set LIGHT_HARP=0 to keep yours"
      )
  os.environ.update(wanted)
  if not _hvd.nccl_built():
    logging.getLogger("tf_ext.lightcc").warning(
      "LIGHT_HARP=1: this Horovod is built without NCCL (its collectives run on Gloo/MPI), so "
      "HARP carries nothing; NCCL_NET_PLUGIN is set for NCCL users of this process only"
    )


def light_config():
  """The LightCC configuration in force (a LightConfig)."""
  return process.config


def traffic():
  """Bytes this rank sent since the last reset_traffic(): intra-group, inter-group, and the ratio
  of what Horovod's flat allreduce would have sent to what was sent. Zeros with LightCC off.

  Eager: Python numbers. Graph mode: tensors of the current graph, to run in its session.
  """
  if not process.config.enabled:
    return {
      "intra_bytes": 0,
      "inter_bytes": 0,
      "dense_equivalent_bytes": 0,
      "compression_ratio": 1.0,
    }
  return traffic_counter().snapshot()


def reset_traffic():
  """Starts a new count (eager: now; graph mode: returns the op to run)."""
  if process.config.enabled:
    return traffic_counter().reset()

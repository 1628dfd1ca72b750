"""tf_ext.graph (also imported as tf_ext.graph_optimizations): graph passes for recommendation
models, in the op library.

- **Embedding fusion** (`TF_EXT_GRAPH_FUSE_EMBEDDINGS`): every tf_ext embedding lookup of a step,
  with its dedup and combiner, becomes one fused op, and the matching table updates one fused
  apply. Results are equal to the bit to the unfused graph.
- **XLA around the tables** (`TF_EXT_GRAPH_CLUSTER_DENSE`, by default on where TensorFlow sees
  a GPU): the dense part of the model, between the embedding outputs and the loss, and its
  gradients, is clustered for XLA; table ops stay outside.

`enable()` turns them on for every graph TensorFlow runs from then on (tf.function, Keras, TF1
Sessions); `config_proto()` gives a ConfigProto that turns them on for one Session or Estimator
(`tf.estimator.RunConfig(session_config=...)`). Graphs without tf_ext tables are left unchanged.
The passes run whenever TensorFlow instantiates a graph (a Session's first run of a set of fetches,
a tf.function's first call, and at times again later) with the switches of that moment: enable
them before the first step and leave them on while the model trains.
"""

import ctypes
import functools

import tensorflow as tf

from tf_ext import _ops_loader, settings

__all__ = [
  "CONFIG_NAME",
  "config_proto",
  "disable",
  "enable",
  "enabled",
  "stats",
]

# The ConfigProto custom optimizer that carries a session's switches
# (kernels/graph/core/pass_switches.h).
CONFIG_NAME = "TfExtGraphOptimizations"
"""The name of the custom graph optimizer entry that config_proto() adds to a ConfigProto's
rewrite options; its parameters carry the Session's switches."""

_SWITCHES = ("fuse_embeddings", "cluster_dense_for_xla")
_SETTING_OF = {
  "fuse_embeddings": "TF_EXT_GRAPH_FUSE_EMBEDDINGS",
  "cluster_dense_for_xla": "TF_EXT_GRAPH_CLUSTER_DENSE",
}


def _switches(fuse_embeddings, cluster_dense_for_xla):
  """Each switch: the argument when given, else its setting."""
  chosen = {}
  for name, value in zip(_SWITCHES, (fuse_embeddings, cluster_dense_for_xla)):
    if value is None:
      value = settings.get(_SETTING_OF[name])
      if value == "auto":  # XLA pays off on GPUs; on CPU it slowed benchmarks/embedding_fusion.py
        value = bool(tf.config.list_physical_devices("GPU"))
    elif not isinstance(value, bool):
      raise TypeError(f"{name} must be True, False or None (its setting), got {value!r}")
    chosen[name] = value
  return chosen


_STATS = (
  "graphs_fused",
  "lookups_fused",
  "updates_fused",
  "graphs_clustered",
  "nodes_clustered",
  "splits_read",
  "concats_written",
  "slots_shared",
)


@functools.lru_cache(maxsize=None)
def _library():
  _ops_loader.load()
  return ctypes.CDLL(_ops_loader.library_path())  # the loaded library: dlopen returns it again


def _set_process_switches(switches):
  _library().TfExtSetGraphOptimizations(*(int(switches[name]) for name in _SWITCHES))


def enable(fuse_embeddings=None, cluster_dense_for_xla=None):
  """Turns the passes on for every graph run from now on; returns which are on.

  Each argument defaults to its setting: TF_EXT_GRAPH_FUSE_EMBEDDINGS (on) and
  TF_EXT_GRAPH_CLUSTER_DENSE (auto: on where TensorFlow sees a GPU); False keeps that pass off.
  """
  _set_process_switches(_switches(fuse_embeddings, cluster_dense_for_xla))
  return enabled()


def disable():
  """Turns every pass off for graphs instantiated from now on."""
  _set_process_switches(dict.fromkeys(_SWITCHES, False))


def enabled():
  """Which passes are on for the process: {"fuse_embeddings": bool, "cluster_dense_for_xla": bool}
  (a Session's config_proto() switches are its own)."""
  switches = (ctypes.c_int * len(_SWITCHES))()
  _library().TfExtGetGraphOptimizations(switches)
  return {name: bool(on) for name, on in zip(_SWITCHES, switches)}


def config_proto(config=None, fuse_embeddings=None, cluster_dense_for_xla=None):
  """A tf.compat.v1.ConfigProto that runs the passes in the Session it configures.

  `config`: a ConfigProto to extend (it is copied, not changed). The switches default to their
  settings, as in enable(). A Session configured so follows its own switches, whatever enable()
  said.
  """
  if config is not None and not isinstance(config, tf.compat.v1.ConfigProto):
    raise TypeError(f"config must be a tf.compat.v1.ConfigProto, got {type(config).__name__}")
  _ops_loader.load()
  switches = _switches(fuse_embeddings, cluster_dense_for_xla)
  proto = tf.compat.v1.ConfigProto()
  if config is not None:
    proto.CopyFrom(config)
  rewrite = proto.graph_options.rewrite_options
  for custom in list(rewrite.custom_optimizers):
    if custom.name == CONFIG_NAME:
      rewrite.custom_optimizers.remove(custom)
  custom = rewrite.custom_optimizers.add()
  custom.name = CONFIG_NAME
  for name, value in switches.items():
    custom.parameter_map[name].b = value
  return proto


def stats():
  """What the passes did in this process so far. By the fusion pass: graphs_fused, lookups_fused,
  updates_fused, splits_read (lookup gradients that a fused apply reads in the input of the split
  that made them, which then goes), concats_written (concatenations of lookups that a fused lookup
  writes itself, which then go) and slots_shared (fused apply fields that take their ids' distinct
  slots from a fused lookup instead of hashing the ids again). By the XLA pass: graphs_clustered,
  nodes_clustered (nodes it marked)."""
  counters = (ctypes.c_int64 * len(_STATS))()
  _library().TfExtGraphOptimizationStats(counters)
  return dict(zip(_STATS, counters))

"""LightCC: `import tf_ext.lightcc as hvd` wherever `import horovod.tensorflow as hvd` works.

Every public name of horovod.tensorflow is here. With every LIGHT_* setting off (the default),
init, allreduce, DistributedOptimizer and DistributedGradientTape *are* Horovod's: same code,
same numerics. With settings on (environment, or `hvd.init(light_2d_allreduce=1, ...)`):
  - LIGHT_2D_ALLREDUCE: dense allreduces of Sum/Average go group-then-column (collectives.py),
  - LIGHT_TOPK_ALLREDUCE: gradients of at least LIGHT_TOPK_THRESHOLD bytes send only their top
    LIGHT_TOPK_RATIO entries, with error feedback (and fp16 values with LIGHT_TOPK_FP16); with 2D
    on, only the inter-group leg is compressed,
  - LIGHT_FUSION: dense gradients (TOPK ones included) go out in buckets whose size follows the
    measured step time (fusion.py).
Per-step traffic: `hvd.traffic()` (bytes sent inside groups, across groups, and the compression
ratio against Horovod's flat ring allreduce); `hvd.reset_traffic()` starts a new count.
"""

import weakref

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.runner.common.util import env as _horovod_env

from tf_ext.lightcc import _reexport
from tf_ext.lightcc import collectives as _collectives
from tf_ext.lightcc import config as _config
from tf_ext.lightcc import fusion as _fusion

# Re-export Horovod's public API (functions, classes, constants and its submodules such as elastic).
globals().update(_reexport.public_names(_hvd))


class _State:
  config = _config.LightConfig()
  topology = None


_state = _State()


class _GraphState:
  """What LightCC keeps per graph (eager code shares one): traffic counters, error-feedback
  residuals and fusion policies. TF1 programs often build several graphs in one process."""

  def __init__(self):
    self.traffic = _collectives.Traffic()
    self.residuals = _collectives.Residuals()
    self.fusions = {}


_graph_states = weakref.WeakKeyDictionary()
_EAGER = type("_Eager", (), {})()


def _graph_state():
  with tf.init_scope():
    key = _EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    state = _graph_states.get(key)
    if state is None:
      state = _graph_states[key] = _GraphState()
    return state


def _traffic():
  return _graph_state().traffic if _state.config.enabled else None


def init(*args, **kwargs):
  """horovod.tensorflow.init, plus LightCC's settings (light_<name>=... keywords override env)."""
  env_rank_size = _horovod_env.get_env_rank_and_size()
  world_size = env_rank_size[1] if env_rank_size else 1
  config = _config.resolve(world_size, kwargs)
  topology = None
  if config.two_d:
    topology = _collectives.Topology(world_size, config.intra_size)
    process_sets = kwargs.get("process_sets", args[1] if len(args) > 1 else None)
    if process_sets == "dynamic":
      raise ValueError("LIGHT_2D_ALLREDUCE needs static process sets; drop process_sets='dynamic'")
    if len(args) > 1:
      args = args[:1]
    kwargs["process_sets"] = list(process_sets or []) + topology.process_sets
  _hvd.init(*args, **kwargs)
  if topology is not None:
    if _hvd.size() != world_size:
      raise ValueError(
        f"LIGHT_2D_ALLREDUCE: the launcher announced {world_size} ranks but Horovod "
        f"has {_hvd.size()}"
      )
    topology.bind(_hvd.rank())
  _state.config, _state.topology = config, topology


def light_config():
  """The LightCC configuration in force (a LightConfig)."""
  return _state.config


def traffic():
  """Bytes this rank sent since the last reset_traffic(): intra-group, inter-group, and the ratio
  of what Horovod's flat allreduce would have sent to what was sent. Zeros with LightCC off.

  Eager: Python numbers. Graph mode: tensors of the current graph, to run in its session.
  """
  if not _state.config.enabled:
    return {
      "intra_bytes": 0,
      "inter_bytes": 0,
      "dense_equivalent_bytes": 0,
      "compression_ratio": 1.0,
    }
  return _traffic().snapshot()


def reset_traffic():
  """Starts a new count (eager: now; graph mode: returns the op to run)."""
  if _state.config.enabled:
    return _traffic().reset()


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
  compressed, context = compression.compress(dense)
  reduced = _collectives.allreduce_2d(compressed, op, _state.topology, _traffic())
  return compression.decompress(reduced, context)


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
  compressed = [compression.compress(t) for t in tensors]
  reduced = _collectives.grouped_allreduce_2d(
    [c for c, _ in compressed], op, _state.topology, _traffic()
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
      and _collectives.uses_2d(t, _state.config, _state.topology)
      for t in tensors
    )
  )


def reduce_gradients(
  gradients, variables, op=Average, compression=Compression.none, sparse_as_dense=False
):
  """Reduces one step's gradients over all ranks the LightCC way.

  Sparse gradients are allgathered as Horovod does. Dense ones of at least LIGHT_TOPK_THRESHOLD
  bytes go TOPK, the others 2D when it is on (else Horovod's allreduce). With LIGHT_FUSION both
  kinds go out in adaptive buckets; without it, all TOPK gradients travel together, and so do all
  2D ones.
  """
  config, reduced = _state.config, list(gradients)
  compressible, dense = [], []  # indices into gradients
  for index, gradient in enumerate(gradients):
    if gradient is None:
      continue
    if isinstance(gradient, tf.IndexedSlices) and sparse_as_dense:
      gradient = reduced[index] = tf.convert_to_tensor(gradient)
    if isinstance(gradient, tf.IndexedSlices):  # sparse (e.g. tf_ext tables): allgather, as Horovod
      reduced[index] = _hvd.allreduce(gradient, op=op, name=f"lightcc_grad_{index}")
    elif _collectives.is_compressible(gradient, config):
      compressible.append(index)
    elif (config.fusion and gradient.shape.is_fully_defined()) or _collectives.uses_2d(
      gradient, config, _state.topology
    ):
      dense.append(index)
    else:
      reduced[index] = allreduce(
        gradient, op=op, compression=compression, name=f"lightcc_grad_{index}"
      )
  topk = _TopKGroup(compressible, list(reduced), variables, op) if compressible else None

  def reduce_bucket(indices):
    """Reduced gradients of these indices, in their order (TOPK ones together, dense together)."""
    out = {}
    comp = sorted(i for i in indices if topk is not None and i in topk.position)
    if comp:
      out.update(zip(comp, topk.reduce(comp)))
    rest = [i for i in indices if i not in out]
    if rest:
      out.update(
        zip(rest, grouped_allreduce([reduced[i] for i in rest], op=op, compression=compression))
      )
    return [out[i] for i in indices]

  bucketed = sorted(compressible + dense)
  if bucketed:
    if config.fusion:
      results = _fusion_for([reduced[i] for i in bucketed]).reduce(
        [reduced[i] for i in bucketed], lambda bucket: reduce_bucket([bucketed[b] for b in bucket])
      )
    else:
      results = (reduce_bucket(compressible) if compressible else []) + (
        reduce_bucket(dense) if dense else []
      )
      bucketed = compressible + dense
    for i, r in zip(bucketed, results):
      reduced[i] = r
  return reduced


class _TopKGroup:
  """One step's TOPK gradients and their residual variable (this rank's pieces, in index order)."""

  def __init__(self, indices, gradients, variables, op):
    config = _state.config
    self.topology = _state.topology if config.two_d else None
    self.gradients, self.op = gradients, op
    lengths = _collectives.topk_piece_lengths(
      [gradients[i].shape.num_elements() for i in indices], self.topology
    )
    self.position = {i: p for p, i in enumerate(indices)}
    self.offsets = [sum(lengths[:p]) for p in range(len(indices))]
    key = (tuple(_variable_key(variables[i]) for i in indices), sum(lengths))
    self.residual = _graph_state().residuals.get(key, sum(lengths))

  def reduce(self, indices):
    """TOPK exchange of consecutive TOPK gradients (ascending indices)."""
    return _collectives.topk_grouped_allreduce(
      [self.gradients[i] for i in indices],
      self.op,
      _state.config,
      self.topology,
      self.residual,
      self.offsets[self.position[indices[0]]],
      _traffic(),
    )


def _variable_key(variable):
  return variable.ref() if hasattr(variable, "ref") else id(variable)


def _fusion_for(tensors):
  """The AdaptiveFusion of this set of gradients (one per model), created on first use."""
  key = tuple((tuple(t.shape.as_list()), t.dtype.name) for t in tensors)
  fusions = _graph_state().fusions
  fusion = fusions.get(key)
  if fusion is None:
    config = _state.config
    fusion = _fusion.AdaptiveFusion(
      [int(mb * (1 << 20)) for mb in config.fusion_buckets_mb],
      config.fusion_probe_steps,
      config.fusion_reprobe_steps,
    )
    fusions[key] = fusion
  return fusion


def fusion_policies():
  """The adaptive fusion policies in use (their probed medians and history), for inspection."""
  return [f.policy for f in _graph_state().fusions.values()]


def _check_supported(
  process_set, gradient_predivide_factor, backward_passes_per_step=1, groups=None, num_groups=0
):
  if process_set is not global_process_set or gradient_predivide_factor != 1.0:
    raise NotImplementedError(
      "LightCC compression/2D works on the global process set without "
      "gradient_predivide_factor; turn LIGHT_* settings off for these"
    )
  if backward_passes_per_step != 1 or groups or num_groups:
    raise NotImplementedError(
      "LightCC: backward_passes_per_step > 1 and explicit groups are not "
      "supported with LIGHT_* settings on yet"
    )


class _LightGradientTape(tf.GradientTape):
  """A GradientTape whose gradient() reduces over all ranks with reduce_gradients."""

  def gradient(
    self, target, sources, output_gradients=None, unconnected_gradients=tf.UnconnectedGradients.NONE
  ):
    grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
    flat = reduce_gradients(
      tf.nest.flatten(grads),
      tf.nest.flatten(sources),
      op=self._lightcc_op,
      compression=self._lightcc_compression,
      sparse_as_dense=self._lightcc_sparse_as_dense,
    )
    return tf.nest.pack_sequence_as(grads, flat)


def DistributedGradientTape(
  gradtape,
  device_dense="",
  device_sparse="",
  compression=Compression.none,
  sparse_as_dense=False,
  op=Average,
  gradient_predivide_factor=1.0,
  num_groups=0,
  groups=None,
  process_set=global_process_set,
  **kwargs,
):
  """horovod.tensorflow.DistributedGradientTape; LightCC's reduction when settings are on."""
  if not _state.config.enabled:
    return _hvd.DistributedGradientTape(
      gradtape,
      device_dense=device_dense,
      device_sparse=device_sparse,
      compression=compression,
      sparse_as_dense=sparse_as_dense,
      op=op,
      gradient_predivide_factor=gradient_predivide_factor,
      num_groups=num_groups,
      groups=groups,
      process_set=process_set,
      **kwargs,
    )
  _check_supported(process_set, gradient_predivide_factor, groups=groups, num_groups=num_groups)
  tape = _LightGradientTape.__new__(_LightGradientTape)
  tape.__dict__.update(gradtape.__dict__)
  tape._lightcc_op, tape._lightcc_compression = op, compression
  tape._lightcc_sparse_as_dense = sparse_as_dense
  return tape


class _LightOptimizer(tf.compat.v1.train.Optimizer):
  """Wraps a tf.compat.v1.train optimizer: gradients are reduced in compute_gradients."""

  def __init__(self, optimizer, name, op, compression, sparse_as_dense):
    super().__init__(name=name or f"LightCC{type(optimizer).__name__}", use_locking=False)
    self._optimizer = optimizer
    self._op, self._compression, self._sparse_as_dense = op, compression, sparse_as_dense

  def compute_gradients(self, *args, **kwargs):
    grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
    grads = reduce_gradients(
      [g for g, _ in grads_and_vars],
      [v for _, v in grads_and_vars],
      self._op,
      self._compression,
      self._sparse_as_dense,
    )
    return list(zip(grads, [v for _, v in grads_and_vars]))

  def apply_gradients(self, *args, **kwargs):
    return self._optimizer.apply_gradients(*args, **kwargs)

  def get_slot(self, *args, **kwargs):
    return self._optimizer.get_slot(*args, **kwargs)

  def get_slot_names(self, *args, **kwargs):
    return self._optimizer.get_slot_names(*args, **kwargs)

  def variables(self, *args, **kwargs):
    return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
  optimizer,
  name=None,
  use_locking=False,
  device_dense="",
  device_sparse="",
  compression=Compression.none,
  sparse_as_dense=False,
  backward_passes_per_step=1,
  op=Average,
  gradient_predivide_factor=1.0,
  average_aggregated_gradients=False,
  num_groups=0,
  groups=None,
  process_set=global_process_set,
  **kwargs,
):
  """horovod.tensorflow.DistributedOptimizer; LightCC's reduction when settings are on."""
  if not _state.config.enabled:
    return _hvd.DistributedOptimizer(
      optimizer,
      name=name,
      use_locking=use_locking,
      device_dense=device_dense,
      device_sparse=device_sparse,
      compression=compression,
      sparse_as_dense=sparse_as_dense,
      backward_passes_per_step=backward_passes_per_step,
      op=op,
      gradient_predivide_factor=gradient_predivide_factor,
      average_aggregated_gradients=average_aggregated_gradients,
      num_groups=num_groups,
      groups=groups,
      process_set=process_set,
      **kwargs,
    )
  _check_supported(
    process_set, gradient_predivide_factor, backward_passes_per_step, groups, num_groups
  )
  if isinstance(optimizer, tf.compat.v1.train.Optimizer):
    return _LightOptimizer(optimizer, name, op, compression, sparse_as_dense)
  from tf_ext.lightcc import keras as _keras  # Keras optimizers, as horovod.tensorflow does

  return _keras.DistributedOptimizer(
    optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense, op=op
  )

"""horovod.tensorflow's DistributedOptimizer and DistributedGradientTape, and the Keras
DistributedOptimizer and load_model: Horovod's own with every LIGHT_* setting off; with settings
on, the "reduce" stage of the optimizer pipeline (tf_ext/optimizer_pipeline.py), whose transform
is LightCC's reduce_gradients, added to the optimizer or tape the user passes (or loads)."""

import inspect

import horovod.tensorflow as _hvd
import horovod.tensorflow.keras as _hvd_keras
import tensorflow as tf
from horovod.tensorflow import Average, Compression, global_process_set

from tf_ext import optimizer_pipeline, rank_local_gradients
from tf_ext.lightcc import reduction, state


class ReduceStage(optimizer_pipeline.Stage):
  """The pipeline's "reduce" step: gradients are reduced over all ranks with LightCC."""

  kind = "reduce"

  def __init__(self, op, compression, sparse_as_dense):
    self.op, self.compression, self.sparse_as_dense = op, compression, sparse_as_dense

  def transform(self, grads_and_vars):
    grads_and_vars = list(grads_and_vars)
    # Rank-local gradients (all-to-all tables) are exchanged already: scaled as Horovod scales
    # its local variables' gradients, not reduced.
    local = [i for i, (_, v) in enumerate(grads_and_vars) if rank_local_gradients.is_rank_local(v)]
    reduced = [p for i, p in enumerate(grads_and_vars) if i not in local]
    variables = [v for _, v in reduced]
    grads = reduction.reduce_gradients(
      [g for g, _ in reduced],
      variables,
      op=self.op,
      compression=self.compression,
      sparse_as_dense=self.sparse_as_dense,
    )
    out = iter(zip(grads, variables))
    return [
      (_scaled_local(g, self.op), v) if i in local else next(out)
      for i, (g, v) in enumerate(grads_and_vars)
    ]


def _scaled_local(gradient, op):
  """A rank-local gradient divided by the number of ranks when the reduction averages."""
  if gradient is None or op != Average:
    return gradient
  size = float(_hvd.size())
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(gradient.values / size, gradient.indices, gradient.dense_shape)
  return gradient / size


def _with_reduce_stage(
  target,
  op,
  compression,
  sparse_as_dense,
  process_set,
  gradient_predivide_factor,
  backward_passes_per_step=1,
  groups=None,
  num_groups=0,
  **unused,
):
  """`target` (an optimizer or a tape) with the reduce stage, after checking what LightCC
  supports; the Horovod arguments LightCC has no use for (names, devices) are ignored."""
  del unused
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
  return optimizer_pipeline.add_stage(target, ReduceStage(op, compression, sparse_as_dense))


def _arguments(function, local_variables):
  """The arguments `function` was called with (from its locals(), which, in code that autograph
  converted, also hold autograph's own names), to pass on to Horovod's function of that name."""
  parameters = inspect.signature(function).parameters
  arguments = {name: local_variables[name] for name in parameters if name != "kwargs"}
  return {**arguments, **local_variables["kwargs"]}


def DistributedGradientTape(  # noqa: N802 (Horovod's name)
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
  """horovod.tensorflow.DistributedGradientTape; LightCC's reduction when settings are on (the
  tape itself is returned, its gradient() extended)."""
  arguments = _arguments(DistributedGradientTape, locals())
  if not state.process.config.enabled:
    return rank_local_gradients.keep_local(_hvd.DistributedGradientTape(**arguments))
  return _with_reduce_stage(arguments.pop("gradtape"), **arguments)


def DistributedOptimizer(  # noqa: N802 (Horovod's name)
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
  """horovod.tensorflow.DistributedOptimizer; LightCC's reduction when settings are on (the
  optimizer itself is returned, with the pipeline's reduce stage: see optimizer_pipeline)."""
  arguments = _arguments(DistributedOptimizer, locals())
  if not state.process.config.enabled:
    return rank_local_gradients.keep_local(_hvd.DistributedOptimizer(**arguments))
  return _with_reduce_stage(arguments.pop("optimizer"), **arguments)


def KerasDistributedOptimizer(  # noqa: N802 (Horovod's name, as tf_ext.lightcc.keras exports it)
  optimizer,
  name=None,
  device_dense="",
  device_sparse="",
  compression=Compression.none,
  sparse_as_dense=False,
  gradient_predivide_factor=1.0,
  op=Average,
  backward_passes_per_step=1,
  average_aggregated_gradients=False,
  num_groups=0,
  groups=None,
  process_set=global_process_set,
  **kwargs,
):
  """horovod.tensorflow.keras.DistributedOptimizer; LightCC's reduction when settings are on.

  The optimizer object keeps its class name and config; with settings on, its apply_gradients
  first reduces the gradients over all ranks (the pipeline's reduce stage), so it composes with
  tf_ext.DynamicEmbeddingOptimizer in either order.
  """
  arguments = _arguments(KerasDistributedOptimizer, locals())
  if not state.process.config.enabled:
    return rank_local_gradients.keep_local(_hvd_keras.DistributedOptimizer(**arguments))
  return _with_reduce_stage(arguments.pop("optimizer"), **arguments)


def load_model(
  filepath,
  custom_optimizers=None,
  custom_objects=None,
  compression=Compression.none,
  legacy_opts=False,
):
  """horovod.tensorflow.keras.load_model; with LIGHT_* settings on, the loaded optimizer, its
  state kept, reduces its gradients with LightCC (as KerasDistributedOptimizer makes it) instead
  of Horovod's DistributedOptimizer."""
  if not state.process.config.enabled:
    return _hvd_keras.load_model(
      filepath, custom_optimizers, custom_objects, compression, legacy_opts
    )
  # Horovod's load_model maps optimizer names (of legacy_opts' kind) to its own wrapper; here the
  # optimizer loads as saved (custom_optimizers only have to be found) and gets the reduce stage
  # in place.
  objects = {cls.__name__: cls for cls in custom_optimizers or ()}
  objects.update(custom_objects or {})
  model = tf.keras.models.load_model(filepath, custom_objects=objects)
  if model.optimizer is not None:
    KerasDistributedOptimizer(model.optimizer, compression=compression)
  return model

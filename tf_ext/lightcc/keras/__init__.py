"""LightCC for Keras: `import tf_ext.lightcc.keras as hvd` wherever `horovod.tensorflow.keras` works.

Every public name of horovod.tensorflow.keras is here; init and the LightCC extras are
tf_ext.lightcc's, and DistributedOptimizer reduces gradients the LightCC way when LIGHT_*
settings are on (Horovod's own optimizer otherwise).
"""

import horovod.tensorflow.keras as _hvd_keras

import tf_ext.lightcc as _lightcc
from tf_ext.lightcc import _reexport
from tf_ext.lightcc.keras import callbacks

globals().update(_reexport.public_names(_hvd_keras, exclude=("callbacks",)))
init, light_config, traffic, reset_traffic = (
  _lightcc.init,
  _lightcc.light_config,
  _lightcc.traffic,
  _lightcc.reset_traffic,
)
allreduce_gradients = _lightcc.reduce_gradients


def DistributedOptimizer(
  optimizer,
  name=None,
  device_dense="",
  device_sparse="",
  compression=_lightcc.Compression.none,
  sparse_as_dense=False,
  gradient_predivide_factor=1.0,
  op=_lightcc.Average,
  backward_passes_per_step=1,
  average_aggregated_gradients=False,
  num_groups=0,
  groups=None,
  process_set=_lightcc.global_process_set,
  **kwargs,
):
  """horovod.tensorflow.keras.DistributedOptimizer; LightCC's reduction when settings are on.

  The optimizer object keeps its class name and config, extended so that apply_gradients first
  reduces the gradients over all ranks (so it composes with tf_ext.DynamicEmbeddingOptimizer).
  """
  if not _lightcc.light_config().enabled:
    return _hvd_keras.DistributedOptimizer(
      optimizer,
      name=name,
      device_dense=device_dense,
      device_sparse=device_sparse,
      compression=compression,
      sparse_as_dense=sparse_as_dense,
      gradient_predivide_factor=gradient_predivide_factor,
      op=op,
      backward_passes_per_step=backward_passes_per_step,
      average_aggregated_gradients=average_aggregated_gradients,
      num_groups=num_groups,
      groups=groups,
      process_set=process_set,
      **kwargs,
    )
  _lightcc._check_supported(
    process_set, gradient_predivide_factor, backward_passes_per_step, groups, num_groups
  )
  base = type(optimizer)

  def apply_gradients(self, grads_and_vars, *args, **kw):
    grads_and_vars = list(grads_and_vars)
    variables = [v for _, v in grads_and_vars]
    grads = _lightcc.reduce_gradients(
      [g for g, _ in grads_and_vars],
      variables,
      op=op,
      compression=compression,
      sparse_as_dense=sparse_as_dense,
    )
    return super(cls, self).apply_gradients(list(zip(grads, variables)), *args, **kw)

  cls = type(
    base.__name__, (base,), {"apply_gradients": apply_gradients, "__module__": base.__module__}
  )
  optimizer.__class__ = cls
  return optimizer

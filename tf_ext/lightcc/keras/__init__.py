"""LightCC for Keras: `import tf_ext.lightcc.keras as hvd` wherever horovod.tensorflow.keras works.

init and the LightCC extras are tf_ext.lightcc's; DistributedOptimizer, and the optimizer of a
model load_model loads, reduce gradients the LightCC way when LIGHT_* settings are on (Horovod's
own otherwise); elastic's run and KerasState carry LightCC's state (keras/elastic.py). Horovod's
public Keras API is re-exported below by name; any other attribute of horovod.tensorflow.keras
resolves to Horovod's own object.
"""

import horovod.tensorflow.keras as _hvd_keras
from horovod.tensorflow.keras import (
  Average,
  Compression,
  ProcessSet,
  Sum,
  add_process_set,
  allgather,
  allreduce,
  broadcast,
  broadcast_global_variables,
  ccl_built,
  cross_rank,
  cross_size,
  cuda_built,
  ddl_built,
  global_process_set,
  gloo_built,
  gloo_enabled,
  is_initialized,
  local_rank,
  local_size,
  mpi_built,
  mpi_enabled,
  mpi_threads_supported,
  nccl_built,
  rank,
  reducescatter,
  remove_process_set,
  rocm_built,
  shutdown,
  size,
  start_timeline,
  stop_timeline,
)

from tf_ext.lightcc import _reexport
from tf_ext.lightcc.keras import callbacks, elastic
from tf_ext.lightcc.reduction import reduce_gradients as allreduce_gradients
from tf_ext.lightcc.state import init, light_config, reset_traffic, traffic
from tf_ext.lightcc.wrappers import KerasDistributedOptimizer as DistributedOptimizer
from tf_ext.lightcc.wrappers import load_model

__all__ = [
  # LightCC's own (or its versions of Horovod's).
  "DistributedOptimizer",
  "allreduce_gradients",
  "callbacks",
  "elastic",
  "init",
  "light_config",
  "load_model",
  "reset_traffic",
  "traffic",
  # Horovod's, re-exported unchanged: `from ... import *` works as with Horovod.
  "Average",
  "Compression",
  "ProcessSet",
  "Sum",
  "add_process_set",
  "allgather",
  "allreduce",
  "broadcast",
  "broadcast_global_variables",
  "ccl_built",
  "cross_rank",
  "cross_size",
  "cuda_built",
  "ddl_built",
  "global_process_set",
  "gloo_built",
  "gloo_enabled",
  "is_initialized",
  "local_rank",
  "local_size",
  "mpi_built",
  "mpi_enabled",
  "mpi_threads_supported",
  "nccl_built",
  "rank",
  "reducescatter",
  "remove_process_set",
  "rocm_built",
  "shutdown",
  "size",
  "start_timeline",
  "stop_timeline",
]

__getattr__, __dir__ = _reexport.fallback(__name__, globals(), _hvd_keras)

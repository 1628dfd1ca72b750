"""LightCC: `import tf_ext.lightcc as hvd` wherever `import horovod.tensorflow as hvd` works.

With every LIGHT_* setting off (the default), init, allreduce, DistributedOptimizer and
DistributedGradientTape *are* Horovod's: same code, same numerics. With settings on (environment,
or `hvd.init(light_2d_allreduce=1, ...)`):

  - LIGHT_2D_ALLREDUCE: dense allreduces of Sum/Average go group-then-column (collectives.py),
  - LIGHT_TOPK_ALLREDUCE: gradients of at least LIGHT_TOPK_THRESHOLD bytes send only their top
    LIGHT_TOPK_RATIO entries, with error feedback (and fp16 values with LIGHT_TOPK_FP16); with 2D
    on, only the inter-group leg is compressed,
  - LIGHT_FUSION: dense gradients (TOPK ones included) go out in buckets whose size follows the
    measured step time (fusion.py).

Per-step traffic: `hvd.traffic()` (bytes sent inside groups, across groups, and the compression
ratio against Horovod's flat ring allreduce); `hvd.reset_traffic()` starts a new count.

Modules: state.py (init, configuration, per-graph state), collectives.py (2D allreduce, the TOPK
exchange, allreduce / grouped_allreduce), reduction.py (one step's gradients: 2D, TOPK, fusion),
wrappers.py (DistributedOptimizer, DistributedGradientTape, through tf_ext.optimizer_pipeline).
Horovod's public API is re-exported below by name; any other attribute of horovod.tensorflow
resolves to Horovod's own object (_reexport.py).
"""

import horovod.tensorflow as _hvd

# Horovod's public API that LightCC does not change, by name.
from horovod.tensorflow import (
  Adasum,
  Average,
  BroadcastGlobalVariablesHook,
  Compression,
  LocalGradientAggregationHelper,
  Max,
  Min,
  PartialDistributedGradientTape,
  ProcessSet,
  Product,
  Sum,
  SyncBatchNormalization,
  add_process_set,
  allgather,
  allgather_object,
  alltoall,
  broadcast,
  broadcast_,
  broadcast_global_variables,
  broadcast_object,
  broadcast_object_fn,
  broadcast_variables,
  ccl_built,
  check_extension,
  check_num_rank_power_of_2,
  compression,
  cross_rank,
  cross_size,
  cuda_built,
  ddl_built,
  functions,
  global_process_set,
  gloo_built,
  gloo_enabled,
  gpu_available,
  gradient_aggregation,
  gradient_aggregation_eager,
  grouped_allgather,
  grouped_reducescatter,
  handle_average_backwards_compatibility,
  is_homogeneous,
  is_initialized,
  join,
  local_rank,
  local_rank_op,
  local_size,
  local_size_op,
  mpi_built,
  mpi_enabled,
  mpi_ops,
  mpi_threads_supported,
  nccl_built,
  process_set_included_op,
  rank,
  rank_op,
  reducescatter,
  refs_to_vars,
  remove_process_set,
  rocm_built,
  shutdown,
  size,
  size_op,
  split_list,
  start_timeline,
  stop_timeline,
  sync_batch_norm,
  util,
  vars_to_refs,
)

from tf_ext.lightcc import _reexport, elastic
from tf_ext.lightcc.collectives import allreduce, grouped_allreduce
from tf_ext.lightcc.reduction import (
  FusionStepFunction,
  freeze_settled_fusion,
  fusion_graph_key,
  fusion_policies,
  reduce_gradients,
)
from tf_ext.lightcc.state import init, light_config, reset_traffic, traffic
from tf_ext.lightcc.wrappers import DistributedGradientTape, DistributedOptimizer

__all__ = [
  # LightCC's own (or its versions of Horovod's).
  "DistributedGradientTape",
  "DistributedOptimizer",
  "FusionStepFunction",
  "allreduce",
  "freeze_settled_fusion",
  "fusion_graph_key",
  "fusion_policies",
  "grouped_allreduce",
  "init",
  "light_config",
  "reduce_gradients",
  "reset_traffic",
  "traffic",
  # Horovod's, re-exported unchanged: `from ... import *` works as with Horovod.
  "Adasum",
  "Average",
  "BroadcastGlobalVariablesHook",
  "Compression",
  "LocalGradientAggregationHelper",
  "Max",
  "Min",
  "PartialDistributedGradientTape",
  "ProcessSet",
  "Product",
  "Sum",
  "SyncBatchNormalization",
  "add_process_set",
  "allgather",
  "allgather_object",
  "alltoall",
  "broadcast",
  "broadcast_",
  "broadcast_global_variables",
  "broadcast_object",
  "broadcast_object_fn",
  "broadcast_variables",
  "ccl_built",
  "check_extension",
  "check_num_rank_power_of_2",
  "compression",
  "cross_rank",
  "cross_size",
  "cuda_built",
  "ddl_built",
  "elastic",
  "functions",
  "global_process_set",
  "gloo_built",
  "gloo_enabled",
  "gpu_available",
  "gradient_aggregation",
  "gradient_aggregation_eager",
  "grouped_allgather",
  "grouped_reducescatter",
  "handle_average_backwards_compatibility",
  "is_homogeneous",
  "is_initialized",
  "join",
  "local_rank",
  "local_rank_op",
  "local_size",
  "local_size_op",
  "mpi_built",
  "mpi_enabled",
  "mpi_ops",
  "mpi_threads_supported",
  "nccl_built",
  "process_set_included_op",
  "rank",
  "rank_op",
  "reducescatter",
  "refs_to_vars",
  "remove_process_set",
  "rocm_built",
  "shutdown",
  "size",
  "size_op",
  "split_list",
  "start_timeline",
  "stop_timeline",
  "sync_batch_norm",
  "util",
  "vars_to_refs",
]

# `keras` is tf_ext.lightcc.keras (horovod.tensorflow.keras's stand-in), imported on first use.
__getattr__, __dir__ = _reexport.fallback(__name__, globals(), _hvd, own_submodules=("keras",))

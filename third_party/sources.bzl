# The one description of what tf_ext compiles, read by both builds: Bazel loads it
# (third_party/capabilities.bzl generates the targets) and setup.py reads it with
# `ast.literal_eval`, so it holds plain literals only.
#
# CAPABILITIES: name -> what the capability compiles, all paths relative to the workspace root.
#   core_hdrs, core_srcs      its TensorFlow-free core (//:<name>_core): plain C++17, unit-tested
#                             alone by tests/kernels/<name>/*_test.cc (googletest)
#   kernel_hdrs, kernel_srcs  its TensorFlow kernels, thin adapters over the core
#   op_srcs                   its op interfaces (ops/*.cc: REGISTER_OP, shape functions, .Doc)
#                             kernels and ops together are //:<name>_kernels (alwayslink)
#   deps                      the capabilities this one builds on, acyclic: its core, kernels
#                             and ops may include their cores (nothing else of theirs: Bazel
#                             enforces it, and tests/build/test_capabilities.py), and its Python
#                             package tf_ext/<name> may import their packages
#                             (tests/build/test_import_graph.py)
#   cuda_srcs, cuda_hdrs, cuda_fallback_srcs (optional)
#                             CUDA sources of its core, compiled by nvcc into //:<name>_cuda (a
#                             static archive with the CUDA runtime) when TF_EXT_CUDA and nvcc say
#                             so (third_party/cuda_library.sh); else the fallback sources, plain
#                             C++ that defines the same functions and reports that the build has
#                             no CUDA. They include only the core's headers.
#   plugin (optional)         a shared library of its own, without TensorFlow: {"path": output
#                             path in the package, "srcs": [...]}; it links the capability's
#                             core, and both are compiled with hidden symbol visibility, so the
#                             library exports only what its sources mark as exported
#
# OP_LIBRARY: the one TensorFlow op library: every capability's kernels and ops plus these
# common sources. `path` is both the Bazel target's name and the file tf_ext loads.
#   srcs                      the op library's own sources
#   hdrs                      TensorFlow helpers shared by several capabilities: every
#                             capability's kernels and ops may include them (//:op_library_hdrs);
#                             cores, plugins and C++ tests may not, and they include no
#                             capability's header
CAPABILITIES = {
    "dynamic_embedding": {
        "core_hdrs": [
            "kernels/dynamic_embedding/core/admission.h",
            "kernels/dynamic_embedding/core/chunk_arena.h",
            "kernels/dynamic_embedding/core/column_windows.h",
            "kernels/dynamic_embedding/core/combiners.h",
            "kernels/dynamic_embedding/core/distinct_lookup.h",
            "kernels/dynamic_embedding/core/embedding_table.h",
            "kernels/dynamic_embedding/core/embedding_table_entries.h",
            "kernels/dynamic_embedding/core/embedding_table_lookup.h",
            "kernels/dynamic_embedding/core/embedding_table_removal.h",
            "kernels/dynamic_embedding/core/embedding_table_sink.h",
            "kernels/dynamic_embedding/core/embedding_table_snapshot.h",
            "kernels/dynamic_embedding/core/embedding_table_update.h",
            "kernels/dynamic_embedding/core/gpu/device_atomics.h",
            "kernels/dynamic_embedding/core/gpu/device_memory.h",
            "kernels/dynamic_embedding/core/gpu/device_slots.h",
            "kernels/dynamic_embedding/core/gpu/device_snapshot_file.h",
            "kernels/dynamic_embedding/core/gpu/device_table.h",
            "kernels/dynamic_embedding/core/gpu/device_table_growth.h",
            "kernels/dynamic_embedding/core/gpu/device_table_impl.h",
            "kernels/dynamic_embedding/core/gpu/device_table_lookup.h",
            "kernels/dynamic_embedding/core/gpu/device_table_removal.h",
            "kernels/dynamic_embedding/core/gpu/device_table_snapshot.h",
            "kernels/dynamic_embedding/core/gpu/device_table_statistics.h",
            "kernels/dynamic_embedding/core/gpu/device_table_update.h",
            "kernels/dynamic_embedding/core/gpu/host_exec.h",
            "kernels/dynamic_embedding/core/host_device.h",
            "kernels/dynamic_embedding/core/huge_pages.h",
            "kernels/dynamic_embedding/core/initializers.h",
            "kernels/dynamic_embedding/core/limits.h",
            "kernels/dynamic_embedding/core/optimizer_elements.h",
            "kernels/dynamic_embedding/core/optimizer_params.h",
            "kernels/dynamic_embedding/core/optimizer_row_step.h",
            "kernels/dynamic_embedding/core/optimizers.h",
            "kernels/dynamic_embedding/core/prefetch.h",
            "kernels/dynamic_embedding/core/rw_spinlock.h",
            "kernels/dynamic_embedding/core/sharding.h",
            "kernels/dynamic_embedding/core/snapshot_file.h",
            "kernels/dynamic_embedding/core/snapshot_restore.h",
            "kernels/dynamic_embedding/core/table_error.h",
            "kernels/dynamic_embedding/core/table_policies.h",
        ],
        "core_srcs": [
            "kernels/dynamic_embedding/core/column_windows.cc",
            "kernels/dynamic_embedding/core/combiners.cc",
            "kernels/dynamic_embedding/core/gpu/device_snapshot_file.cc",
            "kernels/dynamic_embedding/core/gpu/emulated_gpu_table.cc",
            "kernels/dynamic_embedding/core/initializers.cc",
            "kernels/dynamic_embedding/core/snapshot_file.cc",
            "kernels/dynamic_embedding/core/snapshot_restore.cc",
        ],
        "kernel_hdrs": [
            "kernels/dynamic_embedding/apply_rows.h",
            "kernels/dynamic_embedding/fused_fields.h",
            "kernels/dynamic_embedding/table_backend.h",
            "kernels/dynamic_embedding/table_kernel.h",
            "kernels/dynamic_embedding/table_resource.h",
            "kernels/dynamic_embedding/table_restore.h",
        ],
        "kernel_srcs": [
            "kernels/dynamic_embedding/checkpoint_kernels.cc",
            "kernels/dynamic_embedding/fused_apply_kernels.cc",
            "kernels/dynamic_embedding/fused_lookup_kernels.cc",
            "kernels/dynamic_embedding/lifecycle_kernels.cc",
            "kernels/dynamic_embedding/optimizer_kernels.cc",
            "kernels/dynamic_embedding/sharding_kernels.cc",
            "kernels/dynamic_embedding/table_backend.cc",
            "kernels/dynamic_embedding/table_kernels.cc",
        ],
        "op_srcs": [
            "ops/dynamic_embedding_checkpoint_ops.cc",
            "ops/dynamic_embedding_fusion_ops.cc",
            "ops/dynamic_embedding_lifecycle_ops.cc",
            "ops/dynamic_embedding_ops.cc",
            "ops/dynamic_embedding_optimizer_ops.cc",
            "ops/dynamic_embedding_sharding_ops.cc",
        ],
        "cuda_srcs": ["kernels/dynamic_embedding/core/gpu/cuda_table.cu"],
        "cuda_hdrs": ["kernels/dynamic_embedding/core/gpu/cuda_exec.cuh"],
        "cuda_fallback_srcs": ["kernels/dynamic_embedding/core/gpu/no_cuda_table.cc"],
        "deps": [],
    },
    "lightcc": {
        "core_hdrs": [
            "kernels/lightcc/core/topk_compression.h",
        ],
        "core_srcs": [
            "kernels/lightcc/core/topk_compression.cc",
        ],
        "kernel_hdrs": [],
        "kernel_srcs": [
            "kernels/lightcc/topk_kernels.cc",
        ],
        "op_srcs": [
            "ops/lightcc_ops.cc",
        ],
        "deps": ["harp"],  # LIGHT_HARP points LightCC's NCCL at HARP's plugin
    },
    # Loss-aware mixed precision: the policy that chooses half or full precision per step, and the
    # graph rewrite that gives a training step both versions.
    "mixed_precision": {
        "core_hdrs": [
            "kernels/mixed_precision/core/half_precision_plan.h",
            "kernels/mixed_precision/core/loss_aware_policy.h",
        ],
        "core_srcs": [
            "kernels/mixed_precision/core/half_precision_plan.cc",
            "kernels/mixed_precision/core/loss_aware_policy.cc",
        ],
        "kernel_hdrs": [],
        "kernel_srcs": [
            "kernels/mixed_precision/half_rewrite_pass.cc",
            "kernels/mixed_precision/policy_kernels.cc",
        ],
        "op_srcs": [
            "ops/mixed_precision_ops.cc",
        ],
        "deps": [],
    },
    # Graph passes for recommendation models: embedding lookups and their applies fused into one
    # op each, and the dense part around the tables clustered for XLA. The fused ops themselves
    # are the dynamic_embedding capability's.
    "graph": {
        "core_hdrs": [
            "kernels/graph/core/pass_switches.h",
        ],
        "core_srcs": [
            "kernels/graph/core/pass_switches.cc",
        ],
        "kernel_hdrs": [
            "kernels/graph/embedding_fusion_match.h",
            "kernels/graph/embedding_fusion_rewrite.h",
            "kernels/graph/pass_switches.h",
        ],
        "kernel_srcs": [
            "kernels/graph/embedding_fusion_match.cc",
            "kernels/graph/embedding_fusion_pass.cc",
            "kernels/graph/embedding_fusion_rewrite.cc",
            "kernels/graph/pass_switches.cc",
            "kernels/graph/xla_dense_cluster_pass.cc",
        ],
        "op_srcs": [],
        "deps": [],
    },
    # tf_ext.jit's compilation cache in a Session: the log of TensorFlow's XLA compilations, the
    # switch for its asynchronous compilation, and the speed gate that runs a cluster compiled only
    # where that makes the steps faster.
    "jit": {
        "core_hdrs": [
            "kernels/jit/core/compile_log.h",
            "kernels/jit/core/speed_gate.h",
        ],
        "core_srcs": [
            "kernels/jit/core/compile_log.cc",
            "kernels/jit/core/speed_gate.cc",
        ],
        "kernel_hdrs": [],
        "kernel_srcs": [
            "kernels/jit/xla_compile_listener.cc",
            "kernels/jit/xla_speed_gate_pass.cc",
        ],
        "op_srcs": [
            "ops/jit_ops.cc",
        ],
        "deps": ["dynamic_embedding"],  # jit.compile runs models with tables uncompiled
    },
    # HARP, the NCCL network plugin: no TensorFlow at all. NCCL loads libnccl-net-<name>.so.
    "harp": {
        "core_hdrs": [
            "kernels/harp/core/build_info.h",
            "kernels/harp/core/config.h",
            "kernels/harp/core/interface_choice.h",
            "kernels/harp/core/nccl_net_abi.h",
            "kernels/harp/core/spsc_ring.h",
            "kernels/harp/core/transport.h",
            "kernels/harp/core/transport_internal.h",
            "kernels/harp/core/wire_format.h",
        ],
        "core_srcs": [
            "kernels/harp/core/build_info.cc",
            "kernels/harp/core/config.cc",
            "kernels/harp/core/interface_choice.cc",
            "kernels/harp/core/transport_caller.cc",
            "kernels/harp/core/transport_receive.cc",
            "kernels/harp/core/transport_send.cc",
            "kernels/harp/core/transport_setup.cc",
            "kernels/harp/core/transport_worker.cc",
            "kernels/harp/core/wire_format.cc",
        ],
        "kernel_hdrs": [],
        "kernel_srcs": [],
        "op_srcs": [],
        "deps": [],
        "plugin": {
            "path": "tf_ext/harp/libnccl-net-harp.so",
            "srcs": ["kernels/harp/nccl_net_plugin.cc"],
        },
    },
}

OP_LIBRARY = {
    "path": "tf_ext/_tf_ext_ops.so",
    # The TensorFlow version and C++ ABI marker that tf_ext/_ops_loader.py checks before loading.
    "srcs": ["kernels/build_info.cc"],
    # Which nodes a walk along a graph's edges reaches (graph's and mixed_precision's passes), and
    # when each graph pass runs (graph's, mixed_precision's and jit's).
    "hdrs": ["kernels/pass_phases.h", "kernels/reachable_nodes.h"],
}

# The one list of the op library's sources. Bazel loads this file; setup.py reads the same
# assignments with Python's `ast` module, so both builds compile exactly these files.

# The cores (embedding table, TOPK compression): no TensorFlow types, unit-tested alone with
# googletest.
CORE_HDRS = [
    "kernels/dynamic_embedding/core/embedding_table.h",
    "kernels/dynamic_embedding/core/initializers.h",
    "kernels/dynamic_embedding/core/optimizers.h",
    "kernels/dynamic_embedding/core/rw_spinlock.h",
    "kernels/lightcc/core/topk_compression.h",
]

CORE_SRCS = [
    "kernels/dynamic_embedding/core/initializers.cc",
    "kernels/lightcc/core/topk_compression.cc",
]

# Thin TensorFlow adapters: op interfaces and kernels.
OP_LIBRARY_HDRS = [
    "kernels/dynamic_embedding/table_resource.h",
]

OP_LIBRARY_SRCS = [
    "ops/dynamic_embedding_ops.cc",
    "kernels/dynamic_embedding/table_kernels.cc",
    "ops/lightcc_ops.cc",
    "kernels/lightcc/topk_kernels.cc",
    "kernels/build_info.cc",
]

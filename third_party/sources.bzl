# The one list of the op library's sources. Bazel loads this file; setup.py reads the same
# assignments with Python's `ast` module, so both builds compile exactly these files.

# The table core: no TensorFlow types, unit-tested alone with googletest.
CORE_HDRS = [
    "kernels/dynamic_embedding/core/embedding_table.h",
    "kernels/dynamic_embedding/core/initializers.h",
    "kernels/dynamic_embedding/core/optimizers.h",
    "kernels/dynamic_embedding/core/rw_spinlock.h",
]

CORE_SRCS = [
    "kernels/dynamic_embedding/core/initializers.cc",
]

# Thin TensorFlow adapters: op interfaces and kernels.
OP_LIBRARY_HDRS = [
    "kernels/dynamic_embedding/table_resource.h",
]

OP_LIBRARY_SRCS = [
    "ops/dynamic_embedding_ops.cc",
    "kernels/dynamic_embedding/table_kernels.cc",
    "kernels/build_info.cc",
]

"""Generates the C++ targets of every capability from //third_party:sources.bzl.

For each capability NAME (see sources.bzl for the fields):
  //:NAME_core     cc_library, TensorFlow-free; deps: the cores of NAME's declared deps
  //:NAME_kernels  cc_library (alwayslink), kernels and op interfaces; deps: NAME's core, the
                   cores of its declared deps, the op library's common headers, TensorFlow's
                   headers (only when NAME has kernels)
  //:<plugin path> cc_binary (linkshared), NAME's plugin library without TensorFlow
the op library's common headers //:op_library_hdrs (OP_LIBRARY's hdrs: TensorFlow helpers that
every NAME_kernels may include), and the op library //:<OP_LIBRARY path>
(//:tf_ext/_tf_ext_ops.so) linking every NAME_kernels (kernel_libraries()).

A capability reaches another capability's headers only through `deps`: Bazel's sandbox holds
only the declared headers, and its undeclared-inclusion check rejects anything else.
"""

load("//third_party:sources.bzl", "CAPABILITIES", "OP_LIBRARY")

_TF_HEADERS = "@local_tensorflow//:tf_headers"
_TF_FRAMEWORK = "@local_tensorflow//:libtensorflow_framework"

# The TensorFlow-free cores are our own code only: every warning is an error there.
_CORE_WARNINGS = ["-Wall", "-Wextra", "-Werror"]

# A plugin is dlopen'ed into foreign processes (NCCL's): it exports only what it marks, and it
# stays mapped once loaded (NCCL may dlclose it while its worker threads still run).
_PLUGIN_COPTS = ["-fvisibility=hidden"]
_PLUGIN_LINKOPTS = ["-Wl,-z,nodelete"]

def _check(name, capability):
    for dep in capability["deps"]:
        if dep not in CAPABILITIES:
            fail("capability %s depends on %s, which sources.bzl does not describe" % (name, dep))
        if dep == name:
            fail("capability %s depends on itself" % name)

def _cuda_library(name, capability):
    """//:NAME_cuda: NAME's CUDA sources (or their fallback) as a static archive."""
    cuda_srcs = capability["cuda_srcs"]
    fallback = capability["cuda_fallback_srcs"]
    native.genrule(
        name = name + "_cuda_archive",
        srcs = cuda_srcs + capability.get("cuda_hdrs", []) + fallback + capability["core_hdrs"],
        outs = ["lib%s_cuda.a" % name],
        cmd = "$(location //third_party:cuda_library.sh) $@ '%s' '%s'" % (
            " ".join(cuda_srcs),
            " ".join(fallback),
        ),
        tools = ["//third_party:cuda_library.sh"],
    )
    native.cc_library(
        name = name + "_cuda",
        srcs = ["lib%s_cuda.a" % name],
        # The CUDA runtime inside loads the driver with dlopen, and uses clock_gettime. Its symbols
        # stay local to the library that links it: a process may hold another CUDA runtime
        # (TensorFlow's), and ours must never call into it, nor it into ours.
        linkopts = ["-ldl", "-lrt", "-Wl,--exclude-libs,lib%s_cuda.a" % name],
        linkstatic = 1,
    )

def capability_targets():
    """Declares the targets above; call once, from //:BUILD."""
    native.cc_library(
        name = "op_library_hdrs",
        hdrs = OP_LIBRARY["hdrs"],
        deps = [_TF_HEADERS],
    )
    for name, capability in CAPABILITIES.items():
        _check(name, capability)
        dep_cores = [":%s_core" % dep for dep in capability["deps"]]
        plugin = capability.get("plugin")
        cuda = []
        if capability.get("cuda_srcs"):
            _cuda_library(name, capability)
            cuda = [":%s_cuda" % name]
        native.cc_library(
            name = name + "_core",
            srcs = capability["core_srcs"],
            hdrs = capability["core_hdrs"],
            copts = _CORE_WARNINGS + (_PLUGIN_COPTS if plugin else []),
            # A plugin's core hides its symbols, so its tests must link it statically, not as a
            # shared library (Bazel's default for tests).
            linkstatic = 1 if plugin else 0,
            deps = dep_cores + cuda,
        )
        if capability["kernel_srcs"] or capability["op_srcs"]:
            native.cc_library(
                name = name + "_kernels",
                srcs = capability["kernel_srcs"] + capability["op_srcs"],
                hdrs = capability["kernel_hdrs"],
                # Kernels and ops register themselves in static initializers: keep every object.
                alwayslink = 1,
                deps = [":%s_core" % name] + dep_cores + [":op_library_hdrs", _TF_HEADERS],
            )
        if plugin:
            native.cc_binary(
                name = plugin["path"],
                srcs = plugin["srcs"],
                copts = _PLUGIN_COPTS,
                linkopts = _PLUGIN_LINKOPTS,
                linkshared = 1,
                deps = [":%s_core" % name],
            )

    # Loaded by tf_ext/_ops_loader.py via tf.load_op_library; `make build` copies it into the source
    # tree (git-ignored).
    native.cc_binary(
        name = OP_LIBRARY["path"],
        srcs = OP_LIBRARY["srcs"],
        linkshared = 1,
        deps = kernel_libraries() + [":op_library_hdrs", _TF_FRAMEWORK, _TF_HEADERS],
    )

def kernel_libraries():
    """Every capability's //:NAME_kernels: what the op library links, and what the C++ tests that
    run a graph pass link (tests/defs.bzl), so that they see the ops and passes Python sees."""
    return [
        "//:%s_kernels" % name
        for name, capability in CAPABILITIES.items()
        if capability["kernel_srcs"] or capability["op_srcs"]
    ]

def plugin_paths():
    """The output paths of the capabilities' plugin libraries (also their Bazel target names)."""
    return [c["plugin"]["path"] for c in CAPABILITIES.values() if c.get("plugin")]

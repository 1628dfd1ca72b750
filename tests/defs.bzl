"""Test macros: one Bazel test per test file, discovered by glob (tests mirror the code layout)."""

load("//third_party:capabilities.bzl", "kernel_libraries")
load("//third_party:sources.bzl", "CAPABILITIES")

# A C++ test that runs a graph pass on a small graph: named *_tf_test.cc, it links TensorFlow.
TF_TEST_SUFFIX = "_tf_test.cc"

def cc_tests(pattern = "kernels/**/*_test.cc", exclude = [], deps = [], **kwargs):
    """A cc_test per file matching `pattern` (and not `exclude`), named after its path without `.cc`.

    The headers beside the tests (test helpers, e.g. kernels/<capability>/string_bytes.h) come
    with each test.
    """
    helpers = native.glob(["kernels/**/*.h"], exclude = ["kernels/*/fuzz/**"])
    for src in native.glob([pattern], exclude = exclude):
        native.cc_test(
            name = src[:-len(".cc")],
            srcs = [src] + helpers,
            deps = deps,
            **kwargs
        )

def capability_cc_tests(deps = [], **kwargs):
    """cc_tests for tests/kernels/<capability>/**/*_test.cc, linking only that capability's core.

    Not the *_tf_test.cc (capability_tf_tests). tests/build/test_capabilities.py checks that every
    C++ test lies under a capability's folder.
    """
    for name in CAPABILITIES:
        cc_tests(
            pattern = "kernels/%s/**/*_test.cc" % name,
            exclude = ["kernels/%s/**/*%s" % (name, TF_TEST_SUFFIX)],
            deps = ["//:%s_core" % name] + deps,
            **kwargs
        )

def capability_tf_tests(deps = [], **kwargs):
    """cc_tests for tests/kernels/<capability>/**/*_tf_test.cc: a graph pass run on small graphs.

    Each links what the op library links (every capability's kernels and ops, so the graphs may
    hold any of tf_ext's ops and every pass is registered), the op library's common headers, and
    TensorFlow: its framework, and libtensorflow_cc.so.2 for its own ops and passes (which
    `import tensorflow` brings in Python). A test finds a pass in TensorFlow's registry by name and
    runs it. `make sanitize` leaves them out: TensorFlow's prebuilt libraries have no sanitizers.
    """
    for name in CAPABILITIES:
        cc_tests(
            pattern = "kernels/%s/**/*%s" % (name, TF_TEST_SUFFIX),
            deps = kernel_libraries() + [
                "//:op_library_hdrs",
                "@local_tensorflow//:tf_headers",
                "@local_tensorflow//:libtensorflow_framework",
                "@local_tensorflow//:libtensorflow_cc",
            ] + deps,
            # Our libraries linked into the test as into the op library: statically (a core's CUDA
            # archive keeps its symbols local to what links it).
            linkstatic = 1,
            **kwargs
        )

def py_tests(
        pattern = "**/test_*.py",
        deps = [],
        data = [],
        size = "medium",
        sizes = {},
        file_data = {},
        file_tags = {},
        runner = "pytest_runner.py",
        **kwargs):
    """A py_test per file matching `pattern`, each running pytest on that one file.

    Args:
      pattern: glob of test files (relative to this package).
      deps: Python deps of every test (e.g. //:tf_ext).
      data: extra runtime files; the other .py files below this package (conftest.py, helpers)
        are added automatically.
      size: default size ("medium" = 300 s timeout; importing TensorFlow alone takes a few seconds).
      sizes: per-file overrides, e.g. {"dynamic_embedding/test_training.py": "large"}.
      file_data: per-file extra runtime files, e.g. {"build/test_x.py": ["//:setup.py"]}.
      file_tags: per-file tags, e.g. {"build/test_x.py": ["external"]} (never cached).
      runner: the pytest entry point (calls pytest.main([file, ...])).
    """
    tests = native.glob([pattern])

    # conftest.py and helper modules (e.g. _subprocess.py) next to the tests.
    helpers = native.glob(["**/*.py"], exclude = tests + [runner])
    for src in tests:
        native.py_test(
            name = src[:-len(".py")],
            srcs = [runner, src],
            main = runner,
            args = ["$(location %s)" % src],
            data = data + helpers + file_data.get(src, []),
            deps = deps,
            size = sizes.get(src, size),
            tags = file_tags.get(src, []),
            python_version = "PY3",
            srcs_version = "PY3",
            # No generated __init__.py files: pytest must see tests/<dir>/ as a plain directory (as in
            # a checkout) and put it on sys.path, so tests can import sibling helper modules.
            legacy_create_init = 0,
            **kwargs
        )

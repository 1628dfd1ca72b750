"""Test macros: one Bazel test per test file, discovered by glob (tests mirror the code layout)."""

load("//third_party:sources.bzl", "CAPABILITIES")

def cc_tests(pattern = "kernels/**/*_test.cc", deps = [], **kwargs):
    """A cc_test per file matching `pattern`, named after its path without `.cc`.

    The headers beside the tests (test helpers, e.g. kernels/<capability>/string_bytes.h) come
    with each test.
    """
    helpers = native.glob(["kernels/**/*.h"], exclude = ["kernels/*/fuzz/**"])
    for src in native.glob([pattern]):
        native.cc_test(
            name = src[:-len(".cc")],
            srcs = [src] + helpers,
            deps = deps,
            **kwargs
        )

def capability_cc_tests(deps = [], **kwargs):
    """cc_tests for tests/kernels/<capability>/**/*_test.cc, linking only that capability's core.

    tests/build/test_capabilities.py checks that every C++ test lies under a capability's folder.
    """
    for name in CAPABILITIES:
        cc_tests(
            pattern = "kernels/%s/**/*_test.cc" % name,
            deps = ["//:%s_core" % name] + deps,
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

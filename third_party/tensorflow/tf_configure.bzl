"""Repository rule exposing the pip-installed TensorFlow to Bazel.

tf_configure(name = "local_tensorflow") runs a Python interpreter (PYTHON_BIN_PATH if set, else the
first `python3` on PATH -- `make` puts .venv/bin first -- or, if that one has no TensorFlow, the
project's .venv/bin/python3), asks `tf.sysconfig` where the headers and
libtensorflow_framework.so.2 are and which macros TensorFlow was built with, and generates:

  @local_tensorflow//:tf_headers               cc_library: headers + defines (-D_GLIBCXX_USE_CXX11_ABI=1,
                                                -DEIGEN_MAX_ALIGN_BYTES=64, ...)
  @local_tensorflow//:libtensorflow_framework  cc_library wrapping libtensorflow_framework.so.2
  @local_tensorflow//:libtensorflow_cc         cc_library wrapping libtensorflow_cc.so.2 (TensorFlow's
                                                own ops and passes: only tests that run a pass link it)
  @local_tensorflow//:py_toolchain             Python toolchain for that same interpreter, so py_test
                                                imports the TensorFlow the op library was built against.
  @local_tensorflow//:python_packages.txt      interpreter path + installed distributions (py_test data).

The rule is re-run when PATH / PYTHON_BIN_PATH change or when //:requirements.txt changes
(e.g. after a TensorFlow upgrade); `bazel sync --configure` forces it.
"""

_PROBE = """
import sys
import tensorflow as tf
flags = tf.sysconfig.get_compile_flags()
print("@@python=" + sys.executable)
print("@@version=" + tf.__version__)
print("@@include=" + tf.sysconfig.get_include())
print("@@lib=" + tf.sysconfig.get_lib())
print("@@defines=" + " ".join(f[2:] for f in flags if f.startswith("-D")))
from importlib import metadata
dists = sorted({"%s==%s" % (d.metadata["Name"], d.version) for d in metadata.distributions()})
print("@@packages=" + " ".join(dists))
"""

def _fail(msg):
    fail("\n[tf_configure] " + msg + "\n")

def _probe(ctx, python):
    return ctx.execute(
        [python, "-c", _PROBE],
        environment = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""},
        timeout = 600,
    )

def _find_tensorflow(ctx):
    """Returns (python, probe result): PYTHON_BIN_PATH, else python3 on PATH, else .venv/bin/python3."""
    explicit = ctx.os.environ.get("PYTHON_BIN_PATH", "").strip()
    if explicit:
        candidates = [ctx.path(explicit)]
    else:
        candidates = []
        on_path = ctx.which("python3")
        if on_path != None:
            candidates.append(on_path)

        # Fallback so that a plain `bazel test //...` (venv not activated) still finds the project venv.
        venv = ctx.path(Label("//:WORKSPACE")).dirname.get_child(".venv").get_child("bin").get_child("python3")
        if venv.exists:
            candidates.append(venv)
    if not candidates:
        _fail("no python3 on PATH and no .venv; run `make setup`")
    errors = []
    for python in candidates:
        res = _probe(ctx, python)
        if res.return_code == 0:
            return python, res
        errors.append("%s: %s" % (python, res.stderr[-2000:]))
    _fail(("cannot import tensorflow with %s (run `make setup`, put .venv/bin first on PATH " +
           "or set PYTHON_BIN_PATH):\n%s") % (candidates, "\n".join(errors)))
    return None, None

def _tf_configure_impl(ctx):
    # Watching the requirements file makes Bazel re-run this rule when TensorFlow is re-pinned.
    ctx.path(ctx.attr.requirements)
    _, res = _find_tensorflow(ctx)
    info = {}
    for line in res.stdout.splitlines():
        if line.startswith("@@"):
            key, _, value = line[2:].partition("=")
            info[key] = value.strip()
    info["defines"] = [d for d in info.get("defines", "").split(" ") if d]

    # What is installed in the interpreter's environment; py_tests depend on this file, so their
    # cached results are dropped when the venv changes (the rule re-runs on requirements.txt edits).
    ctx.file("python_packages.txt", "\n".join([info["python"], "tensorflow==" + info["version"]] +
                                               info.get("packages", "").split(" ")) + "\n")

    ctx.symlink(info["include"], "include")
    lib = info["lib"] + "/libtensorflow_framework.so.2"
    if not ctx.path(lib).exists:
        _fail("%s not found" % lib)
    ctx.symlink(lib, "libtensorflow_framework.so.2")
    cc_lib = info["lib"] + "/libtensorflow_cc.so.2"
    if not ctx.path(cc_lib).exists:
        _fail("%s not found" % cc_lib)
    ctx.symlink(cc_lib, "libtensorflow_cc.so.2")

    ctx.template("BUILD", ctx.attr._build_tpl, {
        "%{DEFINES}": repr(info["defines"]),
        "%{PYTHON}": repr(info["python"]),
        "%{VERSION}": info["version"],
    }, executable = False)

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    attrs = {
        "requirements": attr.label(default = "//:requirements.txt", allow_single_file = True),
        "_build_tpl": attr.label(default = "//third_party/tensorflow:BUILD.tpl"),
    },
    environ = ["PATH", "PYTHON_BIN_PATH"],
    local = True,
)

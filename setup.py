"""Builds tf_ext/_tf_ext_ops.so with g++ against the installed TensorFlow (pip install . / -e .).

The sources are those of //third_party:sources.bzl (the same lists Bazel uses), read with `ast`.
Compile and link flags come from tf.sysconfig, plus the optimisation flags of .bazelrc.
TensorFlow must be importable at build time: see the comments in pyproject.toml.
"""

import ast
import os
import shlex
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SOURCES_BZL = ROOT / "third_party" / "sources.bzl"
EXT_NAME = "tf_ext._tf_ext_ops"
# Keep in sync with the `build --copt` lines of .bazelrc.
COMMON_FLAGS = ["-O3", "-march=x86-64-v2", "-fPIC", "-pthread", "-DNDEBUG"]


def read_sources():
  """The top-level `NAME = [...]` assignments of sources.bzl (plain Python syntax)."""
  tree = ast.parse(SOURCES_BZL.read_text(), str(SOURCES_BZL))
  lists = {}
  for node in tree.body:
    if (
      isinstance(node, ast.Assign)
      and len(node.targets) == 1
      and isinstance(node.targets[0], ast.Name)
    ):
      lists[node.targets[0].id] = ast.literal_eval(node.value)
  return lists


class BuildTfOps(build_ext):
  """Compiles and links the op library with g++ (or $CXX) and the tf.sysconfig flags."""

  def build_extension(self, ext):
    import tensorflow as tf  # build-time requirement

    cxx = shlex.split(os.environ.get("CXX", "g++"))
    cflags = (
      tf.sysconfig.get_compile_flags() + COMMON_FLAGS + shlex.split(os.environ.get("CXXFLAGS", ""))
    )
    ldflags = tf.sysconfig.get_link_flags() + shlex.split(os.environ.get("LDFLAGS", ""))
    out = Path(self.get_ext_fullpath(ext.name))
    tmp = Path(self.build_temp) / "tf_ext_ops"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)

    deps = [ROOT / h for h in ext.depends]
    objects = []
    for src in ext.sources:
      obj = tmp / (src.replace("/", "_") + ".o")
      srcp = ROOT / src
      newest = max([srcp.stat().st_mtime] + [d.stat().st_mtime for d in deps])
      if self.force or not obj.exists() or obj.stat().st_mtime < newest:
        self._run(cxx + cflags + ["-I", str(ROOT), "-c", str(srcp), "-o", str(obj)])
      objects.append(str(obj))
    self._run(cxx + ["-shared", "-o", str(out)] + objects + ldflags + ["-pthread"])

  def get_ext_filename(self, ext_name):
    # tf.load_op_library wants tf_ext/_tf_ext_ops.so, not the cpython-311-... suffix.
    return os.path.join(*ext_name.split(".")) + ".so"

  def _run(self, cmd):
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.check_call(cmd, cwd=ROOT)


def op_library():
  lists = read_sources()
  srcs = lists["OP_LIBRARY_SRCS"] + lists["CORE_SRCS"]
  hdrs = lists["OP_LIBRARY_HDRS"] + lists["CORE_HDRS"]
  return Extension(EXT_NAME, sources=srcs, depends=hdrs, language="c++")


setup(ext_modules=[op_library()], cmdclass={"build_ext": BuildTfOps})

"""Builds tf_ext's C++ libraries with g++ for pip (pip install . / -e .).

What is compiled comes from //third_party:sources.bzl, the description Bazel uses too, read here
with `ast`:
  tf_ext/_tf_ext_ops.so            the op library: every capability's ops, kernels and core, plus
                                   OP_LIBRARY's own sources; tf.sysconfig's compile and link flags
  tf_ext/harp/libnccl-net-harp.so  each capability's plugin library: its core and plugin sources,
                                   plain `g++ -shared`, no TensorFlow
Optimisation flags are those of .bazelrc. TensorFlow must be importable at build time: see the
comments in pyproject.toml.

Objects are kept in build_temp and recompiled only when their source or a header is newer. A
library is not linked again when an up-to-date copy is already there (in the build directory, or
in the source tree after `make build`): newer than every source, header and sources.bzl, and,
for the op library, carrying the running TensorFlow's version and C++ ABI in its build-info
marker. So `pip install -e .` after `make build` compiles nothing.
"""

import filecmp
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SOURCES_BZL = ROOT / "third_party" / "sources.bzl"
BAZELRC = ROOT / ".bazelrc"  # the code-generation flags
sys.path.insert(0, str(ROOT / "third_party"))
import build_description  # noqa: E402  (the one reader of sources.bzl and .bazelrc's flags)

# With the code-generation flags of .bazelrc (build_description.codegen_flags), read when compiling.
COMMON_FLAGS = ["-fPIC", "-pthread", "-DNDEBUG"]
# Keep in sync with _PLUGIN_COPTS and _PLUGIN_LINKOPTS of third_party/capabilities.bzl.
PLUGIN_FLAGS = ["-fvisibility=hidden"]
PLUGIN_LINK_FLAGS = ["-Wl,-z,nodelete"]


def read_description():
  """The top-level `NAME = <literal>` assignments of sources.bzl."""
  return build_description.read(str(SOURCES_BZL))


class SharedLibrary(Extension):
  """A shared library at `path` (relative to the package root), not a Python extension module.

  source_flags: extra compile flags per source; uses_tensorflow: compile and link with
  tf.sysconfig's flags (and check the build-info marker of an existing copy).
  """

  def __init__(self, path, sources, headers, source_flags, uses_tensorflow, link_flags=(), cuda=()):
    # tf_ext/harp/libnccl-net-harp.so -> tf_ext.harp.libnccl-net-harp (see get_ext_filename).
    super().__init__(path[: -len(".so")].replace("/", "."), sources, depends=headers)
    self.path = path
    self.source_flags = source_flags
    self.uses_tensorflow = uses_tensorflow
    self.link_flags = list(link_flags)
    # The capabilities whose CUDA sources (or fallback) it links: (name, capability) pairs.
    self.cuda = list(cuda)


def libraries():
  description = read_description()
  capabilities = description["CAPABILITIES"]
  op_library = description["OP_LIBRARY"]
  plugin_core_flags = {
    src: PLUGIN_FLAGS
    for capability in capabilities.values()
    if capability.get("plugin")
    for src in capability["core_srcs"]
  }
  op_srcs, op_hdrs = list(op_library["srcs"]), list(op_library["hdrs"])
  op_cuda = []
  result = []
  for name, capability in capabilities.items():
    if capability["kernel_srcs"] or capability["op_srcs"]:
      op_srcs += capability["op_srcs"] + capability["kernel_srcs"] + capability["core_srcs"]
      op_hdrs += capability["kernel_hdrs"] + capability["core_hdrs"]
      if capability.get("cuda_srcs"):
        op_cuda.append((name, capability))
        op_hdrs += capability["cuda_srcs"] + capability.get("cuda_hdrs", [])
        op_hdrs += capability["cuda_fallback_srcs"]
      for dep in capability["deps"]:
        op_srcs += capabilities[dep]["core_srcs"]
        op_hdrs += capabilities[dep]["core_hdrs"]
    plugin = capability.get("plugin")
    if plugin:
      srcs, hdrs = list(plugin["srcs"]) + capability["core_srcs"], list(capability["core_hdrs"])
      for dep in capability["deps"]:
        srcs += capabilities[dep]["core_srcs"]
        hdrs += capabilities[dep]["core_hdrs"]
      flags = dict(plugin_core_flags, **{src: PLUGIN_FLAGS for src in plugin["srcs"]})
      result.append(
        SharedLibrary(plugin["path"], srcs, hdrs, flags, False, link_flags=PLUGIN_LINK_FLAGS)
      )
  op_srcs, op_hdrs = list(dict.fromkeys(op_srcs)), list(dict.fromkeys(op_hdrs))
  result.insert(
    0, SharedLibrary(op_library["path"], op_srcs, op_hdrs, plugin_core_flags, True, cuda=op_cuda)
  )
  return result


def library_build_info(path):
  """The build-info marker of the library at `path` (or None), read by tf_ext/_build_info.py, the
  reader the package's loader uses, loaded by path so that tf_ext itself is not imported."""
  spec = importlib.util.spec_from_file_location(
    "tf_ext_build_info", ROOT / "tf_ext" / "_build_info.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.read(path)


class BuildLibraries(build_ext):
  """Compiles and links each SharedLibrary with g++ (or $CXX)."""

  def build_extension(self, ext):
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    out = Path(self.get_ext_fullpath(ext.name))
    inputs = [ROOT / p for p in ext.sources + ext.depends] + [SOURCES_BZL, BAZELRC]
    newest_input = max(p.stat().st_mtime for p in inputs)
    cflags, ldflags, build_info = ["-std=c++17"], [], None
    if ext.uses_tensorflow:
      import tensorflow as tf  # build-time requirement

      cflags = tf.sysconfig.get_compile_flags()
      ldflags = tf.sysconfig.get_link_flags()
      build_info = {"tensorflow": tf.__version__, "cxx11_abi": str(tf.sysconfig.CXX11_ABI_FLAG)}

    def up_to_date(path):
      return (
        path.exists()
        and path.stat().st_mtime >= newest_input
        and (build_info is None or library_build_info(path) == build_info)
      )

    out.parent.mkdir(parents=True, exist_ok=True)
    ext.built_file = out
    for existing in (out, ROOT / ext.path):
      if up_to_date(existing):
        print(f"{ext.path}: up to date ({existing}), not rebuilt", flush=True)
        if existing != out:
          shutil.copy2(existing, out)
        return

    codegen = build_description.codegen_flags(str(BAZELRC))
    cflags = cflags + codegen + COMMON_FLAGS + shlex.split(os.environ.get("CXXFLAGS", ""))
    ldflags = ldflags + ext.link_flags + shlex.split(os.environ.get("LDFLAGS", ""))
    tmp = Path(self.build_temp) / ext.name
    tmp.mkdir(parents=True, exist_ok=True)
    newest_header = max((ROOT / h).stat().st_mtime for h in ext.depends + ["setup.py", ".bazelrc"])
    objects = []
    for src in ext.sources:
      obj = tmp / (src.replace("/", "_") + ".o")
      srcp = ROOT / src
      newest = max(srcp.stat().st_mtime, newest_header)
      if self.force or not obj.exists() or obj.stat().st_mtime < newest:
        flags = cflags + ext.source_flags.get(src, [])
        self._run(cxx + flags + ["-I", str(ROOT), "-c", str(srcp), "-o", str(obj)])
      objects.append(str(obj))
    for name, capability in ext.cuda:
      objects += self._cuda_archive(tmp, name, capability)
    self._run(cxx + ["-shared", "-o", str(out)] + objects + ldflags + ["-pthread"])

  def _cuda_archive(self, tmp, name, capability):
    """The capability's CUDA archive (third_party/cuda_library.sh, as Bazel builds it), rebuilt
    when a source or TF_EXT_CUDA changes; returns what to link."""
    archive = tmp / f"lib{name}_cuda.a"
    mode_file = tmp / f"lib{name}_cuda.mode"
    mode = os.environ.get("TF_EXT_CUDA", "auto")
    inputs = capability["cuda_srcs"] + capability.get("cuda_hdrs", [])
    inputs += capability["cuda_fallback_srcs"] + capability["core_hdrs"]
    newest = max((ROOT / p).stat().st_mtime for p in inputs)
    stale = (
      self.force
      or not archive.exists()
      or archive.stat().st_mtime < newest
      or not mode_file.exists()
      or mode_file.read_text() != mode
    )
    if stale:
      script = str(ROOT / "third_party" / "cuda_library.sh")
      sources = [" ".join(capability["cuda_srcs"]), " ".join(capability["cuda_fallback_srcs"])]
      self._run([script, str(archive)] + sources)
      mode_file.write_text(mode)
    # As Bazel links it (third_party/capabilities.bzl): the CUDA runtime's symbols stay local.
    return [str(archive), "-ldl", "-lrt", f"-Wl,--exclude-libs,{archive.name}"]

  def copy_extensions_to_source(self):
    """--inplace and editable installs: put each library into the source tree.

    Skips a file that is already there with the same bytes, and otherwise replaces it atomically:
    a running process that has the old library loaded keeps its mapping intact.
    """
    for ext in self.extensions:
      target = ROOT / ext.path
      if target.exists() and filecmp.cmp(ext.built_file, target, shallow=False):
        continue
      partial = target.with_name(target.name + ".partial")
      shutil.copy2(ext.built_file, partial)
      os.replace(partial, target)

  def get_ext_filename(self, ext_name):
    # The library's own file name (tf.load_op_library and NCCL want exactly these names), not
    # the cpython-311-... suffix of extension modules.
    return os.path.join(*ext_name.split(".")) + ".so"

  def _run(self, cmd):
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.check_call(cmd, cwd=ROOT)


setup(ext_modules=libraries(), cmdclass={"build_ext": BuildLibraries})

"""HARP's plugin library: built, free of TensorFlow, loadable on its own, reporting its version."""

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess

import pytest

from tf_ext import harp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def package_version():
  with open(os.path.join(ROOT, "pyproject.toml")) as f:
    return re.search(r'^version = "([^"]+)"', f.read(), re.MULTILINE).group(1)


def test_the_library_has_no_tensorflow_dependency():
  path = harp.plugin_path()
  assert os.path.basename(path) == "libnccl-net-harp.so"  # the name pattern NCCL loads
  dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
  needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic.stdout)
  assert needed, dynamic.stdout  # the pattern matches readelf's output
  assert not [lib for lib in needed if "tensorflow" in lib], needed


def test_the_library_stays_loaded_once_loaded():
  # NCCL 2.28+ dlcloses its plugin with the last communicator; HARP's workers outlive it.
  dynamic = subprocess.run(
    ["readelf", "-d", harp.plugin_path()], capture_output=True, text=True, check=True
  ).stdout
  flags = re.search(r"\(FLAGS_1\)\s+Flags: (.*)$", dynamic, re.MULTILINE)
  assert flags and "NODELETE" in flags.group(1).split(), dynamic


def test_the_library_exports_its_entry_points_only():
  exported = subprocess.run(
    ["nm", "-D", "-C", "--defined-only", harp.plugin_path()],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert re.search(r" T harp_build_info$", exported, re.MULTILINE), exported
  # The NCCL net tables NCCL looks up by name (data symbols), v6 through v12.
  tables = set(re.findall(r" [DR] (ncclNetPlugin_v\d+)$", exported, re.MULTILINE))
  assert tables == {f"ncclNetPlugin_v{v}" for v in range(6, 13)}, exported
  # Nothing else of ours is exported (the C++ standard library's own weak template instances,
  # e.g. std::vector<int>, may be): the core is compiled with hidden visibility, so nothing of
  # tf_ext's C++ leaks into NCCL's process.
  assert "tf_ext::" not in exported, exported
  ours = re.findall(r" [TDRB] (\w+)$", exported, re.MULTILINE)
  linker = {"__bss_start", "_edata", "_end", "_init", "_fini"}
  assert set(ours) - linker == {"harp_build_info"} | tables, exported


def test_harp_build_info_names_the_package_version():
  library = ctypes.CDLL(harp.plugin_path())
  library.harp_build_info.restype = ctypes.c_char_p
  library.harp_build_info.argtypes = []
  assert library.harp_build_info().decode() == f"tf_ext-harp {package_version()}"


def test_plugin_path_without_the_library_says_how_to_build_it(tmp_path):
  # The same module, alone in a directory without the library.
  shutil.copy(harp.__file__, tmp_path / "__init__.py")
  spec = importlib.util.spec_from_file_location("harp_without_library", tmp_path / "__init__.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  with pytest.raises(FileNotFoundError, match="libnccl-net-harp.so does not exist.*make build"):
    module.plugin_path()

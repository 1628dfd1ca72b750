"""HARP, tf_ext's NCCL network plugin (in progress).

The plugin is a shared library of its own, `libnccl-net-harp.so` in this directory: NCCL loads
network plugins by that file-name pattern, so the library has no TensorFlow dependency. Today it
exports only `harp_build_info()`; the NCCL net interface comes later.
"""

import os

LIBRARY_NAME = "libnccl-net-harp.so"


def plugin_path():
  """The absolute path of the HARP plugin library; FileNotFoundError when it was not built."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"tf_ext.harp: the plugin library {path} does not exist. Build it with `make build` "
      "(source checkout) or reinstall with `pip install .`."
    )
  return path

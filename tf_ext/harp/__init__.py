"""HARP, tf_ext's NCCL network plugin.

The plugin is a shared library of its own, `libnccl-net-harp.so` in this directory: NCCL loads
network plugins by that file-name pattern, so the library has no TensorFlow dependency. It
exports NCCL's net interface `ncclNetPlugin_v6` ... `ncclNetPlugin_v12` (name "HARP", host
memory only) over kernel TCP: each connection is several TCP streams with messages split into
chunks, each sent on the stream whose socket holds the fewest unacknowledged bytes, driven by
worker threads that the NCCL proxy thread feeds through lock-free rings. Select it with
`NCCL_NET_PLUGIN=<plugin_path()>` (or put this directory on `LD_LIBRARY_PATH` and set
`NCCL_NET_PLUGIN=harp`) and `NCCL_NET=HARP`. Its settings
are the `HARP_*` variables of `tf_ext.settings`, read by the plugin itself at NCCL's init
(MSG_ZEROCOPY sends: HARP_ZEROCOPY_THRESHOLD, off by default). It also exports
`harp_build_info()`.
"""

import os

__all__ = [
  "LIBRARY_NAME",
  "plugin_path",
]

LIBRARY_NAME = "libnccl-net-harp.so"
"""The plugin library's file name, in this directory (NCCL finds plugins by this pattern)."""


def plugin_path():
  """The absolute path of the HARP plugin library; FileNotFoundError when it was not built."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"tf_ext.harp: the plugin library {path} does not exist. Build it with `make build` "
      "(source checkout) or reinstall with `pip install .`."
    )
  return path

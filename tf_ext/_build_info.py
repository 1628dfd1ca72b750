"""The build-info marker that kernels/build_info.cc puts into the op library: the TensorFlow
version and C++ ABI it was compiled for, read from the file's bytes without loading it (loading
would register its ops). Standard library only: setup.py loads this file by its path too."""

import re

_MARKER = re.compile(rb"TF_EXT_BUILD_INFO\[([^\]]*)\]")


def read(path):
  """{'tensorflow': X, 'cxx11_abi': Y} of the library at `path`, or None when it has no marker."""
  with open(path, "rb") as library:
    found = _MARKER.search(library.read())
  if not found:
    return None
  return dict(item.split("=", 1) for item in found.group(1).decode().split(";"))

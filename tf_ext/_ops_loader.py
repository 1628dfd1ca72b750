"""Loads the op library once, on first use, after checking it matches the running TensorFlow."""

import os
import threading

import tensorflow as tf

from tf_ext import _build_info, settings

_LIBRARY_NAME = "_tf_ext_ops.so"
_lock = threading.Lock()
_ops = None
_error = None


def library_path():
  """The op library file tf_ext loads (TF_EXT_OPS_LIBRARY overrides the packaged one)."""
  return settings.get("TF_EXT_OPS_LIBRARY") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), _LIBRARY_NAME
  )


def load():
  """The generated op module of tf_ext, loading the library on the first call.

  A failure is raised again, with the same message, at every later call.
  """
  global _ops, _error
  if _ops is not None:
    return _ops
  with _lock:
    if _error is not None:
      raise ImportError(str(_error))
    if _ops is None:
      try:
        _ops = _load_checked()
      except ImportError as error:
        _error = error
        raise
  return _ops


def try_load():
  """Loads the library if possible; a failure is kept for load() to report at first use."""
  try:
    load()
  except ImportError:
    pass


def _load_checked():
  try:  # the library reads it as it loads, and would take a bad value for 0
    settings.get("TF_EXT_GPU_TABLES")
  except ValueError as error:
    raise ImportError(f"tf_ext: {error}") from None
  path = library_path()
  if not os.path.exists(path):
    raise ImportError(
      f"tf_ext: the op library {path} does not exist. Build it with `make build` "
      "(source checkout) or reinstall with `pip install .`."
    )
  built = _build_info.read(path) or {"tensorflow": "unknown", "cxx11_abi": "unknown"}
  running = {"tensorflow": tf.__version__, "cxx11_abi": str(tf.sysconfig.CXX11_ABI_FLAG)}
  if built != running:
    raise ImportError(
      f"tf_ext: {path} was built for TensorFlow {built.get('tensorflow')} "
      f"(_GLIBCXX_USE_CXX11_ABI={built.get('cxx11_abi')}) but this process runs "
      f"TensorFlow {running['tensorflow']} (_GLIBCXX_USE_CXX11_ABI={running['cxx11_abi']}). "
      "Rebuild tf_ext against the installed TensorFlow (`make build` or `pip install .`)."
    )
  return tf.load_op_library(path)

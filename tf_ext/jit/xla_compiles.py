"""Every XLA compilation of this process, as TensorFlow's XLA activity listener reports it, and
the switch for TensorFlow's asynchronous XLA compilation. Both live in the op library
(kernels/graph/xla_compile_listener.cc), which registers the listener when it loads."""

import ctypes
import logging

from tf_ext import _ops_loader

logger = logging.getLogger("tf_ext.jit")

_FIELDS = (
  ("sequence", int),
  ("time", float),
  ("cluster", str),
  ("device", str),
  ("compile_count", int),
  ("compile_time_us", int),
  ("cumulative_compile_time_us", int),
)


def _library():
  library = ctypes.CDLL(_ops_loader.library_path())  # the loaded library: dlopen returns it again
  library.TfExtJitCompileEventCount.restype = ctypes.c_int64
  library.TfExtJitCompileLog.restype = ctypes.c_int64
  library.TfExtJitCompileLog.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
  return library


def listener_active():
  """True when TensorFlow's XLA activity listener feeds compile_log()."""
  return _library().TfExtJitListenerState() == 1


def compile_count():
  """XLA compilations so far in this process."""
  return int(_library().TfExtJitCompileEventCount())


def compile_log(after=0):
  """The recorded compilations with a sequence number above `after` (the most recent 4096 are
  kept), oldest first: dicts with sequence, time, cluster, device, compile_count (of that
  cluster), compile_time_us and cumulative_compile_time_us."""
  library = _library()
  capacity = 1 << 16
  while True:
    buffer = ctypes.create_string_buffer(capacity)
    needed = library.TfExtJitCompileLog(int(after), buffer, capacity)
    if needed < capacity:
      break
    capacity = needed + 1
  events = []
  for line in buffer.value.decode("utf-8", "replace").splitlines():
    parts = line.split("\t")
    events.append({name: kind(value) for (name, kind), value in zip(_FIELDS, parts)})
  return events


_warned_async = False


def set_async_compilation(enable):
  """Sets TensorFlow's process-wide tf_xla_async_compilation (a Session's XLA clusters compile
  in the background and run uncompiled meanwhile). Returns the previous value, or None (with one
  warning) where this TensorFlow does not expose it."""
  global _warned_async
  previous = _library().TfExtJitSetAsyncCompilation(int(bool(enable)))
  if previous < 0:
    if not _warned_async:
      _warned_async = True
      logger.warning("tf_ext.jit: TensorFlow's asynchronous XLA compilation is not reachable")
    return None
  return bool(previous)

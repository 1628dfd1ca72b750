"""Every XLA compilation of this process, as TensorFlow's XLA activity listener reports it, the
switch for TensorFlow's asynchronous XLA compilation, and the Session speed gate's switch and
verdicts. All live in the op library (kernels/jit/xla_compile_listener.cc, which registers the
listener when it loads; kernels/jit/core/speed_gate.h)."""

import ctypes
import functools
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


@functools.cache
def _library():
  library = ctypes.CDLL(_ops_loader.library_path())  # the loaded library: dlopen returns it again
  library.TfExtJitCompileEventCount.restype = ctypes.c_int64
  library.TfExtJitSpeedVerdictCount.restype = ctypes.c_int64
  for reader in (library.TfExtJitCompileLog, library.TfExtJitSpeedVerdicts):
    reader.restype = ctypes.c_int64
    reader.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
  return library


def _read_lines(reader, after):
  """The lines a library log reader (TfExtJitCompileLog's convention) gives after `after`."""
  capacity = 1 << 16
  while True:
    buffer = ctypes.create_string_buffer(capacity)
    needed = reader(int(after), buffer, capacity)
    if needed < capacity:
      return buffer.value.decode("utf-8", "replace").splitlines()
    capacity = needed + 1


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
  lines = _read_lines(_library().TfExtJitCompileLog, after)
  return [_parse(line, _FIELDS) for line in lines]


def _parse(line, fields):
  return {name: kind(value) for (name, kind), value in zip(fields, line.split("\t"))}


_VERDICT_FIELDS = (
  ("sequence", int),
  ("clusters", str),
  ("run_compiled", lambda v: v == "1"),
  ("compiled_ns_per_element", float),
  ("uncompiled_ns_per_element", float),
)


def set_speed_gate(enable):
  """Turns the Session speed gate on or off for graphs built from now on (kernels/jit/
  xla_speed_gate_pass.cc): the lazily compiled CPU clusters of a graph then run compiled only
  where its timed steps say that is faster. Returns the previous value."""
  return bool(_library().TfExtJitSetSpeedGate(int(bool(enable))))


def speed_verdict_count():
  """How many speed-gate verdicts the process has recorded (the newest one's sequence number)."""
  return int(_library().TfExtJitSpeedVerdictCount())


def speed_verdicts(after=0):
  """The speed gate's finished checks with a sequence number above `after` (the most recent 1024
  are kept), oldest first: dicts with sequence, clusters (the graph's gated clusters,
  ", "-joined), run_compiled, and each way's median step time per input element, in ns."""
  return [
    _parse(line, _VERDICT_FIELDS) for line in _read_lines(_library().TfExtJitSpeedVerdicts, after)
  ]


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

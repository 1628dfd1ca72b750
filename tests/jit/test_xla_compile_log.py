"""The log of TensorFlow's XLA compilations (kernels/jit/xla_compile_listener.cc, filled from
TensorFlow's XLA activity listener) and the switch for asynchronous XLA compilation, through the op
library's C interface (kernels/jit/core/compile_log.h)."""

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.compiler.xla import jit

from tf_ext import _ops_loader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = (
  "sequence",
  "time",
  "cluster",
  "device",
  "compile_count",
  "compile_time_us",
  "cumulative_compile_time_us",
)


@pytest.fixture(scope="module")
def library():
  _ops_loader.load()  # registers the listener (a static initializer of the op library)
  lib = ctypes.CDLL(_ops_loader.library_path())  # the loaded library: dlopen returns it again
  lib.TfExtJitCompileEventCount.restype = ctypes.c_int64
  lib.TfExtJitCompileEventCount.argtypes = []
  lib.TfExtJitCompileLog.restype = ctypes.c_int64
  lib.TfExtJitCompileLog.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
  lib.TfExtJitListenerState.restype = ctypes.c_int
  lib.TfExtJitListenerState.argtypes = []
  lib.TfExtJitSetAsyncCompilation.restype = ctypes.c_int
  lib.TfExtJitSetAsyncCompilation.argtypes = [ctypes.c_int]
  return lib


def events_after(lib, sequence):
  """The kept events after `sequence`, as dicts; grows the buffer as the C interface asks."""
  capacity = 64  # small on purpose: the retry path runs too
  while True:
    buffer = ctypes.create_string_buffer(capacity)
    needed = lib.TfExtJitCompileLog(sequence, buffer, capacity)
    if needed < capacity:
      break
    capacity = needed + 1
  events = []
  for line in buffer.value.decode().splitlines():
    values = dict(zip(FIELDS, line.split("\t"), strict=True))
    for name in FIELDS:
      if name == "time":
        values[name] = float(values[name])
      elif name not in ("cluster", "device"):
        values[name] = int(values[name])
    events.append(values)
  return events


def test_the_listener_is_registered(library):
  assert library.TfExtJitListenerState() == 1


def test_jit_compiled_function_logs_one_compilation_per_shape(library):
  @tf.function(jit_compile=True)
  def tower(x):
    return tf.reduce_sum(tf.nn.relu(tf.matmul(x, tf.transpose(x)) + 1.0), axis=1)

  start = library.TfExtJitCompileEventCount()
  for rows in (3, 5):
    tower(tf.ones([rows, 4]))
    tower(tf.ones([rows, 4]))  # cached: no new compilation
  assert library.TfExtJitCompileEventCount() == start + 2
  events = events_after(library, start)
  assert [event["sequence"] for event in events] == [start + 1, start + 2]
  for event in events:
    # tf.function traces each shape into a function of its own, which is the cluster.
    assert "tower" in event["cluster"]
    assert event["compile_count"] == 1
    assert event["compile_time_us"] > 0
    assert event["cumulative_compile_time_us"] >= event["compile_time_us"]
    assert event["time"] > 1.6e9


def test_session_jit_scope_logs_its_compilation(library):
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 4])
    with jit.experimental_jit_scope():
      y = tf.reduce_sum(tf.tanh(tf.matmul(x, x, transpose_b=True)) * 2.0 + 1.0)
  start = library.TfExtJitCompileEventCount()
  with tf.compat.v1.Session(graph=graph) as session:
    for _ in range(3):
      session.run(y, {x: np.ones([6, 4], np.float32)})
  events = events_after(library, start)
  assert len(events) == 1, events
  assert events[0]["cluster"]
  assert events[0]["compile_time_us"] > 0


def test_async_compilation_switch_round_trips(library):
  # A negative argument only reads the flag.
  original = library.TfExtJitSetAsyncCompilation(-1)
  assert original in (0, 1)
  try:
    library.TfExtJitSetAsyncCompilation(0)
    assert library.TfExtJitSetAsyncCompilation(1) == 0
    assert library.TfExtJitSetAsyncCompilation(0) == 1
    assert library.TfExtJitSetAsyncCompilation(0) == 0
  finally:
    library.TfExtJitSetAsyncCompilation(original)


def test_async_compilation_switch_reads_tensorflows_own_flag():
  """TF_XLA_FLAGS sets the same flag: the switch must report it (a fresh process, as the flags
  are parsed once)."""
  script = textwrap.dedent(
    """
    import ctypes
    from tf_ext import _ops_loader
    _ops_loader.load()
    lib = ctypes.CDLL(_ops_loader.library_path())
    print("previous", lib.TfExtJitSetAsyncCompilation(-1))
    """
  )
  env = dict(os.environ, TF_XLA_FLAGS="--tf_xla_async_compilation=true", TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
  result = subprocess.run(
    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0, result.stderr
  assert "previous 1" in result.stdout.splitlines()

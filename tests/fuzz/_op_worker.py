"""The child process of the op fuzzer: runs one described op call at a time, eagerly or in a graph.

Protocol (one JSON object per line): it prints {"ready": ...} once TensorFlow and tf_ext's op
library are loaded, then for each call read from stdin prints {"outcome": "result" | "tf_error" |
"rejected", "detail": ...}. A call that takes the process down (a signal), hangs or allocates past
the bound never answers: the parent (_workers.py) sees that. The call format is _op_calls.py's.

The address space is capped at the size after loading plus FUZZ_OPS_MEMORY_BOUND_MB (default
4096): an allocation beyond it fails, so TensorFlow's allocator reports ResourceExhausted and a
kernel allocating with `new` aborts (a crash, reported).
"""

import itertools
import json
import os
import re
import resource
import sys
import traceback

import numpy as np

# The protocol's channel: the original stdout. Anything printed by TensorFlow or by Python code
# goes to stderr instead, so it cannot corrupt the protocol.
_CHANNEL = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

import tensorflow as tf  # noqa: E402

from tf_ext import _ops_loader  # noqa: E402

_unique = itertools.count()


def wrapper(ops, op_name):
  """The generated Python function of an op (TfExtTopKCompress: tf_ext_top_k_compress)."""
  for name in dir(ops):
    if name.replace("_", "") == op_name.lower():
      return getattr(ops, name)
  raise LookupError(f"no Python wrapper for {op_name}")


def dtype_of(name):
  return tf.as_dtype(name)


def array_of(spec):
  """The numpy array of a tensor spec: its elements tiled (or counted up) to fill its shape."""
  dtype, shape = spec["dtype"], spec["shape"]
  size = int(np.prod(shape, dtype=object))
  if dtype == "string":
    elements = [bytes.fromhex(e) for e in spec["elements"]] or [b""]
    flat = [elements[i % len(elements)] for i in range(size)]
    return np.array(flat, dtype=object).reshape(shape)
  np_dtype = tf.as_dtype(dtype).as_numpy_dtype
  elements = spec["elements"] or [0]
  if spec.get("pattern") == "arange":
    start, step = elements[0], elements[-1] if len(elements) > 1 else 1
    flat = [start + step * i for i in range(size)]
  else:
    flat = [elements[i % len(elements)] for i in range(size)]
  if dtype == "bool":
    values = np.array(flat, dtype=bool)
  elif all(isinstance(x, int) for x in flat):
    values = np.array([(x + 2**63) % 2**64 - 2**63 for x in flat], dtype=np.int64)  # wraps
  else:
    values = np.array(flat, dtype=np.float64)
  with np.errstate(all="ignore"):
    return values.astype(np_dtype).reshape(shape)


class Builder:
  """Builds the inputs of one call, in eager mode or inside a graph (with what the Session must
  run first and feed)."""

  def __init__(self, ops, graph_mode):
    self.ops = ops
    self.graph_mode = graph_mode
    self.init_ops = []
    self.feeds = {}
    self.created = []  # eager resources to destroy after the call

  def tensor(self, spec):
    if spec.get("resource"):
      return self.handle(spec["resource"])
    value = array_of(spec)
    dtype = dtype_of(spec["dtype"])
    if self.graph_mode and spec.get("feed"):
      # Fed at run time: the shape function sees an unknown shape, so only the kernel can check.
      placeholder = tf.compat.v1.placeholder(dtype, shape=None)
      self.feeds[placeholder] = value
      return placeholder
    return tf.constant(value, dtype=dtype)

  def handle(self, res):
    kind = res["kind"]
    name = f"fuzz_{os.getpid()}_{next(_unique)}"
    if kind == "table":
      key_dtype = dtype_of(res["key_dtype"])
      handle = self.ops.tf_ext_dynamic_table(
        table_name=name, shared_name=name, key_dtype=key_dtype, dim=res["dim"]
      )
      if res["rows"]:
        keys = np.arange(res["rows"], dtype=np.int64)
        if res["key_dtype"] == "string":
          keys = np.array([b"k%d" % k for k in keys], dtype=object)
        values = np.ones([res["rows"], res["dim"]], np.float32)
        insert = self.ops.tf_ext_table_insert(
          table=handle,
          keys=tf.constant(keys, dtype=key_dtype),
          values=tf.constant(values),
          dim=res["dim"],
        )
        if self.graph_mode:
          self.init_ops.append(insert)
      self.created.append(handle)
    elif kind == "variable":
      shape, dtype = res["shape"], dtype_of(res["dtype"])
      handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name=name)
      assign = tf.raw_ops.AssignVariableOp(resource=handle, value=tf.zeros(shape, dtype))
      if self.graph_mode:
        self.init_ops.append(assign)
      self.created.append(handle)
    elif kind == "missing":  # a handle whose resource does not exist
      handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name=name)
    else:
      raise ValueError(f"unknown resource kind {kind}")
    count = res.get("count")
    if count is not None:  # a non-scalar handle tensor: `count` copies, or none
      handle = tf.gather(tf.stack([handle]), tf.zeros([count], tf.int32))
    return handle

  def release(self):
    for handle in self.created:
      tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)


def arguments(builder, call):
  kwargs = {}
  for name, value in call["inputs"].items():
    if isinstance(value, list):
      kwargs[name] = [builder.tensor(v) for v in value]
    else:
      kwargs[name] = builder.tensor(value)
  for name, value in call["attrs"].items():
    kwargs[name] = attr_value(value)
  return kwargs


def attr_value(value):
  if isinstance(value, dict):
    if "type" in value:
      return dtype_of(value["type"])
    if "types" in value:
      return [dtype_of(t) for t in value["types"]]
    if "bytes" in value:
      return bytes.fromhex(value["bytes"])
    if "strings" in value:
      return [bytes.fromhex(s) for s in value["strings"]]
  return value


def run_eager(ops, call):
  builder = Builder(ops, graph_mode=False)
  try:
    result = wrapper(ops, call["op"])(**arguments(builder, call))
    for t in tf.nest.flatten(result):
      if t is not None:
        t.numpy()
  finally:
    builder.release()


def run_graph(ops, call):
  graph = tf.Graph()
  with graph.as_default():
    builder = Builder(ops, graph_mode=True)
    result = wrapper(ops, call["op"])(**arguments(builder, call))
    fetches = tf.nest.flatten(result) or [tf.compat.v1.get_default_graph().get_operations()[-1]]
    with tf.compat.v1.Session(graph=graph) as session:
      if builder.init_ops:
        session.run(builder.init_ops)
      session.run(fetches, feed_dict=builder.feeds)


def run(ops, call):
  try:
    (run_graph if call["mode"] == "graph" else run_eager)(ops, call)
    return {"outcome": "result"}
  except tf.errors.OpError as error:
    return {"outcome": "tf_error", "detail": f"{type(error).__name__}: {essence(error.message)}"}
  except UnicodeDecodeError as error:
    # A TensorFlow error whose message holds non-UTF-8 bytes (a path, a table name): Python
    # cannot decode it. TensorFlow's own ops do the same (tf.raw_ops.ReadFile of such a path).
    return {"outcome": "tf_error", "detail": f"UnicodeDecodeError: {error.reason}"}
  except (TypeError, ValueError, OverflowError, NotImplementedError) as error:
    # The generated wrapper (or op construction) refused the arguments.
    return {"outcome": "rejected", "detail": f"{type(error).__name__}: {str(error)[:300]}"}
  except Exception:  # anything else is a bug, of the op's Python side or of this fuzzer
    return {"outcome": "error", "detail": traceback.format_exc(limit=-6)}


def essence(message):
  """An error message without TensorFlow's framing (function names, node traces)."""
  message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)
  lines = [line.strip() for line in message.splitlines()]
  skip = ("Graph execution error", "Detected at node", "[[", "File ")
  return " | ".join(line for line in lines if line and not line.startswith(skip))[:300]


def address_space_kb():
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmSize:"):
        return int(line.split()[1])
  return 0


def main():
  ops = _ops_loader.load()
  # Warm up both modes, so the thread pools exist before the address space is capped.
  warm = {"op": "TfExtXlaOngoingCompilations", "inputs": {}, "attrs": {}}
  for mode in ("eager", "graph"):
    run(ops, dict(warm, mode=mode))
  bound_mb = int(os.environ.get("FUZZ_OPS_MEMORY_BOUND_MB", "4096"))
  limit = address_space_kb() * 1024 + bound_mb * 2**20
  resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  _CHANNEL.write(json.dumps({"ready": os.getpid(), "address_space_limit": limit}) + "\n")
  for line in sys.stdin:
    call = json.loads(line)
    _CHANNEL.write(json.dumps(run(ops, call)) + "\n")


if __name__ == "__main__":
  main()

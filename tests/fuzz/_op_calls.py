"""Random calls of an op, drawn by Hypothesis from its OpDef alone (so a new op needs no code here).

A call is plain JSON (the corpus stores it, the worker reads it):
  {"op": "TfExtTableFind", "mode": "eager" | "graph",
   "inputs": {arg: tensor | [tensor, ...]}, "attrs": {attr: value}}
  tensor: {"dtype": "int64", "shape": [2, 0], "elements": [...], "pattern": "tile" | "arange",
           "feed": true (graph mode: a placeholder of unknown shape, fed at run time)}
       or {"resource": {"kind": "table", "key_dtype": "int64", "dim": 4, "rows": 3,
                        "count": 2 (optional: a vector of that many handles)}}
           ("variable": a float or int resource variable of some shape; "missing": a handle
           whose resource does not exist)
  Strings (string elements, string attrs) are hex, so that non-UTF-8 bytes survive JSON; types
  are their TensorFlow names.

Shapes are drawn from a few dimensions shared by the whole call, and integers from values the
call already uses (table dims, shape dims), so that inputs often agree with each other and reach
the kernel's later code; the rest is edges: 0-sized and huge-but-empty shapes, NaN and infinities,
negative and huge ids, empty and non-UTF-8 strings, attributes out of their range, wrong dtypes,
handles of the wrong resource, of no resource, or not scalar.
"""

import hypothesis.strategies as st
from tensorflow.core.framework import types_pb2

FLOATS = [0.0, 1.0, -1.0, 0.5, -0.0, 2.0, 1e-45, 1e6, 3.0e38, -3.0e38, 1e300]
FLOATS += [float("nan"), float("inf"), float("-inf")]
INTS = [0, 1, 2, -1, 3, 4, 7, 4096, 4097, 65536, 65537]
INTS += [2**31 - 1, 2**31, -(2**31), 2**40, 2**62, 2**63 - 1, -(2**63)]
STRINGS = [b"", b"k0", b"k1", b"a", b"\xff\xfe\x00\x80", b"\x00", b"x" * 1000]
# Paths, for the ops that read or write files: relative ones land in the worker's scratch folder.
STRINGS += [b"snap", b"snap.1", b"/nonexistent/dir/file", b"/dev/null", b".", b"/proc/self/status"]
# Words the ops' string attributes take, beyond their declared allowed values (combiners of list
# attributes, the table initializers).
WORDS = ["none", "sum", "mean", "sqrtn", "zeros", "constant", "uniform", "normal"]
WORDS += ["truncated_normal", "sgd", "adam", "ftrl", ""]
# The dtypes a tensor may take when the op's type is open or deliberately wrong.
DTYPES = ["float32", "int64", "int32", "string", "bool", "float64", "float16", "bfloat16"]
DTYPES += ["int8", "uint8"]
TABLE_DIMS = [1, 2, 3, 4, 8, 4096]
MAX_RANK = 4


def type_name(enum):
  return types_pb2.DataType.Name(enum)[len("DT_") :].lower()


def inferred_attrs(op_def):
  """The attrs the generated wrapper infers from the inputs (types and list lengths)."""
  names = set()
  for arg in op_def.input_arg:
    names.update(a for a in (arg.type_attr, arg.number_attr, arg.type_list_attr) if a)
  return names


def allowed_types(attr):
  return [type_name(t) for t in attr.allowed_values.list.type] or DTYPES


class Call:
  """The state of one drawn call: what later draws pick from."""

  def __init__(self, draw, mode):
    self.draw = draw
    self.mode = mode
    self.dims = draw(st.lists(st.sampled_from([1, 2, 3, 0, 4, 5, 16]), min_size=1, max_size=3))
    self.ints = list(self.dims) + [-1]  # -1: the usual "none" (since_version, now_step)
    # How often this call breaks a rule on purpose (a wrong dtype, a wrong handle, an out of range
    # integer): from never, to reach the kernels' later code, to often, to test their checks.
    self.chaos = self.pick([0.0, 0.05, 0.2])
    self.shapes = []  # drawn so far: a later shape often repeats or extends one
    self.key_types = []  # the int64 and string types drawn so far, for tables' keys
    self.lengths = []  # the lengths of the input lists and list attrs
    self.table_dims = []
    # The rank most of this call's tensors take (or none): ops of many scalars, or of many
    # vectors, get through only when their inputs agree.
    self.rank = self.pick([None, 0, 1])

  def pick(self, options):
    return self.draw(st.sampled_from(options))

  def length(self, minimum=0):
    """A list's length: often one the call already has (N tables, N keys, N dims)."""
    if self.lengths and not self.chance(self.chaos * 2 + 0.2):
      return self.pick(self.lengths)
    length = self.pick([1, 2, 0, 3, 4])
    return length if length >= minimum or self.chance(self.chaos) else minimum

  def chance(self, p):
    # True with probability p; shrinks to False.
    return self.draw(st.integers(0, 999)) >= 1000 * (1 - p)

  def shape(self):
    if self.shapes and self.chance(0.4):
      shape = list(self.pick(self.shapes))
      if self.chance(0.5):
        shape.append(self.pick(self.table_dims or self.ints))  # keys.shape + [dim]
    else:
      rank = self.rank
      if rank is None or self.chance(0.3):
        rank = self.pick([0, 1, 0, 1, 2, 0, 3, 1, 2, MAX_RANK])
      shape = [self.pick(self.dims + [0, 1]) for _ in range(rank)]
    if shape and self.chance(self.chaos):  # huge, but empty
      shape[self.draw(st.integers(0, len(shape) - 1))] = self.pick([2**31, 2**40])
      shape.append(0)
    while _size(shape) > 4096 or len(shape) > MAX_RANK + 1:
      shape.pop()
    self.shapes.append(shape)
    return shape

  def elements(self, dtype):
    if dtype == "string":
      pool = [s.hex() for s in STRINGS]
    elif dtype == "bool":
      pool = [False, True]
    elif dtype.startswith(("float", "bfloat", "half", "double")):
      pool = FLOATS + self.ints
    else:
      pool = self.ints + INTS
    return self.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))

  def tensor(self, dtype):
    if dtype == "resource":
      if self.chance(self.chaos / 2):
        return self.tensor("float32")  # not a handle at all
      return {"resource": self.resource()}
    if self.chance(self.chaos / 4):
      dtype = self.pick(DTYPES)  # the wrong dtype
    spec = {"dtype": dtype, "shape": self.shape(), "elements": self.elements(dtype)}
    if dtype not in ("string", "bool") and self.chance(0.2):
      spec["pattern"] = "arange"
    if self.mode == "graph" and self.chance(0.5):
      spec["feed"] = True
    return spec

  def resource(self):
    kind = "table" if not self.chance(self.chaos + 0.1) else self.pick(["variable", "missing"])
    if kind == "table":
      dim = self.pick(TABLE_DIMS + [d for d in self.dims if d >= 1])
      key_dtype = self.pick(self.key_types + ["int64", "string"])
      res = {"kind": kind, "key_dtype": key_dtype, "dim": dim}
      res["rows"] = self.pick([0, 3, 1, 100])
      self.ints.append(dim)
      self.table_dims.append(dim)
    elif kind == "variable":
      res = {"kind": kind, "dtype": self.pick(["float32", "int32"]), "shape": self.shape()}
    else:
      res = {"kind": kind}
    if self.chance(self.chaos / 2):
      res["count"] = self.pick([0, 2])
    return res

  def int_attr(self, attr):
    if self.table_dims and self.chance(0.5):
      return self.pick(self.table_dims)  # the op's dim, often
    if not self.chance(self.chaos * 2):
      return self.pick(self.ints)
    edges = [attr.minimum, attr.minimum - 1] if attr.has_minimum else []
    return self.pick(edges + INTS)

  def attr(self, attr):
    kind = attr.type
    if kind == "int":
      return self.int_attr(attr)
    if kind == "float":
      return self.pick(FLOATS if self.chance(self.chaos * 2) else [1.0, 0.5, 2.0, 0.0, 100.0])
    if kind == "bool":
      return self.pick([False, True])
    if kind == "string":
      allowed = list(attr.allowed_values.list.s)
      if allowed and not self.chance(self.chaos):
        return {"bytes": self.pick(allowed).hex()}
      return {"bytes": self.pick([w.encode() for w in WORDS] + STRINGS).hex()}
    if kind == "type":
      return {"type": self.pick(allowed_types(attr) if not self.chance(self.chaos) else DTYPES)}
    if kind == "shape":
      return self.shape()
    length = self.length(attr.minimum if attr.has_minimum else 0)
    self.lengths.append(length)
    if kind == "list(int)":
      return [self.int_attr(attr) for _ in range(length)]
    if kind == "list(float)":
      return [self.pick(FLOATS) for _ in range(length)]
    if kind == "list(bool)":
      return [self.pick([False, True]) for _ in range(length)]
    if kind == "list(string)":
      words = [w.encode() for w in WORDS] + STRINGS
      return {"strings": [self.pick(words).hex() for _ in range(length)]}
    if kind == "list(type)":
      return {"types": [self.pick(allowed_types(attr)) for _ in range(length)]}
    raise NotImplementedError(f"attr {attr.name} of type {kind}")


def _size(shape):
  size = 1
  for d in shape:
    size *= d
  return size


@st.composite
def op_calls(draw, op_def, mode):
  """A call of the op `op_def` describes, to run eagerly or in a graph (`mode`)."""
  call = Call(draw, mode)
  attrs_by_name = {a.name: a for a in op_def.attr}
  # What the inputs decide: each type attr's type, each list's length.
  types, lengths, type_lists = {}, {}, {}
  for name in sorted(inferred_attrs(op_def)):
    attr = attrs_by_name[name]
    if attr.type == "type":
      types[name] = call.pick(allowed_types(attr) if not call.chance(call.chaos) else DTYPES)
      if types[name] in ("int64", "string"):
        call.key_types.append(types[name])
    elif attr.type == "int":
      low = attr.minimum if attr.has_minimum else 0
      lengths[name] = draw(st.integers(max(low - 1, 0), max(low, 3)))
      if lengths[name] < low and not call.chance(call.chaos):
        lengths[name] = low
      call.ints.append(lengths[name])
      call.lengths.append(lengths[name])
    else:  # list(type)
      size = call.length(attr.minimum if attr.has_minimum else 0)
      type_lists[name] = [call.pick(allowed_types(attr)) for _ in range(size)]
      call.lengths.append(size)
      call.key_types += [t for t in type_lists[name] if t in ("int64", "string")]
  inputs = {}
  for arg in op_def.input_arg:
    dtype = type_name(arg.type) if arg.type else types.get(arg.type_attr)
    if arg.number_attr:
      count = lengths[arg.number_attr]
      if call.chance(call.chaos / 2):
        count += 1  # disagrees with the other lists of the same length
      inputs[arg.name] = [call.tensor(dtype) for _ in range(count)]
    elif arg.type_list_attr:
      inputs[arg.name] = [call.tensor(t) for t in type_lists[arg.type_list_attr]]
    else:
      inputs[arg.name] = call.tensor(dtype)
  attrs = {}
  # How often an attr keeps its default: often, so that ops with many attrs get through too.
  default_rate = call.pick([0.5, 0.9, 0.2])
  for attr in op_def.attr:
    if attr.name in types or attr.name in lengths or attr.name in type_lists:
      continue
    if attr.HasField("default_value") and call.chance(default_rate):
      continue  # the default
    attrs[attr.name] = call.attr(attr)
  return {"op": op_def.name, "mode": mode, "inputs": inputs, "attrs": attrs}

"""Initial rows of missing ids, as a (kind, a, b, seed) spec the kernels compute per key."""

import collections
import numbers

import tensorflow as tf

InitializerSpec = collections.namedtuple(
  "InitializerSpec", ["kind", "a", "b", "seed", "version"], defaults=(1,)
)
"""An initializer as the kernels compute it per key: `kind` (one of "zeros", "constant", "uniform",
"normal", "truncated_normal"), its parameters `a` and `b` (constant: the value in `a`; uniform:
minval and maxval; normal and truncated_normal: mean and stddev), `seed` and `version`, the
generator of normal and truncated_normal rows: 1 (the default, frozen) or 2 (float math, about
eight times faster per row; docs/dynamic_embedding.md, Initializers). Tables take one wherever
they take an initializer; `InitializerSpec("normal", 0.0, 0.05, 0, version=2)` asks for version 2.
"""

# The kernel's kinds (ParseInitializerKind), checked by tests/dynamic_embedding/test_op_facts.py.
KINDS = ("zeros", "constant", "uniform", "normal", "truncated_normal")
# The kernel's initializer versions (kOldestInitializerVersion to kNewestInitializerVersion).
VERSIONS = (1, 2)
_DEFAULTS = {  # (a, b) for a kind given by name
  "zeros": (0.0, 0.0),
  "constant": (0.0, 0.0),
  "uniform": (-0.05, 0.05),
  "normal": (0.0, 0.05),
  "truncated_normal": (0.0, 0.05),
}
# The rows of `initializer=None`: small, so that a new id adds little noise to the model (in an FM
# term, the products of every pair of fields' rows), yet not zero, so that a dot product of two
# tables' rows has a gradient. docs/benchmarks.md (Model quality against TFRA) measures it against
# the former default, uniform in [-0.05, 0.05): +0.012 AUC on the all-to-all workload.
DEFAULT_INITIALIZER = InitializerSpec("normal", 0.0, 0.001, 0)
# Class name of a TF / Keras initializer -> (kind, config key of a, config key of b).
_BY_CLASS = {
  "Zeros": ("zeros", None, None),
  "Ones": ("constant", None, None),
  "Constant": ("constant", "value", None),
  "RandomUniform": ("uniform", "minval", "maxval"),
  "RandomNormal": ("normal", "mean", "stddev"),
  "TruncatedNormal": ("truncated_normal", "mean", "stddev"),
}
_CLASS_ALIASES = {
  "zeros_initializer": "Zeros",
  "ones_initializer": "Ones",
  "constant_initializer": "Constant",
  "random_uniform_initializer": "RandomUniform",
  "random_normal_initializer": "RandomNormal",
  "truncated_normal_initializer": "TruncatedNormal",
}


def _error(table_name, message):
  return tf.errors.InvalidArgumentError(
    None, None, f"dynamic embedding table '{table_name}': {message}"
  )


def spec_from(initializer, dim, table_name):
  """An InitializerSpec from None, a name, a number, a spec/tuple/dict or an initializer object."""
  del dim  # the spec is per element; kept in the signature for scaled defaults later
  if initializer is None:
    return DEFAULT_INITIALIZER
  if isinstance(initializer, InitializerSpec):
    spec = initializer
  elif isinstance(initializer, dict):
    spec = InitializerSpec(
      initializer.get("kind"),
      float(initializer.get("a", 0.0)),
      float(initializer.get("b", 0.0)),
      int(initializer.get("seed", 0)),
      int(initializer.get("version", 1)),
    )
  elif isinstance(initializer, str):
    if initializer not in _DEFAULTS:
      raise _error(
        table_name,
        f"unknown initializer '{initializer}'; use one of {KINDS} or an initializer object",
      )
    spec = InitializerSpec(initializer, *_DEFAULTS[initializer], 0)
  elif isinstance(initializer, numbers.Real) and not isinstance(initializer, bool):
    spec = InitializerSpec("constant", float(initializer), 0.0, 0)
  else:
    spec = _from_object(initializer, table_name)
  if spec.kind not in KINDS:
    raise _error(table_name, f"unknown initializer kind {spec.kind!r}")
  if spec.version not in VERSIONS:
    raise _error(table_name, f"unknown initializer version {spec.version!r}; known: {VERSIONS}")
  if spec.kind == "uniform" and not spec.a < spec.b:
    raise _error(table_name, f"uniform initializer needs minval < maxval, got [{spec.a}, {spec.b})")
  if spec.kind in ("normal", "truncated_normal") and not spec.b > 0:
    raise _error(table_name, f"{spec.kind} initializer needs stddev > 0, got {spec.b}")
  return spec


def _from_object(initializer, table_name):
  class_name = _CLASS_ALIASES.get(type(initializer).__name__, type(initializer).__name__)
  if class_name not in _BY_CLASS or not hasattr(initializer, "get_config"):
    raise _error(
      table_name,
      f"unsupported initializer {initializer!r}; use Zeros, Ones, Constant, "
      "RandomUniform, RandomNormal or TruncatedNormal (TF or Keras), a number or a name",
    )
  kind, a_key, b_key = _BY_CLASS[class_name]
  config = initializer.get_config()
  a = (
    1.0
    if class_name == "Ones"
    else float(_scalar(config.get(a_key, 0.0), table_name))
    if a_key
    else 0.0
  )
  b = float(config.get(b_key, 0.0)) if b_key else 0.0
  seed = config.get("seed") or 0
  return InitializerSpec(kind, a, b, int(seed))


def _scalar(value, table_name):
  try:
    return float(value)
  except (TypeError, ValueError):
    raise _error(table_name, f"a constant initializer must be a scalar, got {value!r}") from None


def to_config(spec):
  return dict(spec._asdict())

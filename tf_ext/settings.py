"""Every TF_EXT_* / LIGHT_* setting of tf_ext, declared once: name, default, meaning.

Read a setting with `get("NAME")`; the environment overrides the default. Code elsewhere must
not read these variables from `os.environ` directly.
"""

import dataclasses
import os
from typing import Callable, Dict


def _flag(raw):
  value = raw.strip().lower()
  if value in ("1", "true", "yes", "on"):
    return True
  if value in ("0", "false", "no", "off", ""):
    return False
  raise ValueError("expected 0 or 1")


def _int_at_least(minimum):
  def parse(raw):
    value = int(raw)
    if value < minimum:
      raise ValueError(f"must be >= {minimum}")
    return value

  return parse


def _fraction(raw):
  value = float(raw)
  if not 0.0 < value <= 1.0:
    raise ValueError("must be in (0, 1]")
  return value


def _positive_list(raw):
  values = [float(item) for item in raw.split(",") if item.strip()]
  if not values or any(v <= 0 for v in values) or values != sorted(values):
    raise ValueError("must be positive numbers in increasing order, e.g. 1,4,16")
  return values


@dataclasses.dataclass(frozen=True)
class Setting:
  name: str
  default: str
  meaning: str
  parse: Callable[[str], object] = str


SETTINGS: Dict[str, Setting] = {
  s.name: s
  for s in [
    Setting(
      "TF_EXT_OPS_LIBRARY",
      "",
      "Path of the op library to load instead of the _tf_ext_ops.so inside the package.",
    ),
    Setting(
      "TF_EXT_CACHE_DIR",
      "~/.cache/tf_ext",
      "Machine-wide cache of `make setup`, outside the work tree so fresh clones reuse it: "
      "wheels/ holds the Horovod wheel built from source (empty means the default).",
    ),
    # LightCC (tf_ext.lightcc): read at hvd.init(); init(light_<name>=...) overrides them.
    Setting(
      "LIGHT_2D_ALLREDUCE",
      "0",
      "Use 2D allreduce: reduce-scatter in each group of "
      "LIGHT_INTRA_SIZE ranks, allreduce across groups, allgather in the group.",
      _flag,
    ),
    Setting(
      "LIGHT_INTRA_SIZE",
      "8",
      "Ranks per group (node) in 2D allreduce; must divide the world size.",
      _int_at_least(1),
    ),
    Setting(
      "LIGHT_HIERARCHICAL_THRESHOLD",
      "1073741824",
      "Bytes; tensors up to this size use 2D allreduce, larger ones Horovod's flat allreduce.",
      _int_at_least(0),
    ),
    Setting(
      "LIGHT_TOPK_ALLREDUCE",
      "0",
      "Use TOPK compressed communication with error feedback for gradients.",
      _flag,
    ),
    Setting(
      "LIGHT_TOPK_RATIO", "0.01", "Fraction of a gradient's entries sent, in (0, 1].", _fraction
    ),
    Setting(
      "LIGHT_TOPK_THRESHOLD",
      "1048576",
      "Bytes; gradients at least this size are TOPK-compressed, smaller ones reduced densely.",
      _int_at_least(0),
    ),
    Setting("LIGHT_TOPK_FP16", "0", "Send TOPK values as float16.", _flag),
    # Adaptive gradient fusion (tf_ext/lightcc/fusion.py has the policy).
    Setting(
      "LIGHT_FUSION",
      "0",
      "Reduce dense gradients (TOPK ones included) in buckets, in "
      "backprop order, with the bucket size chosen from measured step times.",
      _flag,
    ),
    Setting(
      "LIGHT_FUSION_BUCKETS_MB",
      "1,4,16,64",
      "Candidate bucket sizes in MiB, in increasing order.",
      _positive_list,
    ),
    Setting(
      "LIGHT_FUSION_PROBE_STEPS",
      "5",
      "Steps each candidate runs when probed (the first is not counted).",
      _int_at_least(2),
    ),
    Setting(
      "LIGHT_FUSION_REPROBE_STEPS",
      "200",
      "Steps between re-probes of the chosen size's neighbours; 0 never re-probes.",
      _int_at_least(0),
    ),
  ]
}


def get(name, value=None):
  """The parsed value of setting `name`: `value` if given, else the environment's, else the default."""
  setting = SETTINGS[name]
  raw = value if value is not None else os.environ.get(name, setting.default)
  try:
    return setting.parse(raw)
  except ValueError as error:
    raise ValueError(f"{name}={raw!r} is invalid: {error} ({setting.meaning})") from None

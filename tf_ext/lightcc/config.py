"""LightCC's resolved configuration: LIGHT_* settings (tf_ext/settings.py) plus init() keywords.

Keywords are the variables' names in lower case, e.g. `hvd.init(light_topk_allreduce=1)`; they
override the environment. Every value is checked at init, and a bad one raises ValueError naming
the variable.
"""

import dataclasses

from tf_ext import settings

_NAMES = (
  "LIGHT_2D_ALLREDUCE",
  "LIGHT_INTRA_SIZE",
  "LIGHT_HIERARCHICAL_THRESHOLD",
  "LIGHT_TOPK_ALLREDUCE",
  "LIGHT_TOPK_RATIO",
  "LIGHT_TOPK_THRESHOLD",
  "LIGHT_TOPK_FP16",
  "LIGHT_FUSION",
  "LIGHT_FUSION_BUCKETS_MB",
  "LIGHT_FUSION_PROBE_STEPS",
  "LIGHT_FUSION_REPROBE_STEPS",
)


@dataclasses.dataclass(frozen=True)
class LightConfig:
  two_d: bool = False
  intra_size: int = 8
  hierarchical_threshold: int = 1 << 30
  topk: bool = False
  topk_ratio: float = 0.01
  topk_threshold: int = 1 << 20
  topk_fp16: bool = False
  fusion: bool = False
  fusion_buckets_mb: tuple = (1.0, 4.0, 16.0, 64.0)
  fusion_probe_steps: int = 5
  fusion_reprobe_steps: int = 200

  @property
  def enabled(self):
    """Whether anything differs from plain Horovod."""
    return self.two_d or self.topk or self.fusion


def resolve(world_size, keywords):
  """The configuration from the environment and `keywords` (consumed), validated for world_size."""
  values = {}
  for name in _NAMES:
    override = keywords.pop(name.lower(), None)
    if isinstance(override, (list, tuple)):
      override = ",".join(str(v) for v in override)
    values[name] = settings.get(name, None if override is None else str(override))
  unknown = [k for k in keywords if k.startswith("light_")]
  if unknown:
    raise ValueError(f"unknown LightCC setting(s) {unknown}; known: {[n.lower() for n in _NAMES]}")
  config = LightConfig(
    two_d=values["LIGHT_2D_ALLREDUCE"],
    intra_size=values["LIGHT_INTRA_SIZE"],
    hierarchical_threshold=values["LIGHT_HIERARCHICAL_THRESHOLD"],
    topk=values["LIGHT_TOPK_ALLREDUCE"],
    topk_ratio=values["LIGHT_TOPK_RATIO"],
    topk_threshold=values["LIGHT_TOPK_THRESHOLD"],
    topk_fp16=values["LIGHT_TOPK_FP16"],
    fusion=values["LIGHT_FUSION"],
    fusion_buckets_mb=tuple(values["LIGHT_FUSION_BUCKETS_MB"]),
    fusion_probe_steps=values["LIGHT_FUSION_PROBE_STEPS"],
    fusion_reprobe_steps=values["LIGHT_FUSION_REPROBE_STEPS"],
  )
  if config.two_d and world_size % config.intra_size:
    raise ValueError(
      f"LIGHT_INTRA_SIZE={config.intra_size} does not divide the world size {world_size}: 2D "
      "allreduce needs groups of equal size (set LIGHT_INTRA_SIZE to the ranks per host)"
    )
  return config

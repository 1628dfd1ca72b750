"""LightCC's resolved configuration: LIGHT_* settings (tf_ext/settings.py) plus init() keywords.

Keywords are the variables' names in lower case, e.g. `hvd.init(light_topk_allreduce=1)`; they
override the environment. Every value is checked at init, and a bad one raises ValueError naming
the variable.
"""
import dataclasses

from tf_ext import settings

_NAMES = ("LIGHT_2D_ALLREDUCE", "LIGHT_INTRA_SIZE", "LIGHT_HIERARCHICAL_THRESHOLD",
          "LIGHT_TOPK_ALLREDUCE", "LIGHT_TOPK_RATIO", "LIGHT_TOPK_THRESHOLD", "LIGHT_TOPK_FP16")


@dataclasses.dataclass(frozen=True)
class LightConfig:
  two_d: bool = False
  intra_size: int = 8
  hierarchical_threshold: int = 1 << 30
  topk: bool = False
  topk_ratio: float = 0.01
  topk_threshold: int = 1 << 20
  topk_fp16: bool = False

  @property
  def enabled(self):
    """Whether anything differs from plain Horovod."""
    return self.two_d or self.topk


def resolve(world_size, keywords):
  """The configuration from the environment and `keywords` (consumed), validated for world_size."""
  values = {}
  for name in _NAMES:
    override = keywords.pop(name.lower(), None)
    values[name] = settings.get(name, None if override is None else str(override))
  unknown = [k for k in keywords if k.startswith("light_")]
  if unknown:
    raise ValueError(f"unknown LightCC setting(s) {unknown}; known: {[n.lower() for n in _NAMES]}")
  config = LightConfig(
      two_d=values["LIGHT_2D_ALLREDUCE"], intra_size=values["LIGHT_INTRA_SIZE"],
      hierarchical_threshold=values["LIGHT_HIERARCHICAL_THRESHOLD"],
      topk=values["LIGHT_TOPK_ALLREDUCE"], topk_ratio=values["LIGHT_TOPK_RATIO"],
      topk_threshold=values["LIGHT_TOPK_THRESHOLD"], topk_fp16=values["LIGHT_TOPK_FP16"])
  if config.two_d and world_size % config.intra_size:
    raise ValueError(
        f"LIGHT_INTRA_SIZE={config.intra_size} does not divide the world size {world_size}: 2D "
        "allreduce needs groups of equal size (set LIGHT_INTRA_SIZE to the ranks per host)")
  return config

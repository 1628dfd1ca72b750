"""LightCC's resolved configuration: its settings (capability "lightcc" in tf_ext/settings.py) plus
init() keywords.

Keywords are the variables' names in lower case, e.g. `hvd.init(light_topk_allreduce=1)`; they
override the environment. Every value is checked at init, and a bad one raises ValueError naming
the variable. LightConfig's fields and defaults come from the declarations: a new LIGHT_* setting
is declared in tf_ext/settings.py only.
"""

from tf_ext import settings


def _enabled(config):
  """Whether anything differs from plain Horovod."""
  return config.two_d or config.topk or config.fusion


LightConfig = settings.config_class(
  "lightcc",
  "LightConfig",
  namespace={
    "__doc__": "LightCC's configuration: one field per LIGHT_* setting (its `attribute` in "
    "tf_ext/settings.py), defaulting to the setting's parsed default.",
    "enabled": property(_enabled),
  },
  module=__name__,
)


def resolve(world_size, keywords):
  """The configuration from the environment and `keywords` (consumed), validated for world_size."""
  declared = settings.of("lightcc")
  values = {}
  for setting in declared:
    override = keywords.pop(setting.name.lower(), None)
    if isinstance(override, (list, tuple)):
      override = ",".join(str(v) for v in override)
    values[setting.attribute] = settings.get(
      setting.name, None if override is None else str(override)
    )
  unknown = [k for k in keywords if k.startswith("light_")]
  if unknown:
    known = [s.name.lower() for s in declared]
    raise ValueError(f"unknown LightCC setting(s) {unknown}; known: {known}")
  config = LightConfig(**values)
  if config.two_d and world_size % config.intra_size:
    raise ValueError(
      f"LIGHT_INTRA_SIZE={config.intra_size} does not divide the world size {world_size}: 2D "
      "allreduce needs groups of equal size (set LIGHT_INTRA_SIZE to the ranks per host)"
    )
  return config

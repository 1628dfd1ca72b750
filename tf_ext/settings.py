"""Every TF_EXT_* / LIGHT_* setting of tf_ext, declared once: name, default, meaning.

Read a setting with `get("NAME")`; the environment overrides the default. Code elsewhere must
not read these variables from `os.environ` directly.
"""
import dataclasses
import os
from typing import Callable, Dict


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
            "TF_EXT_OPS_LIBRARY", "",
            "Path of the op library to load instead of the _tf_ext_ops.so inside the package."),
    ]
}


def get(name):
  """The parsed value of setting `name`: the environment's if set, else its default."""
  setting = SETTINGS[name]
  raw = os.environ.get(name, setting.default)
  try:
    return setting.parse(raw)
  except ValueError as error:
    raise ValueError(f"{name}={raw!r} is invalid: {error} ({setting.meaning})") from None

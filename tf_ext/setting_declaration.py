"""What declaring a setting is: a Setting, checked when it is declared, and the registry that
collects the declarations (tf_ext/settings.py declares every setting).

Prefixes (enforced when a setting is declared, see CAPABILITIES):
  TF_EXT_*  the package and its in-TensorFlow capabilities (dynamic_embedding, mixed_precision,
            graph, jit)
  LIGHT_*   LightCC (tf_ext.lightcc); its init() also takes them as light_<name> keywords
  HARP_*    HARP, the NCCL network plugin: read by the plugin outside TensorFlow, declared here so
            that they are documented with the rest

A declaration gives the default as the raw string the environment would hold, and a parser from
that string to the value (raising ValueError with the reason when the string is invalid). Where a
capability has a config object, `attribute` is the setting's field name there.
"""

import dataclasses
import re
from typing import Callable, Optional

# Capability -> prefix of its settings' names.
CAPABILITIES = {
  "tf_ext": "TF_EXT_",  # the package itself: loading, set-up
  "dynamic_embedding": "TF_EXT_",
  "mixed_precision": "TF_EXT_",
  "graph": "TF_EXT_",
  "jit": "TF_EXT_",
  "lightcc": "LIGHT_",
  "harp": "HARP_",
}


@dataclasses.dataclass(frozen=True)
class Setting:
  """One setting. Declaring it checks the name's prefix against its capability and its default."""

  name: str
  default: str  # as the environment holds it; "" for empty
  meaning: str  # one line; shown in docs/settings.md and in error messages
  capability: str
  parse: Callable[[str], object] = str
  attribute: Optional[str] = None  # field name in the capability's config object, if it has one

  def __post_init__(self):
    prefix = CAPABILITIES.get(self.capability)
    if prefix is None:
      raise ValueError(
        f"setting {self.name}: unknown capability {self.capability!r}; known: {list(CAPABILITIES)}"
      )
    if not re.fullmatch(re.escape(prefix) + r"[A-Z0-9_]+", self.name):
      raise ValueError(
        f"setting {self.name!r} of capability {self.capability!r} must be named {prefix}<NAME> "
        "(upper case, digits, underscores): TF_EXT_* for the package and its in-TensorFlow "
        "capabilities, LIGHT_* for LightCC, HARP_* for HARP"
      )
    if self.attribute is not None and not self.attribute.isidentifier():
      raise ValueError(f"setting {self.name}: attribute {self.attribute!r} is not an identifier")
    for field in ("default", "meaning"):
      if any(c in getattr(self, field) for c in "|\n"):
        raise ValueError(f"setting {self.name}: its {field} must be one line without '|'")
    if not self.meaning:
      raise ValueError(f"setting {self.name}: its meaning is empty")
    self.value(self.default)  # the default must parse

  def value(self, raw):
    """`raw` parsed; ValueError "NAME='raw' is invalid: why (meaning)" if it does not parse."""
    try:
      return self.parse(raw)
    except ValueError as error:
      raise ValueError(f"{self.name}={raw!r} is invalid: {error} ({self.meaning})") from None

  def parsed_default(self):
    return self.value(self.default)


def registry(declarations):
  """{name: Setting} in declaration order; ValueError if a name, or a config attribute within a
  capability, is declared twice."""
  by_name, attributes = {}, set()
  for setting in declarations:
    if setting.name in by_name:
      raise ValueError(f"setting {setting.name} is declared twice")
    if setting.attribute is not None:
      if (setting.capability, setting.attribute) in attributes:
        raise ValueError(
          f"setting {setting.name}: attribute {setting.attribute!r} is already used by another "
          f"setting of {setting.capability!r}"
        )
      attributes.add((setting.capability, setting.attribute))
    by_name[setting.name] = setting
  return by_name

"""The options of tf_ext.jit, declared once.

tf_ext.jit.function (and Function), tf_ext.jit.compile and tf_ext.jit.Bucketing take the same
options as keyword arguments. `OPTIONS` declares each: its name, the TF_EXT_JIT_* setting it
defaults to (tf_ext/settings.py, which says what it means) and, for the option without a setting,
its meaning. The entry points check their keywords against it (`check`), read the values through
it (`value`: the argument, checked like its setting, else the setting) and append its listing to
their docstrings (`documented`).

Why `**options` checked here, not a keyword argument per option in each signature or an options
object: the entry points share these options and differ only in their own arguments (paddable,
output_dims, name; Keras' compile arguments), and writing the options out in each signature is
how the signatures and their docstrings drifted apart. Users still write
`tf_ext.jit.function(fn, max_buckets=4)`; an unknown keyword is a TypeError, as it would be in an
explicit signature.
"""

import dataclasses
import inspect
import textwrap
from typing import Optional

from tf_ext import settings


@dataclasses.dataclass(frozen=True)
class Option:
  """One option of tf_ext.jit."""

  name: str  # the keyword argument
  setting: Optional[str]  # the TF_EXT_JIT_* setting it defaults to; None: no default
  meaning: str = ""  # for an option without a setting (the setting's meaning says it otherwise)
  accepts: str = ""  # values it takes beyond its setting's

  def describe(self):
    """One line for a docstring: the name, the setting and its default, the meaning."""
    if self.setting is None:
      return f"`{self.name}`: {self.meaning}"
    setting = settings.SETTINGS[self.setting]
    accepts = f" Also: {self.accepts}." if self.accepts else ""
    meaning = setting.meaning.removeprefix("tf_ext.jit: ")
    return f"`{self.name}` (default `{setting.name}={setting.default}`): {meaning}{accepts}"


OPTIONS = (
  Option("max_executables", "TF_EXT_JIT_MAX_EXECUTABLES"),
  Option("max_buckets", "TF_EXT_JIT_MAX_BUCKETS"),
  Option("max_size", "TF_EXT_JIT_MAX_SIZE", accepts="{dimension name: size}, one per dimension"),
  Option("min_observations", "TF_EXT_JIT_MIN_OBSERVATIONS"),
  Option("min_gain", "TF_EXT_JIT_MIN_GAIN"),
  Option("replan_gain", "TF_EXT_JIT_REPLAN_GAIN"),
  Option("async_compile", "TF_EXT_JIT_ASYNC"),
  Option("adaptive", "TF_EXT_JIT_ADAPTIVE"),
  Option(
    "plan_path",
    None,
    "where the bucket plan is kept for a warm restart: a .json file (or an existing file), else "
    "a directory (made if missing) that gets tf_ext_jit_plan.<name>.json. Without it nothing is "
    "saved or read.",
  ),
)
NAMES = frozenset(option.name for option in OPTIONS)
_BY_NAME = {option.name: option for option in OPTIONS}


def check(options, caller):
  """TypeError "<caller>: unknown arguments [...]" if `options` has a keyword that is no option."""
  unknown = set(options) - NAMES
  if unknown:
    raise TypeError(f"{caller}: unknown arguments {sorted(unknown)}")


def value(name, given=None):
  """Option `name`'s value: `given` if not None (checked like its setting: ValueError
  "TF_EXT_JIT_...='raw' is invalid: ..."), else its setting's."""
  if isinstance(given, bool):
    given = int(given)
  return settings.get(_BY_NAME[name].setting, None if given is None else str(given))


def listing():
  """The options as a Markdown list, one item per option (docstrings and the API reference)."""
  return "\n".join(
    textwrap.fill(option.describe(), 100, initial_indent="- ", subsequent_indent="  ")
    for option in OPTIONS
  )


def documented(entry_point):
  """Decorator: appends the list of options to `entry_point`'s docstring (for help())."""
  doc = inspect.cleandoc(entry_point.__doc__ or "")
  entry_point.__doc__ = f"{doc}\n\nOptions (tf_ext/jit/options.py):\n\n{listing()}\n"
  return entry_point

"""Public import paths whose code lives elsewhere: tf_ext.keras is tf_ext.dynamic_embedding.keras.

Code belongs to its capability, but users import some of it by older, shorter paths. Such a path
is a package whose `__init__` calls `alias`: the import then returns the capability's package
itself, and each of its submodules (at any depth) under the old name too (`tf_ext.keras.layers` is
`tf_ext.dynamic_embedding.keras.layers`). One module object per file, so classes, registries and
isinstance checks are the same whichever path imported them.
"""

import importlib
import pkgutil
import sys


def alias(name, target, commands=()):
  """Makes the package `name` (the caller's `__name__`) be the package `target`, and its submodules
  be `target`'s. `commands`: submodules run as `python -m <name>.<command>`, left out (runpy must
  find them by the old name itself)."""
  package = importlib.import_module(target)
  sys.modules[name] = package
  # Nested packages too: a submodule imported by its old path would otherwise load again.
  for submodule in pkgutil.iter_modules(getattr(package, "__path__", [])):
    if submodule.name not in commands:
      alias(f"{name}.{submodule.name}", f"{target}.{submodule.name}")
  return package

"""The drop-in surface: a module of ours stands in for a Horovod module.

Names we implement or re-export are written out in the module itself. Every other attribute of
the Horovod module (its private helpers, e.g. `hvd._executing_eagerly()`, which Horovod's own
test code calls, and anything a later Horovod adds) resolves through a module-level __getattr__
(PEP 562) to the Horovod module's own object, and dir() lists both.
"""

import importlib


def fallback(module_name, module_globals, horovod_module, own_submodules=()):
  """(__getattr__, __dir__) for the module `module_name`: names it lacks resolve on
  `horovod_module`; `own_submodules` (e.g. "keras") are our submodules, imported on first use."""

  def __getattr__(name):  # noqa: N807 (PEP 562)
    if name in own_submodules:
      return importlib.import_module(f"{module_name}.{name}")
    try:
      return getattr(horovod_module, name)
    except AttributeError:
      raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None

  def __dir__():  # noqa: N807 (PEP 562)
    return sorted(set(module_globals) | set(dir(horovod_module)) | set(own_submodules))

  return __getattr__, __dir__

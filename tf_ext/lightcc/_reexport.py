"""Copies a Horovod module's public names into one of ours (the drop-in surface)."""

import types


def public_names(module, exclude=()):
  """Public functions, classes and constants of `module`, plus its horovod.* submodules."""
  return {
    name: value
    for name, value in vars(module).items()
    if not name.startswith("_")
    and name not in exclude
    and (not isinstance(value, types.ModuleType) or value.__name__.startswith("horovod."))
  }

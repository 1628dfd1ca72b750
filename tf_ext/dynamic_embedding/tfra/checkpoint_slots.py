"""Optimizers: TFRA's slot names in tf_ext's slot order, and the steps TFRA's optimizer took."""

import math
import re
import warnings

import tensorflow as tf

# The slots of each tf_ext update kind (optimizers.h NumSlots), by the names TFRA's slot Variables
# have under TF1, Keras and legacy Keras optimizers.
_KIND_SLOTS = {
  "sgd": [],
  "adagrad": [("accumulator",)],
  "momentum": [("momentum",)],
  "keras_momentum": [("m", "momentum")],
  "adam": [("m",), ("v",)],
  "amsgrad": [("m",), ("v",), ("vhat",)],
  "ftrl": [("accumulator", "accum"), ("linear",)],
}
SLOT_NAMES = {name for slots in _KIND_SLOTS.values() for names in slots for name in names}


def _update_kind(optimizer):
  """The tf_ext update kind of an optimizer (the wrapped one of a DynamicEmbeddingOptimizer)."""
  v1, keras, legacy = tf.compat.v1.train, tf.keras.optimizers, tf.keras.optimizers.legacy
  for cls, kind in (
    (v1.GradientDescentOptimizer, "sgd"),
    (v1.AdagradOptimizer, "adagrad"),
    (v1.AdamOptimizer, "adam"),
    (v1.MomentumOptimizer, "momentum"),
    (v1.FtrlOptimizer, "ftrl"),
    (keras.Adagrad, "adagrad"),
    (keras.Ftrl, "ftrl"),
    (legacy.Adagrad, "adagrad"),
    (legacy.Ftrl, "ftrl"),
  ):
    if isinstance(optimizer, cls):
      return kind
  if isinstance(optimizer, (keras.Adam, legacy.Adam)):
    return "amsgrad" if optimizer.amsgrad else "adam"
  if isinstance(optimizer, keras.SGD):
    momentum = optimizer.momentum
    return "sgd" if isinstance(momentum, (int, float)) and momentum == 0 else "keras_momentum"
  if isinstance(optimizer, legacy.SGD):
    return "keras_momentum" if optimizer._momentum else "sgd"  # noqa: SLF001
  raise ValueError(
    f"tf_ext.tfra: cannot restore slots for a {type(optimizer).__name__}; use SGD, Momentum, "
    "Adagrad, Adam or Ftrl (tf.compat.v1.train or tf.keras.optimizers)"
  )


def _kind_of_slots(names):
  """The update kind whose slots are exactly `names` (TFRA slot names), or None."""
  names = set(names)
  for kind, slots in _KIND_SLOTS.items():
    if len(slots) == len(names) and all(any(n in names for n in choice) for choice in slots):
      return kind
  return None


def _slot_initial_values(kind, optimizer):
  values = [0.0] * len(_KIND_SLOTS[kind])
  if kind in ("adagrad", "ftrl"):
    # TF1's and Keras' default initial accumulator: 0.1.
    value = 0.1
    if optimizer is not None:
      value = getattr(optimizer, "initial_accumulator_value", None)
      if value is None:
        value = getattr(optimizer, "_initial_accumulator_value", 0.1)
    values[0] = float(value)
  return values


def optimizer_slots(checkpoint, name, optimizer=None, exclude=()):
  """(kind, [TableGroup or None per tf_ext slot], slot_initial_values) of the Variable `name`.

  With `optimizer` (TF1, Keras or legacy Keras, as the tf_ext program trains with), its slots;
  without, the kind whose slots the checkpoint holds. A slot the checkpoint lacks is None (its
  rows start at its initial value)."""
  scopes = checkpoint.slot_groups(name, exclude)
  if optimizer is not None:
    kind = _update_kind(optimizer)
    wanted = _KIND_SLOTS[kind]
    usable = {
      scope: slots
      for scope, slots in scopes.items()
      if any(n in slots for choice in wanted for n in choice)
    }
  else:
    usable = {s: slots for s, slots in scopes.items() if _kind_of_slots(slots)}
    kinds = {_kind_of_slots(slots) for slots in usable.values()}
    if len(kinds) > 1:
      raise ValueError(
        f"tf_ext.tfra: TFRA checkpoint '{checkpoint.path}' holds slots of several optimizers for "
        f"'{name}' ({sorted(kinds)}): pass optimizer= to say which"
      )
    kind = kinds.pop() if kinds else "sgd"
    wanted = _KIND_SLOTS[kind]
  if len(usable) > 1:
    raise ValueError(
      f"tf_ext.tfra: TFRA checkpoint '{checkpoint.path}' holds slots of '{name}' under several "
      f"scopes ({sorted(usable)}); restore them one optimizer at a time"
    )
  slots = next(iter(usable.values())) if usable else {}
  chosen = [next((slots[n] for n in choice if n in slots), None) for choice in wanted]
  return kind, chosen, _slot_initial_values(kind, optimizer)


def step_count(checkpoint, optimizer=None):
  """The number of steps TFRA's optimizer took (Adam's t), from the checkpoint: Keras'
  `iterations`, TF1 Adam's beta1_power (beta1 from `optimizer`, else 0.9) or `global_step`; 0
  when it holds none of them."""
  bundle = checkpoint.bundle
  if bundle is None:
    return 0
  names = bundle.entries
  iterations = [
    n for n in names if re.search(r"(^|/)(_iterations|iter)/\.ATTRIBUTES/VARIABLE_VALUE$", n)
  ]
  tf1_adam = isinstance(optimizer, tf.compat.v1.train.AdamOptimizer)
  if iterations and not tf1_adam:
    return int(bundle.read(sorted(iterations)[0]))
  if "beta1_power" in names:
    beta1 = 0.9
    if tf1_adam:
      beta1 = float(optimizer._call_if_callable(optimizer._beta1))  # noqa: SLF001
    power = float(bundle.read("beta1_power"))
    if any(re.match(r"^beta1_power_\d+$", n) for n in names):
      warnings.warn(
        f"tf_ext.tfra: TFRA checkpoint '{checkpoint.path}' holds the beta powers of several Adam "
        "optimizers; the step count comes from 'beta1_power' (pass update_count= otherwise)",
        stacklevel=3,
      )
    if 0.0 < power < 1.0 and 0.0 < beta1 < 1.0:
      return max(int(round(math.log(power) / math.log(beta1))) - 1, 0)
  for name in ("global_step", "global_step/.ATTRIBUTES/VARIABLE_VALUE"):
    if name in names:
      return int(bundle.read(name))
  if iterations:
    return int(bundle.read(sorted(iterations)[0]))
  return 0

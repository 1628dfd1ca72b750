"""Admission and eviction policies of a dynamic embedding table, and its statistics.

- `FrequencyAdmission(min_count)`: an id gets a row only at its `min_count`-th training update.
  Until then it reads its initial row, its gradient is dropped and it costs no table entry; only
  its count is kept, in a count-min sketch of bounded memory (or exact counters, if asked). The
  sketch never under-counts, so it can admit an id early (a false admission), never late.
- `EvictionPolicy(...)`: which rows `table.evict()` removes, inside the table, shard by shard,
  while lookups and updates go on.

Both are given to `tf_ext.get_dynamic_embedding_variable(..., admission=..., eviction=...)`.
"""

import dataclasses

import tensorflow as tf

# The order of TfExtTableStatistics' output (ops/dynamic_embedding_lifecycle_ops.cc).
STATISTICS = ("size", "bytes", "admitted", "rejected", "evicted", "lookups", "lookup_hits")

_DEFAULT_SKETCH_BYTES = 1 << 20
_COUNTER_BYTES = 4


def _invalid(table_name, message):
  return ValueError(f"dynamic embedding table '{table_name}': {message}")


def _check_positive_int(table_name, owner, name, value):
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise _invalid(table_name, f"{owner} {name} must be a positive int or None, got {value!r}")


@dataclasses.dataclass(frozen=True)
class FrequencyAdmission:
  """Admit an id to the table at its `min_count`-th training update.

  Args:
    min_count: updates an id needs before it gets a row (1 admits every id at once).
    exact: count with exact per-id counters (memory grows with the ids still waiting) instead of
      a count-min sketch.
    sketch_bytes: the sketch's memory, fixed (default 1 MiB): `sketch_depth` rows of 4-byte
      counters. The more distinct ids wait per counter, the more are admitted early: give a
      table that sees millions of distinct ids a sketch of a few counters per distinct id;
      benchmarks/admission.py measures the false-admission rate on a Zipf stream.
    sketch_depth: rows of the sketch, 1 to 16.
  """

  min_count: int
  exact: bool = False
  sketch_bytes: int = _DEFAULT_SKETCH_BYTES
  sketch_depth: int = 4

  def validate(self, table_name):
    _check_positive_int(table_name, "FrequencyAdmission", "min_count", self.min_count)
    if self.min_count is None:
      raise _invalid(table_name, "FrequencyAdmission min_count must be a positive int, got None")
    _check_positive_int(table_name, "FrequencyAdmission", "sketch_depth", self.sketch_depth)
    if self.sketch_depth > 16:
      raise _invalid(
        table_name, f"FrequencyAdmission sketch_depth must be in [1, 16], got {self.sketch_depth}"
      )
    _check_positive_int(table_name, "FrequencyAdmission", "sketch_bytes", self.sketch_bytes)
    smallest = 1024 * _COUNTER_BYTES * self.sketch_depth
    if not self.exact and self.sketch_bytes < smallest:
      raise _invalid(
        table_name,
        f"FrequencyAdmission sketch_bytes must be at least {smallest} "
        f"(1024 counters per row), got {self.sketch_bytes}",
      )

  def op_attrs(self):
    """The TfExtDynamicTable attrs of this policy."""
    return {
      "admission_min_count": self.min_count,
      "admission_exact": self.exact,
      "admission_sketch_width": self.sketch_bytes // (_COUNTER_BYTES * self.sketch_depth),
      "admission_sketch_depth": self.sketch_depth,
    }

  def get_config(self):
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EvictionPolicy:
  """Which rows `table.evict()` removes, together with their optimizer slots.

  A row goes when any criterion holds (None: off). Steps are global steps, as the optimizer
  passes them to the table's updates; "now" is the step given to `evict(step)` or, by default,
  the latest step a training update of the table had.

  Args:
    ttl_steps: the row has not been updated for `ttl_steps` steps (now - last update >= ttl).
    min_frequency: the row has been updated fewer than `min_frequency` times, judged once its
      last update is `frequency_window_steps` old (default: 1000 steps), so a row just created is
      not judged before it had a chance. No extra memory per row.
    min_l2_norm: the row's embedding has an L2 norm below `min_l2_norm`.
    max_size: then, while the table holds more than `max_size` rows, the least recently updated
      rows go (LRU by last update step; rows inserted by `insert` count as updated at the step
      they were inserted).
    frequency_window_steps: see min_frequency.
  """

  ttl_steps: int = None
  min_frequency: int = None
  min_l2_norm: float = None
  max_size: int = None
  frequency_window_steps: int = 1000

  def validate(self, table_name):
    for name in ("ttl_steps", "min_frequency", "max_size", "frequency_window_steps"):
      _check_positive_int(table_name, "EvictionPolicy", name, getattr(self, name))
    if self.min_l2_norm is not None and (
      isinstance(self.min_l2_norm, bool)
      or not isinstance(self.min_l2_norm, (int, float))
      or not self.min_l2_norm > 0
    ):
      raise _invalid(
        table_name,
        f"EvictionPolicy min_l2_norm must be a positive number or None, got {self.min_l2_norm!r}",
      )
    if all(
      getattr(self, n) is None for n in ("ttl_steps", "min_frequency", "min_l2_norm", "max_size")
    ):
      raise _invalid(
        table_name,
        "EvictionPolicy needs at least one of ttl_steps, min_frequency, min_l2_norm, max_size",
      )

  @property
  def needs_training_steps(self):
    """Whether the policy judges rows by their updates (meaningless on a table never trained)."""
    return any(getattr(self, n) is not None for n in ("ttl_steps", "min_frequency", "max_size"))

  def op_attrs(self):
    """The TfExtTableEvict attrs of this policy."""
    return {
      "ttl_steps": self.ttl_steps or 0,
      "min_frequency": self.min_frequency or 0,
      "frequency_window_steps": self.frequency_window_steps if self.min_frequency else 0,
      "min_l2_norm": float(self.min_l2_norm or 0.0),
      "max_size": self.max_size or 0,
    }

  def get_config(self):
    return dataclasses.asdict(self)


def from_config(cls, config):
  """A policy from its get_config() (or None)."""
  if config is None or isinstance(config, cls):
    return config
  return cls(**config)


def check_policies(table_name, trainable, admission, eviction):
  """Validates the policies a table is created with; errors name the table and the parameter."""
  if admission is not None:
    if not isinstance(admission, FrequencyAdmission):
      raise _invalid(
        table_name, f"admission must be a tf_ext.FrequencyAdmission, got {type(admission).__name__}"
      )
    admission.validate(table_name)
    if not trainable:
      raise _invalid(
        table_name,
        "admission applies to training updates, and the table is not trainable (trainable=False)",
      )
  if eviction is not None:
    if not isinstance(eviction, EvictionPolicy):
      raise _invalid(
        table_name, f"eviction must be a tf_ext.EvictionPolicy, got {type(eviction).__name__}"
      )
    eviction.validate(table_name)
    if not trainable and eviction.needs_training_steps:
      raise _invalid(
        table_name,
        "eviction by ttl_steps, min_frequency or max_size judges rows by their training "
        "updates, and the table is not trainable (trainable=False); use min_l2_norm or remove()",
      )


def check_evictable(owner, tables):
  """For hooks and callbacks given tables explicitly: each must have an eviction policy."""
  for table in tables:
    if getattr(table, "eviction", None) is None:
      raise ValueError(f"{owner}: dynamic embedding table '{table.name}' has no eviction policy")
  return tables


def statistics_dict(values):
  """{name: scalar} from TfExtTableStatistics' output, plus lookup_hit_rate (hits / lookups)."""
  stats = {name: values[i] for i, name in enumerate(STATISTICS)}
  lookups = tf.cast(stats["lookups"], tf.float64)
  stats["lookup_hit_rate"] = tf.math.divide_no_nan(
    tf.cast(stats["lookup_hits"], tf.float64), lookups
  )
  return stats

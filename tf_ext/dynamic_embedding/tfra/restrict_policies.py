"""TFRA's restrict policies over what tf_ext tables record of each row.

TFRA keeps a second Variable per policy (a timestamp or a count per key) and updates it at every
optimizer step. A tf_ext table entry already holds the step of the row's last update and its number
of updates, counted by the table's own updates (and kept in its checkpoints), so a policy needs no
state of its own: `apply_update` does nothing, and `Variable.restrict(num_reserved)` keeps the
`num_reserved` rows updated most recently (TimestampRestrictPolicy, by step rather than wall-clock
time) or most often (FrequencyRestrictPolicy), across all the Variable's tables.
"""

import tensorflow as tf

# The outputs of a table's export_with_slots (tf_ext/dynamic_embedding/variable.py).
_UPDATE_COUNTS, _LAST_STEPS = 3, 4


class RestrictPolicy:
  """Base of the restrict policies: `Variable(..., restrict_policy=<subclass>)`."""

  # Which export_with_slots output ranks rows, higher kept first.
  _score_output = None

  def __init__(self, var):
    self.var = var

  def apply_update(self, ids):
    """Nothing to do: the table records each update itself."""
    del ids
    return tf.no_op()

  def apply_restriction(self, num_reserved, **kwargs):
    """Removes all but the `num_reserved` best-ranked rows when the Variable holds more than
    `trigger` (default num_reserved) rows. Returns the op (eagerly: after running it)."""
    if self._score_output is None:
      raise NotImplementedError("apply_restriction needs a RestrictPolicy subclass")
    trigger = kwargs.pop("trigger", None)
    if kwargs:
      raise TypeError(f"apply_restriction got unexpected arguments {sorted(kwargs)}")
    num_reserved = int(num_reserved)
    if num_reserved < 0:
      raise ValueError(f"num_reserved must be >= 0, got {num_reserved}")
    trigger = num_reserved if trigger is None else int(trigger)
    exports = [table.export_with_slots() for table in self.var.tables]
    keys = tf.concat([e[0] for e in exports], 0)
    scores = tf.concat([e[self._score_output] for e in exports], 0)
    size = tf.size(keys)

    def restrict():
      excess = tf.maximum(size - num_reserved, 0)
      _, worst = tf.math.top_k(-scores, k=excess, sorted=False)
      removed = tf.gather(keys, worst)
      removals = [table.remove(removed) for table in self.var.tables]
      with tf.control_dependencies(removals):
        return tf.constant(True)

    return tf.cond(size > trigger, restrict, lambda: tf.constant(False))

  @property
  def status(self):
    """What TFRA's policy Variable tells: for every key of the Variable, its score (the step of
    its last update, or its number of updates), read from the table entries."""
    return PolicyStatus(self.var, self._score_output)


class PolicyStatus:
  """The scores a restrict policy ranks the Variable's keys by, as TFRA's status Variable."""

  def __init__(self, var, score_output):
    self._var, self._score_output = var, score_output

  def size(self, name=None):
    """The number of keys with a score: the Variable's size (int64 scalar)."""
    return self._var.size(name=name)

  def export(self, name=None):
    """(keys, scores (int64)) of every key."""
    del name
    exports = [table.export_with_slots() for table in self._var.tables]
    return (
      tf.concat([e[0] for e in exports], 0),
      tf.concat([e[self._score_output] for e in exports], 0),
    )


class TimestampRestrictPolicy(RestrictPolicy):
  """Keeps the rows updated most recently (by training step)."""

  _score_output = _LAST_STEPS


class FrequencyRestrictPolicy(RestrictPolicy):
  """Keeps the rows updated most often."""

  _score_output = _UPDATE_COUNTS

"""TFRA's restrict policies: a status Variable per policy, ranking the keys a restriction keeps.

As in TFRA, a policy keeps a status `de.Variable` of its own, with the target's keys, devices and
partitioner and one value per key: TimestampRestrictPolicy the wall-clock time of the key's last
update (int64 microseconds since the epoch, where TFRA keeps int32 seconds: keys updated within
the same second still rank by time), FrequencyRestrictPolicy its number of updates (int32; a key
counts once per update, however often the batch repeats it). `apply_update(ids)` records ids, and
`de.DynamicEmbeddingOptimizer` calls it at every step for the keys it trains of a Variable made
with `restrict_policy=`. `Variable.restrict(num_reserved)` (apply_restriction) keeps the
`num_reserved` keys the status ranks first and removes the others from the Variable and from the
status; their optimizer slots go with their rows (slots live in each row's table entry). Keys
without status (rows written by upsert, or restored from a checkpoint without the status) are
kept, as in TFRA.

The status is checkpointed with its Variable: `tf.compat.v1.train.Saver()` saves its tables, and
`tf.train.Checkpoint` (Keras `save_weights` too) reaches it as the Variable's `restrict_status`.
"""

import tensorflow as tf
from tensorflow.python.framework import ops

from tf_ext.dynamic_embedding.tfra import variable as variable_lib


class RestrictPolicy:
  """Base of the restrict policies: `Variable(..., restrict_policy=<subclass>)`."""

  # The status Variable's value dtype and name (`status/<variable>/<suffix>`), set by subclasses.
  _status_dtype = None
  _status_suffix = None

  def __init__(self, var):
    self.var = var
    self.params_in_slots = []  # TFRA's slot Variables; tf_ext keeps slots in the rows' entries
    self._status = None
    if self._status_dtype is not None:
      self._status = _status_variable(var, self._status_dtype, self._status_suffix)
    self._restrict_var = self._status

  def apply_update(self, ids):
    """Records that `ids` (any shape, the Variable's key dtype) were updated now. Returns the op
    (eagerly: after running it)."""
    raise NotImplementedError("apply_update needs a RestrictPolicy subclass")

  def apply_restriction(self, num_reserved, **kwargs):
    """Removes all but the `num_reserved` best-ranked keys (and their status) when the Variable
    holds more than `trigger` (default num_reserved) rows. Returns the op (eagerly: after
    running it)."""
    if self._status is None:
      raise NotImplementedError("apply_restriction needs a RestrictPolicy subclass")
    if isinstance(num_reserved, bool) or not isinstance(num_reserved, int):
      raise TypeError("num_reserved should be integer.")
    if num_reserved < 0:
      raise ValueError("num_reserved should be non-negative.")
    trigger = kwargs.pop("trigger", num_reserved)
    if kwargs:
      raise TypeError(f"apply_restriction got unexpected arguments {sorted(kwargs)}")
    if isinstance(trigger, bool) or not isinstance(trigger, int):
      raise TypeError("trigger should be integer.")

    def restrict():
      keys, scores = self._status.export()
      scores = tf.reshape(scores, [-1])
      excess = tf.maximum(tf.size(keys) - num_reserved, 0)
      _, worst = tf.math.top_k(-scores, k=excess, sorted=False)
      removed = tf.gather(keys, worst)
      with tf.control_dependencies([self.var.remove(removed), self._status.remove(removed)]):
        return tf.constant(True)

    return tf.cond(self.var.size() > trigger, restrict, lambda: tf.constant(False))

  @property
  def status(self):
    """The status Variable: a value per key (see the subclass)."""
    return self._status


def _status_variable(var, value_dtype, suffix):
  name = f"status/{var.name}/{suffix}"
  if not tf.executing_eagerly():  # one status per policy, as TFRA's name scope makes them
    name = ops.get_default_graph().unique_name(name, mark_as_used=True)
  return variable_lib.Variable(
    key_dtype=var.key_dtype,
    value_dtype=value_dtype,
    dim=1,
    devices=var.devices,
    partitioner=var.partition_fn,
    name=name,
    trainable=False,
    checkpoint=var.checkpoint,
    init_size=var.init_size,
    kv_creator=var.kv_creator,
  )


def _distinct_keys(ids):
  return tf.unique(tf.reshape(ids, [-1]))[0]


class TimestampRestrictPolicy(RestrictPolicy):
  """Keeps the keys updated most recently (wall-clock time)."""

  _status_dtype = tf.int64
  _status_suffix = "timestamp"

  @property
  def tstp_var(self):
    """TFRA's name of the status Variable."""
    return self._status

  def apply_update(self, ids):
    keys = _distinct_keys(tf.convert_to_tensor(ids, self.var.key_dtype))
    now = tf.cast(tf.timestamp() * 1e6, tf.int64)
    return self._status.upsert(keys, tf.fill([tf.size(keys), 1], now))


class FrequencyRestrictPolicy(RestrictPolicy):
  """Keeps the keys updated most often."""

  _status_dtype = tf.int32
  _status_suffix = "frequency"

  @property
  def freq_var(self):
    """TFRA's name of the status Variable."""
    return self._status

  def apply_update(self, ids):
    keys = _distinct_keys(tf.convert_to_tensor(ids, self.var.key_dtype))
    counts = self._status.lookup(keys)  # missing keys read 0
    return self._status.upsert(keys, counts + 1)

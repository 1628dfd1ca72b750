"""TrainableWrapper: the variable that a lookup of a Variable trains through."""

import weakref

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops

from tf_ext import rank_local_gradients
from tf_ext.dynamic_embedding import variable as table_lib
from tf_ext.dynamic_embedding.tfra.model_mode import ModelMode


class TrainableWrapper(resource_variable_ops.ResourceVariable):
  """What `de.embedding_lookup(..., return_trainable=True)` returns for the optimizer's var_list:
  a scalar variable whose gradient is the lookup's, keyed by the looked-up ids, and which names the
  Variable's table to `de.DynamicEmbeddingOptimizer`."""

  @classmethod
  def _variable_call(cls, *args, **kwargs):
    """Constructs like any class (tf.Variable's metaclass would bind positional arguments to
    tf.Variable's own parameters first)."""
    del args, kwargs

  def __init__(
    self,
    params,
    ids=None,
    max_norm=None,
    trainable=True,
    name="TrainableWrapper",
    model_mode=None,
    **kwargs,
  ):
    del kwargs  # TFRA's initial_value, dtype, collections: the wrapper holds no rows here
    self.params = params
    self._ids = ids
    self.max_norm = max_norm
    self.model_mode = model_mode or ModelMode.CURRENT_SETTING
    # Out of Saver's default list (a TFRA checkpoint has no wrappers, nor need ours): local.
    collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
    if trainable:
      collections.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    with tf.init_scope():
      super().__init__(
        initial_value=0.0, trainable=trainable, dtype=tf.float32, name=name, collections=collections
      )
    setattr(self, table_lib.TABLE_OF_ANCHOR, weakref.ref(params._gradient_target))  # noqa: SLF001
    # Horovod's reductions leave a wrapper's gradient on its rank, as TFRA registers its wrappers
    # as local variables of Horovod's optimizers.
    rank_local_gradients.mark(self)

  def read_for_lookup(self):
    """The wrapper's value (always 0), read so that the lookup's gradient reaches it. In a graph
    the read assigns it first, as TFRA's wrapper does, so a session need not initialize it."""
    if tf.executing_eagerly() or ops.inside_function():
      return resource_variable_ops.ResourceVariable.value(self)
    assign = gen_resource_variable_ops.assign_variable_op(self.handle, tf.constant(0.0))
    with tf.control_dependencies([assign]):
      # The variable's own read: a gradient tape (Keras' minimize in a graph) sees the access.
      return self._read_variable_op()  # noqa: SLF001

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    """Used as a tensor, a lookup's wrapper is its rows, as TFRA's wrapper holds them ([ids,
    dim]; the gradient reaches this wrapper). A ShadowVariable is the scalar it holds."""
    if self._ids is None or as_ref:
      return super()._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)
    return self.lookup(tf.reshape(self._ids, [-1]))

  @property
  def ids(self):
    """The ids of the wrapper's lookup; for a ShadowVariable, those of its last eager lookup (an
    empty tensor of the key dtype before one), as TFRA's ShadowVariable holds them."""
    if self._ids is not None:
      return self._ids
    last = getattr(self, "_last_ids", None)
    if last is None:
      return tf.zeros([0], self.params.key_dtype)
    return tf.reshape(tf.convert_to_tensor(last, self.params.key_dtype), [-1])

  def value(self):
    """As a tensor: a lookup's wrapper is its rows (so `wrapper * wrapper` multiplies rows, as
    with TFRA's wrapper), a ShadowVariable its scalar."""
    if self._ids is None:
      return super().value()
    return self._dense_var_to_tensor()

  def read_value(self, do_prefetch=True):
    """The rows of the wrapper's ids (TFRA's wrapper holds them): for a ShadowVariable, of its
    last eager lookup, none ([0, dim] of the value dtype) before one or after a checkpoint saved
    it, as TFRA's ShadowVariable holds them."""
    del do_prefetch
    ids = self._ids if self._ids is not None else getattr(self, "_last_ids", None)
    if ids is None:
      return tf.zeros([0, self.params.dim], self.params.value_dtype)
    return self.lookup(tf.reshape(ids, [-1]))

  def size(self):
    """The number of keys of the wrapper's Variable (int64 scalar)."""
    return self.params.size()

  def update_op(self, v0=None):
    """Writes the rows this wrapper's lookup read (`v0`, or read now, max_norm applied) into the
    table, as TFRA's does: its keys get rows. Training needs no such call: tf_ext's optimizer
    updates the table itself."""
    if self._ids is None:
      return tf.no_op()
    return self.params.upsert(self._ids, self.lookup(self._ids) if v0 is None else v0)

  def prefetch_values(self, update=False):
    """TFRA's read of the wrapper's rows from its table: the rows of the wrapper's ids."""
    del update
    return self.lookup(self._ids)

  def embedding_lookup(self, ids, name=None, max_norm=None):
    """(rows of `ids`, this wrapper): TFRA's lookup through an existing wrapper."""
    del name, max_norm
    return self.lookup(ids), self

  def lookup(self, ids):
    """The rows of `ids` through this wrapper (its max_norm applied). Eagerly, a
    ShadowVariable remembers the ids, as TFRA's does (its read_value gives their rows)."""
    if self._ids is None and tf.executing_eagerly():
      self._last_ids = ids
    rows = self.params.read_rows(ids, anchor=self)
    if self.max_norm is not None:
      rows = tf.clip_by_norm(rows, self.max_norm, axes=[-1])
    return rows

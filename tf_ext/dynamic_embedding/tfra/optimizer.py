"""TFRA's `de.DynamicEmbeddingOptimizer`: tf_ext's wrapper, which trains the rows of the Variables
looked up through TrainableWrappers and ShadowVariables, their slots inside the table entry."""

import tensorflow as tf

from tf_ext import optimizer_pipeline
from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import optimizer as optimizer_lib
from tf_ext.dynamic_embedding.tfra import dtypes


def DynamicEmbeddingOptimizer(self, bp_v2=False, synchronous=False, **kwargs):  # noqa: N802
  """`self` (a tf.compat.v1.train or Keras optimizer), able to train dynamic embeddings; the
  optimizer itself is returned, as TFRA returns it.

  bp_v2: tf_ext always applies an update as a change inside the table, never by writing back a
    row read earlier, so TFRA's bp_v2=True semantics hold either way.
  synchronous: as TFRA, `apply_gradients` first sums the dense gradients over the Horovod ranks
    (hvd.init() first; horovod.tensorflow or tf_ext.lightcc), and the tables' gradients stay on
    their rank.
  """
  del bp_v2
  if kwargs:
    raise TypeError(f"DynamicEmbeddingOptimizer got unexpected arguments {sorted(kwargs)}")
  trains_tables = optimizer_lib.DynamicEmbeddingOptimizer(self)
  _record_restrict_status(trains_tables)
  if synchronous:
    _sum_dense_gradients_over_ranks(trains_tables)
  return trains_tables


def _sum_dense_gradients_over_ranks(optimizer):
  hvd = alltoall.horovod_of(
    None, "tf_ext.tfra: DynamicEmbeddingOptimizer(synchronous=True) sums gradients over ranks"
  )
  own = optimizer.apply_gradients

  def apply_gradients(grads_and_vars, *args, **kwargs):
    summed = [
      (g, v)
      if g is None or optimizer_lib.table_of(v) is not None
      else (hvd.allreduce(g, op=hvd.Sum), v)
      for g, v in grads_and_vars
    ]
    return own(summed, *args, **kwargs)

  # On the object, as TFRA replaces it: minimize, Keras fit and custom loops all call it.
  optimizer.apply_gradients = apply_gradients


def create_slots(variable, init, slot_name, op_name, bp_v2=None):
  """TFRA's helper for the slot Variables of the optimizers it patches: not offered."""
  del variable, init, slot_name, op_name, bp_v2
  raise NotImplementedError(
    "tf_ext.tfra: create_slots is not offered: tf_ext keeps an optimizer's slots in each row's "
    "table entry, created by the table update itself; wrap a supported optimizer with "
    "de.DynamicEmbeddingOptimizer (tf_ext.DynamicEmbeddingOptimizer lists them)"
  )


def _record_restrict_status(optimizer):
  """Every step also records the keys it trains of a Variable with a restrict policy in the
  policy's status (`policy.apply_update(ids)`), as TFRA's optimizer does, and first writes the
  default rows of a Variable whose initial rows the table does not compute (a row of different
  values) for its keys without a row, so that their update starts from it as in TFRA."""
  stage = optimizer_pipeline.find_stage(optimizer, optimizer_lib.TablesStage.kind)
  if stage is None or getattr(stage, "_tfra_records_status", False):
    return
  own = stage.apply

  def apply(target, grads_and_vars, step):
    grads_and_vars = list(grads_and_vars)
    updates, first_rows = [], []
    for gradient, variable in grads_and_vars:
      split_table_writer = getattr(optimizer_lib.table_of(variable), "write_default_rows", None)
      if split_table_writer is not None:  # a table split across ranks, of TFRA's initial rows
        first_rows.append(split_table_writer())
      params = getattr(variable, "params", None)
      if params is None or not isinstance(gradient, tf.IndexedSlices):
        continue
      keys = dtypes.to_stored(gradient.indices, params.key_dtype)
      if getattr(params, "write_default_rows", None) is not None:
        first_rows.append(params.write_default_rows(keys, anchor=variable))
      if getattr(params, "restrict_policy", None) is not None:
        with tf.name_scope("restrict_status"):
          updates.append(params.restrict_policy.apply_update(keys))
    first_rows = [op for op in first_rows if op is not None]
    with tf.control_dependencies(first_rows):
      update_ops, dense = own(target, grads_and_vars, step)
    return list(update_ops) + [u for u in updates if u is not None], dense

  stage.apply = apply
  stage._tfra_records_status = True  # noqa: SLF001

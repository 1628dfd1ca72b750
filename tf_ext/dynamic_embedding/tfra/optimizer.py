"""TFRA's `de.DynamicEmbeddingOptimizer`: tf_ext's wrapper, which trains the rows of the Variables
looked up through TrainableWrappers and ShadowVariables, their slots inside the table entry."""

from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import optimizer as optimizer_lib


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

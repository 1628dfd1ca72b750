"""TFRA's `de.DynamicEmbeddingOptimizer`: tf_ext's wrapper, which trains the rows of the Variables
looked up through TrainableWrappers and ShadowVariables, their slots inside the table entry."""

from tf_ext.dynamic_embedding import optimizer as optimizer_lib


def DynamicEmbeddingOptimizer(self, bp_v2=False, synchronous=False, **kwargs):  # noqa: N802
  """`self` (a tf.compat.v1.train or Keras optimizer), able to train dynamic embeddings.

  bp_v2: tf_ext always applies an update as a change inside the table, never by writing back a
    row read earlier, so TFRA's bp_v2=True semantics hold either way.
  synchronous: TFRA then all-reduces dense gradients with Horovod; here wrap the result in
    `hvd.DistributedOptimizer` (horovod.tensorflow or tf_ext.lightcc) instead, which does that.
  """
  del bp_v2
  if kwargs:
    raise TypeError(f"DynamicEmbeddingOptimizer got unexpected arguments {sorted(kwargs)}")
  if synchronous:
    raise NotImplementedError(
      "tf_ext.tfra: DynamicEmbeddingOptimizer(synchronous=True) is not offered; use "
      "hvd.DistributedOptimizer(de.DynamicEmbeddingOptimizer(optimizer)) with "
      "`import tf_ext.lightcc as hvd` (or horovod.tensorflow): dense gradients are all-reduced "
      "and the tables' gradients stay on their rank"
    )
  return optimizer_lib.DynamicEmbeddingOptimizer(self)

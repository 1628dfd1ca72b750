"""Elastic Keras training with LightCC: `hvd.elastic` of `import tf_ext.lightcc.keras as hvd`.

horovod.tensorflow.keras.elastic with LightCC's two names: run (tf_ext.lightcc.elastic.run: the
reset re-runs LightCC's init, and a failed alltoall or allgather of 2D or TOPK counts as a failed
collective) and KerasState (Horovod's, whose commit, restore and sync also carry LightCC's TOPK
residuals and fusion policies, as tf_ext.lightcc.elastic.TensorFlowKerasState). Horovod's
callbacks (CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback) commit and
update a KerasState unchanged; every other name resolves to Horovod's object.
"""

import horovod.tensorflow.keras.elastic as _horovod_keras_elastic
import tensorflow as tf
from horovod.tensorflow.keras.elastic import (  # noqa: F401
  CommitStateCallback,
  UpdateBatchStateCallback,
  UpdateEpochStateCallback,
)

from tf_ext.lightcc import _reexport
from tf_ext.lightcc.elastic import TensorFlowKerasState, run

__all__ = [
  "KerasState",
  "run",
  "CommitStateCallback",
  "UpdateBatchStateCallback",
  "UpdateEpochStateCallback",
]


class KerasState(TensorFlowKerasState):
  """horovod.tensorflow.keras.elastic.KerasState plus LightCC's TOPK residuals and fusion
  policies: a tf.keras model and its optimizer, and any keyword as an attribute (batch, epoch)."""

  def __init__(self, model, optimizer=None, **kwargs):
    super().__init__(model, optimizer=optimizer, backend=tf.keras.backend, **kwargs)


__getattr__, __dir__ = _reexport.fallback(__name__, globals(), _horovod_keras_elastic)

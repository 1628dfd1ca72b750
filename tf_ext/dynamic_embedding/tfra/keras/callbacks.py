"""TFRA's Keras callbacks.

- `ModelCheckpoint` (TFRA's DEHvdModelCheckpoint) saves the tables with the model: with tf_ext
  tables every rank writes its own part, so Keras' ModelCheckpoint itself is right on one process
  and on Horovod ranks alike.
- `DEHvdBroadcastGlobalVariablesCallback` broadcasts the model's and optimizer's variables from
  `root_rank` after the first batch, as Horovod's callback does, but not the tables' wrappers
  (their rows stay in the tables, and a table split across ranks holds different rows per rank).
"""

import tensorflow as tf

from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import optimizer as optimizer_lib

__all__ = ["DEHvdBroadcastGlobalVariablesCallback", "DEHvdModelCheckpoint", "ModelCheckpoint"]


class DEHvdModelCheckpoint(tf.keras.callbacks.ModelCheckpoint):
  """Keras' ModelCheckpoint; the tables' rows are saved with the model's variables."""


ModelCheckpoint = DEHvdModelCheckpoint


class DEHvdBroadcastGlobalVariablesCallback(tf.keras.callbacks.Callback):
  """After the first batch, every rank takes `root_rank`'s dense variables (Horovod, after
  hvd.init()). `local_variables`: variables left out, as Horovod's callback takes them."""

  def __init__(self, root_rank=0, device="", local_variables=None):
    super().__init__()
    self.root_rank = root_rank
    self.device = device
    self.broadcast_done = False
    if local_variables is None:
      local_variables = []
    elif isinstance(local_variables, tf.Variable):
      local_variables = [local_variables]
    if not all(isinstance(v, tf.Variable) for v in local_variables):
      raise ValueError("All local variables must be of tf.Variable type.")
    self._local = {v.ref() for v in local_variables}

  def _broadcast(self, variables):
    # A wrapper or a table's own anchor names its table: left out.
    kept = [
      v for v in variables if v.ref() not in self._local and optimizer_lib.table_of(v) is None
    ]
    if kept:
      hvd = alltoall.horovod_of(None, "DEHvdBroadcastGlobalVariablesCallback broadcasts over ranks")
      hvd.broadcast_variables(kept, root_rank=self.root_rank)

  def on_batch_end(self, batch, logs=None):
    if self.broadcast_done:
      return
    with tf.device(self.device):
      self._broadcast(self.model.variables)
      self._broadcast(self.model.optimizer.variables())
    self.broadcast_done = True

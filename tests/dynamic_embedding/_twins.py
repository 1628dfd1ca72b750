"""Twin TF1 graphs: a dynamic embedding table and a dense tf.Variable + tf.gather model that start
from the same rows and train side by side on the same fed ids and labels."""

import collections

import numpy as np
import tensorflow as tf

import tf_ext


class GraphTwins(
  collections.namedtuple(
    "GraphTwins", "ids labels table dense w_table w_dense step train insert lookup_all"
  )
):
  __slots__ = ()

  def fit(self, sess, batches):
    """Inserts the initial rows, then runs one step of both sides per (ids, labels) batch."""
    sess.run(self.insert)
    for ids, labels in batches:
      sess.run(self.train, {self.ids: ids, self.labels: labels})


def graph_twins(table_name, init, loss, make_optimizer):
  """Builds the twins in the default graph; `init` is the (vocab, dim) initial rows.

  Each side computes `loss(rows, w, labels)` with its own dense `w` (ones, dim x 1) and trains it
  with an optimizer from `make_optimizer`, the table's wrapped in tf_ext.DynamicEmbeddingOptimizer.
  TF1 optimizers `minimize` the losses, the table's counting the global step (`step`); Keras ones
  (whose `minimize` needs a tape for a tensor loss) apply `tf.gradients`, and `step` is None.
  `fit` inserts the initial rows (`insert`), then runs `train` (both sides' train ops) on fed
  `ids` (int64, [None]) and `labels` (float32, [None, 1]). `lookup_all` reads every table row.
  """
  vocab, dim = init.shape
  ids = tf.compat.v1.placeholder(tf.int64, [None])
  labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
  table = tf_ext.get_dynamic_embedding_variable(table_name, dim, initializer="zeros")
  dense = tf.compat.v1.get_variable("dense", initializer=init, use_resource=True)
  w_t = tf.compat.v1.get_variable("w_t", initializer=tf.ones([dim, 1]), use_resource=True)
  w_d = tf.compat.v1.get_variable("w_d", initializer=tf.ones([dim, 1]), use_resource=True)
  vars_t, vars_d = [table.gradient_anchor, w_t], [dense, w_d]
  loss_t = loss(table.lookup(ids), w_t, labels)
  loss_d = loss(tf.gather(dense, ids), w_d, labels)
  opt_t, opt_d = tf_ext.DynamicEmbeddingOptimizer(make_optimizer()), make_optimizer()
  if isinstance(opt_d, tf.compat.v1.train.Optimizer):
    step = tf.compat.v1.train.get_or_create_global_step()
    train_t = opt_t.minimize(loss_t, var_list=vars_t, global_step=step)
    train_d = opt_d.minimize(loss_d, var_list=vars_d)
  else:
    step = None
    train_t = opt_t.apply_gradients(zip(tf.gradients(loss_t, vars_t), vars_t))
    train_d = opt_d.apply_gradients(zip(tf.gradients(loss_d, vars_d), vars_d))
  insert = table.insert(np.arange(vocab), init)
  lookup_all = table.lookup(np.arange(vocab))
  return GraphTwins(
    ids, labels, table, dense, w_t, w_d, step, [train_t, train_d], insert, lookup_all
  )

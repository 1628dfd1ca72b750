"""Rank program: TF1 graph mode with LightCC on (2D + TOPK + fusion): MonitoredTrainingSession
and Estimator, both with BroadcastGlobalVariablesHook. Each rank saves its final weights and
losses to out_dir/<mode>_<rank>.npz; the test compares ranks.

main(out_dir) (run as a script: $OUT_DIR). It disables eager execution: in a shared run, the last
case of its process.
"""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402


def main(out_dir):
  tf.compat.v1.disable_eager_execution()
  hvd.init(
    light_2d_allreduce=1,
    light_intra_size=2,
    light_topk_allreduce=1,
    light_topk_ratio=0.2,
    light_topk_threshold=256,
    light_fusion=1,
    light_fusion_probe_steps=2,
  )
  rank = hvd.rank()
  rng = np.random.default_rng(rank)
  true_w = np.arange(64, dtype=np.float32).reshape(64, 1) / 64.0
  x_all = rng.normal(size=(512, 64)).astype(np.float32)
  y_all = x_all @ true_w

  def model(x, y):
    w = tf.compat.v1.get_variable(
      "w", [64, 1], initializer=tf.compat.v1.random_normal_initializer(seed=rank)
    )
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    return w, b, tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))

  # 1. MonitoredTrainingSession
  with tf.Graph().as_default():
    x = tf.constant(x_all)
    w, b, loss = model(x, tf.constant(y_all))
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.05))
    train = optimizer.minimize(loss, global_step=step)
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession(
      hooks=[hvd.BroadcastGlobalVariablesHook(0)]
    ) as sess:
      for _ in range(60):
        losses.append(sess.run([train, loss])[1])
      np.savez(
        os.path.join(out_dir, f"session_{rank}.npz"), w=sess.run(w), b=sess.run(b), losses=losses
      )

  # 2. Estimator
  def model_fn(features, labels, mode):
    w, b, loss = model(features, labels)
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

  estimator = tf.estimator.Estimator(model_fn, model_dir=os.path.join(out_dir, f"estimator_{rank}"))
  estimator.train(
    lambda: tf.data.Dataset.from_tensors((x_all, y_all)).repeat(),
    steps=40,
    hooks=[hvd.BroadcastGlobalVariablesHook(0)],
  )
  np.savez(
    os.path.join(out_dir, f"estimator_{rank}.npz"),
    w=estimator.get_variable_value("w"),
    b=estimator.get_variable_value("b"),
  )
  print(f"rank {rank}: done, loss {losses[0]:.3f} -> {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
  main(os.environ["OUT_DIR"])

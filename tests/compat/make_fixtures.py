"""Writes the checkpoints that test_restore_0_1.py restores, with the tf_ext of the checkout it
runs in. They were written by tf_ext 0.1 (commit 9e73948), before the optimizer pipeline:

  cd <a checkout of 9e73948> && make build && \
    PYTHONPATH=. .venv/bin/python <this file> <out dir>

Each model trains a few deterministic steps; next to each checkpoint, expected.npz holds the values
it must restore to (table rows and slots sorted by key, dense weights, optimizer variables).
"""

import os
import sys

import numpy as np
import tensorflow as tf

import tf_ext

IDS = np.array([[1, 5], [2, 5], [10**15, 3]], np.int64)
LABELS = np.array([[1.0], [0.0], [1.0]], np.float32)


def table_arrays(table, prefix):
  keys, values, slots, counts, steps, _ = (x.numpy() for x in table.export_with_slots())
  order = np.argsort(keys)
  return {
    f"{prefix}keys": keys[order],
    f"{prefix}values": values[order],
    f"{prefix}slots": slots[order],
    f"{prefix}update_counts": counts[order],
    f"{prefix}last_steps": steps[order],
  }


def keras_model():
  ids = tf.keras.Input(shape=(2,), dtype=tf.int64)
  emb = tf_ext.keras.layers.DynamicEmbedding(4, combiner="mean", name="emb")(ids)
  out = tf.keras.layers.Dense(1, kernel_initializer="ones", name="dense")(emb)
  model = tf.keras.Model(ids, out)
  model.compile(tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1)), "mse")
  return model


def keras_fixtures(out):
  model = keras_model()
  model.fit(IDS, LABELS, batch_size=3, epochs=3, verbose=0, shuffle=False)
  model.save(os.path.join(out, "keras_model.keras"))
  ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
  ckpt.write(os.path.join(out, "tf2_checkpoint", "ckpt"))
  expected = table_arrays(model.get_layer("emb").table, "")
  expected["dense_kernel"] = model.get_layer("dense").kernel.numpy()
  expected["iterations"] = model.optimizer.iterations.numpy()
  expected["predictions"] = model.predict(IDS, verbose=0)
  np.savez(os.path.join(out, "keras_expected.npz"), **expected)


def tf1_graph(wrap):
  """A TF1 model trained with wrap(AdamOptimizer); returns (train op, table, global step)."""
  emb = tf_ext.dynamic_embedding(tf.constant(IDS), 4, name="tf1_emb", combiner="sum")
  w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
  loss = tf.reduce_mean(tf.square(tf.matmul(emb, w) - LABELS))
  step = tf.compat.v1.train.get_or_create_global_step()
  train = wrap(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss, global_step=step)
  return train, tf_ext.get_dynamic_embedding_variable("tf1_emb", 4), step


def lightcc_wrap(optimizer):
  """LightCC with TOPK on (one rank): DistributedOptimizer(DynamicEmbeddingOptimizer(opt)); the
  graph then also holds LightCC's residual and traffic variables."""
  import tf_ext.lightcc as hvd

  if not hvd.is_initialized():
    hvd.init(light_topk_allreduce=1, light_topk_threshold=0, light_topk_ratio=0.5)
  return hvd.DistributedOptimizer(tf_ext.DynamicEmbeddingOptimizer(optimizer))


def tf1_fixtures(out, name, wrap):
  with tf.Graph().as_default():
    train, table, _ = tf1_graph(wrap)
    saver = tf.compat.v1.train.Saver()
    export = table.export_with_slots()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for _ in range(3):
        sess.run(train)
      saver.save(sess, os.path.join(out, f"{name}_checkpoint", "model.ckpt"))
      keys, values, slots, counts, steps, _ = sess.run(export)
      order = np.argsort(keys)
      names = [v.op.name for v in tf.compat.v1.global_variables()]
      np.savez(
        os.path.join(out, f"{name}_expected.npz"),
        keys=keys[order],
        values=values[order],
        slots=slots[order],
        update_counts=counts[order],
        last_steps=steps[order],
        variable_names=np.array(names),
        **{
          n.replace("/", "__"): sess.run(v) for n, v in zip(names, tf.compat.v1.global_variables())
        },
      )


if __name__ == "__main__":
  os.makedirs(sys.argv[1], exist_ok=True)
  keras_fixtures(sys.argv[1])
  tf1_fixtures(sys.argv[1], "tf1", tf_ext.DynamicEmbeddingOptimizer)
  tf1_fixtures(sys.argv[1], "lightcc_tf1", lightcc_wrap)
  print("fixtures written to", sys.argv[1])

"""Rank program: Keras fit on scikit-learn's digits with LightCC; prints test accuracy.

main(topk, table, epochs, fusion, retrace, log_dir, reload_dir) (run as a script: $TOPK, $TABLE,
$EPOCHS, $FUSION, $RETRACE, $LOG_DIR, $RELOAD_DIR):
topk=1 trains with TOPK 1 % + fp16 (threshold 0, so every gradient is compressed); topk=0 dense.
table=1 also trains a tf_ext dynamic embedding table (Adam, through DynamicEmbeddingOptimizer)
next to the dense layers. reload_dir=<dir>: after training, each rank saves the model there,
loads it back with tf_ext.lightcc.keras.load_model and trains it one more epoch, counting only
that epoch's traffic. fusion=1 exchanges in adaptive buckets, frozen and retraced once chosen
(FusionSettledCallback); with retrace=1 (LIGHT_FUSION_RETRACE) the callback also gives each
batch the train function of the bucket size in force. Every run checks that all ranks end with
identical weights and rows.
"""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import tf_ext  # noqa: E402
import tf_ext.lightcc.keras as hvd  # noqa: E402


def main(topk, table=0, epochs=40, fusion=0, retrace=0, log_dir=None, reload_dir=None):
  topk, with_table, epochs, fusion, retrace = (
    int(v) for v in (topk, table, epochs, fusion, retrace)
  )
  hvd.init(
    light_topk_allreduce=topk,
    light_topk_ratio=0.01,
    light_topk_fp16=topk,
    light_topk_threshold=0,
    light_fusion=fusion,
    light_fusion_buckets_mb=[0.01, 1],
    light_fusion_probe_steps=2,
    light_fusion_reprobe_steps=0,
    light_fusion_retrace=retrace,
  )
  tf.keras.utils.set_random_seed(1)
  digits = load_digits()
  x = (digits.data / 16.0).astype(np.float32)
  x_train, x_test, y_train, y_test = train_test_split(
    x, digits.target, test_size=0.25, random_state=0
  )
  shard = slice(hvd.rank(), None, hvd.size())  # each rank trains on its own quarter

  pixels = tf.keras.Input(shape=(64,))
  features = pixels
  if with_table:
    # A dynamic table keyed by the quantized value of a pixel: exercises sparse gradients.
    pixel_id = tf.keras.layers.Lambda(lambda p: tf.cast(tf.round(p[:, 20] * 16), tf.int64))(pixels)
    table_emb = tf_ext.keras.layers.DynamicEmbedding(4, initializer="zeros", name="pixel_emb")(
      pixel_id
    )
    features = tf.concat([pixels, table_emb], -1)
  hidden = tf.keras.layers.Dense(128, activation="relu")(features)
  model = tf.keras.Model(pixels, tf.keras.layers.Dense(10, activation="softmax")(hidden))
  if with_table:
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.003))
  else:  # momentum SGD, the optimizer top-k compression with error feedback is known to suit
    optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9)
  model.compile(
    hvd.DistributedOptimizer(optimizer), "sparse_categorical_crossentropy", metrics=["accuracy"]
  )
  callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
  if log_dir:
    callbacks.append(hvd.callbacks.LightCCTrafficCallback(log_dir, every_n_batches=5))
  if fusion:
    settled = hvd.callbacks.FusionSettledCallback()
    callbacks.append(settled)
  model.fit(
    x_train[shard], y_train[shard], batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks
  )
  if fusion:
    # Retraced in the first epoch; the retraced train function has no step clock, so the policy
    # saw no step after it.
    steps_seen = len(tf_ext.lightcc.fusion_policies()[0].history)
    print(
      f"FUSION rank={hvd.rank()} retraced_after={settled.retraced_after_batch} "
      f"steps_seen={steps_seen} traced={settled.traced}",
      flush=True,
    )
  if reload_dir:
    path = os.path.join(reload_dir, f"rank{hvd.rank()}.keras")
    model.save(path)
    model = hvd.load_model(path)
    hvd.reset_traffic()
    model.fit(x_train[shard], y_train[shard], batch_size=32, epochs=1, verbose=0)
  accuracy = model.evaluate(x_test, y_test, verbose=0)[1]

  # Replicas must be identical: dense weights and, with a table, its rows.
  arrays = [w.ravel() for w in model.get_weights()]
  table_size = 0
  if with_table:
    table = model.get_layer("pixel_emb").table
    keys, values = (t.numpy() for t in table.export())
    order = np.argsort(keys)
    arrays += [keys[order].astype(np.float32), values[order].ravel()]
    table_size = int(table.size())
  fingerprint = np.concatenate(arrays)
  fingerprints = hvd.allgather(tf.constant(fingerprint[None, :])).numpy()
  identical = all(np.array_equal(fingerprints[0], f) for f in fingerprints)
  print(
    f"RESULT rank={hvd.rank()} accuracy={accuracy:.4f} identical={identical} "
    f"table_size={table_size} traffic={hvd.traffic()}",
    flush=True,
  )
  sys.exit(0 if identical else 1)


if __name__ == "__main__":
  main(
    os.environ["TOPK"],
    os.environ.get("TABLE", "0"),
    os.environ.get("EPOCHS", "40"),
    os.environ.get("FUSION", "0"),
    os.environ.get("RETRACE", "0"),
    os.environ.get("LOG_DIR"),
    os.environ.get("RELOAD_DIR"),
  )

"""Small trained Keras models that several test folders share (tests/ is on sys.path: the Bazel
runner and tests/conftest.py put it there)."""

import numpy as np
import tensorflow as tf

import tf_ext


def two_table_model(city_initializer=None, output_name=None):
  """ids (int64) and city (string) through two tables (dim 4) into a sigmoid unit, trained two
  epochs on 2,000 rows: 100 ids and 20 cities, all of which get rows."""
  ids = tf.keras.Input(shape=(), dtype=tf.int64, name="ids")
  city = tf.keras.Input(shape=(), dtype=tf.string, name="city")
  a = tf_ext.keras.layers.DynamicEmbedding(4, initializer="normal", name="ids_emb")(ids)
  b = tf_ext.keras.layers.DynamicEmbedding(
    4, key_dtype=tf.string, initializer=city_initializer, name="city_emb"
  )(city)
  out = tf.keras.layers.Dense(1, activation="sigmoid", name=output_name)(tf.concat([a, b], -1))
  model = tf.keras.Model([ids, city], out)
  model.compile(
    tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05)), "binary_crossentropy"
  )
  rng = np.random.default_rng(0)
  x = {
    "ids": rng.integers(0, 100, 2000),
    "city": np.array([f"c{i}" for i in rng.integers(0, 20, 2000)]),
  }
  model.fit(x, (x["ids"] % 2).astype(np.float32), batch_size=100, epochs=2, verbose=0)
  return model

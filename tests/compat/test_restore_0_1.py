"""Checkpoints and a .keras model written by tf_ext 0.1 (before the optimizer pipeline; see
make_fixtures.py) restore with today's tf_ext: tables with their slots and metadata, dense
weights, optimizer state, and the wrapped optimizer of the Keras model, which keeps training."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
import tf_ext  # noqa: E402
from tf_ext import optimizer_pipeline  # noqa: E402

DATA = os.path.join(HERE, "data_0_1")
sys.path.insert(0, HERE)
from make_fixtures import (  # noqa: E402
  IDS,
  LABELS,
  keras_model,
  lightcc_wrap,
  table_arrays,
  tf1_graph,
)


def _assert_tables_equal(table_arrays_now, expected, prefix=""):
  for name, value in table_arrays_now.items():
    np.testing.assert_array_equal(value, expected[prefix + name], err_msg=name)


def test_keras_file_of_0_1_loads_with_its_wrapped_optimizer_and_keeps_training():
  expected = np.load(os.path.join(DATA, "keras_expected.npz"))
  model = tf.keras.models.load_model(os.path.join(DATA, "keras_model.keras"))
  assert optimizer_pipeline.find_stage(model.optimizer, "tables") is not None
  assert int(model.optimizer.iterations.numpy()) == int(expected["iterations"])
  _assert_tables_equal(table_arrays(model.get_layer("emb").table, ""), expected)
  np.testing.assert_allclose(model.predict(IDS, verbose=0), expected["predictions"], rtol=1e-6)
  before = model.get_layer("emb").table.export()[1].numpy()
  model.fit(IDS, LABELS, batch_size=3, epochs=1, verbose=0)
  assert not np.allclose(model.get_layer("emb").table.export()[1].numpy(), before)


def test_tf2_checkpoint_of_0_1_restores_rows_slots_and_optimizer_state():
  expected = np.load(os.path.join(DATA, "keras_expected.npz"))
  model = keras_model()
  model.optimizer.build(model.trainable_variables)
  ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
  ckpt.read(os.path.join(DATA, "tf2_checkpoint", "ckpt")).assert_existing_objects_matched()
  _assert_tables_equal(table_arrays(model.get_layer("emb").table, ""), expected)
  np.testing.assert_array_equal(model.get_layer("dense").kernel.numpy(), expected["dense_kernel"])
  assert int(model.optimizer.iterations.numpy()) == int(expected["iterations"])


@pytest.mark.parametrize(
  "name,wrap",
  [("tf1", tf_ext.DynamicEmbeddingOptimizer), ("lightcc_tf1", lightcc_wrap)],
  ids=["DynamicEmbeddingOptimizer", "lightcc.DistributedOptimizer_topk"],
)
def test_tf1_saver_checkpoint_of_0_1_restores_every_variable_and_table(name, wrap):
  expected = np.load(os.path.join(DATA, f"{name}_expected.npz"))
  with tf.Graph().as_default():
    _, table, _ = tf1_graph(wrap)
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert sorted(names) == sorted(expected["variable_names"].tolist())
    export = table.export_with_slots()
    with tf.compat.v1.Session() as sess:
      checkpoint = os.path.join(DATA, f"{name}_checkpoint", "model.ckpt")
      tf.compat.v1.train.Saver().restore(sess, checkpoint)
      for name_, variable in zip(names, tf.compat.v1.global_variables()):
        np.testing.assert_array_equal(sess.run(variable), expected[name_.replace("/", "__")], name_)
      keys, values, slots, counts, steps, _ = sess.run(export)
      order = np.argsort(keys)
      now = {
        "keys": keys[order],
        "values": values[order],
        "slots": slots[order],
        "update_counts": counts[order],
        "last_steps": steps[order],
      }
      _assert_tables_equal(now, expected)

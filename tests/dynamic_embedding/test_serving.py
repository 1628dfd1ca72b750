"""SavedModel export: a fresh process that imports tf_ext serves lookups from the saved tables."""

import numpy as np
import tensorflow as tf
from _keras_models import two_table_model
from _subprocess import run_python

QUERY = {"ids": np.array([1, 2, 3, 10**15]), "city": np.array([b"c1", b"c7", b"new", b"c3"])}


def test_keras_model_save_and_load_model_in_fresh_process(tmp_path):
  model = two_table_model()
  expected = model.predict(QUERY, verbose=0)
  model.save(str(tmp_path / "keras_model"))
  out = tmp_path / "pred.npy"
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    model = tf.keras.models.load_model({str(tmp_path / "keras_model")!r})
    query = {{"ids": np.array([1, 2, 3, 10**15]), "city": np.array([b"c1", b"c7", b"new", b"c3"])}}
    np.save({str(out)!r}, model.predict(query, verbose=0))
    assert int(model.get_layer("ids_emb").table.size()) == 100
  """)
  np.testing.assert_allclose(np.load(out), expected, rtol=1e-6)


def test_tf_saved_model_save_and_load_serves_lookups(tmp_path):
  model = two_table_model()

  class Serving(tf.Module):
    def __init__(self, model):
      super().__init__()
      self.model = model
      self.table = model.get_layer("ids_emb").table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def lookup(self, ids):
      return self.table.lookup(ids)

    @tf.function(
      input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.string)]
    )
    def predict(self, ids, city):
      return self.model({"ids": ids, "city": city})

  module = Serving(model)
  export = str(tmp_path / "saved")
  tf.saved_model.save(module, export, signatures={"serving_default": module.predict})
  expected_rows = module.lookup(tf.constant([1, 2, 3, 10**15], tf.int64)).numpy()
  expected_pred = module.predict(QUERY["ids"], QUERY["city"]).numpy()
  out = tmp_path / "served.npz"
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    loaded = tf.saved_model.load({export!r})
    rows = loaded.lookup(tf.constant([1, 2, 3, 10**15], tf.int64)).numpy()
    sig = loaded.signatures["serving_default"]
    pred = list(sig(ids=tf.constant([1, 2, 3, 10**15], tf.int64),
                    city=tf.constant([b"c1", b"c7", b"new", b"c3"])).values())[0].numpy()
    np.savez({str(out)!r}, rows=rows, pred=pred)
  """)
  served = np.load(out)
  np.testing.assert_allclose(served["rows"], expected_rows, rtol=1e-6)
  np.testing.assert_allclose(served["pred"], expected_pred, rtol=1e-6)


def test_keras_format_saves_tables_and_reloads_a_trainable_model(tmp_path):
  model = two_table_model()
  expected = model.predict(QUERY, verbose=0)
  path = str(tmp_path / "model.keras")
  model.save(path)
  out = tmp_path / "pred.npy"
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    model = tf.keras.models.load_model({path!r})
    query = {{"ids": np.array([1, 2, 3, 10**15]), "city": np.array([b"c1", b"c7", b"new", b"c3"])}}
    np.save({str(out)!r}, model.predict(query, verbose=0))
    assert int(model.get_layer("ids_emb").table.size()) == 100
    assert int(model.get_layer("city_emb").table.size()) == 20
    from tf_ext.dynamic_embedding.optimizer import _DynamicEmbeddingMixin
    assert isinstance(model.optimizer, _DynamicEmbeddingMixin), type(model.optimizer).__mro__
    before = model.get_layer("ids_emb").table.lookup([1]).numpy()
    model.fit({{"ids": np.array([1, 2]), "city": np.array([b"c1", b"c2"])}}, np.ones(2), verbose=0)
    assert not np.allclose(before, model.get_layer("ids_emb").table.lookup([1]).numpy())
  """)
  np.testing.assert_allclose(np.load(out), expected, rtol=1e-6)

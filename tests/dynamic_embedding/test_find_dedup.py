"""The find kernel's deduplication of int64 ids (TF_EXT_FIND_DEDUP): rows, statistics and training
equal to a find of every id, whatever the setting. (That a deduplicated batch probes the table once
per distinct id: tests/kernels/dynamic_embedding/distinct_lookup_test.cc.)"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ext

SETTINGS = ("0", "1", "auto")


def _ids(seed, n=4096):
  """Zipf-like ids: present (below 1000) and missing (from 10**12), most of them repeated."""
  ids = np.random.default_rng(seed).zipf(1.3, n).astype(np.int64)
  return np.where(ids % 5 == 0, 10**12 + ids, ids % 1000)


def _table(name, dim=8):
  table = tf_ext.DynamicEmbeddingVariable(
    name, dim, initializer="uniform", admission=tf_ext.FrequencyAdmission(2, exact=True)
  )
  keys = np.arange(1000, dtype=np.int64)
  table.insert(keys, np.random.default_rng(1).standard_normal((1000, dim)).astype(np.float32))
  return table


def _statistics(table):
  return {k: int(v) for k, v in table.statistics().items() if k != "lookup_hit_rate"}


def test_rows_and_statistics_are_those_of_a_find_of_every_id(monkeypatch):
  ids = tf.constant(_ids(0).reshape(64, 64))
  assert np.unique(ids).size < ids.shape.num_elements() / 4
  results = {}
  for setting in SETTINGS:
    monkeypatch.setenv("TF_EXT_FIND_DEDUP", setting)  # read when the function's kernel is made
    table = _table(f"find_dedup_{setting}")
    rows = tf.function(lambda ids, table=table: table.lookup(ids))(ids).numpy()
    results[setting] = rows, _statistics(table)
  rows, statistics = results["0"]
  assert rows.shape == (64, 64, 8)
  assert statistics["lookups"] == 4096 and statistics["size"] == 1000
  assert statistics["admitted"] == 0  # a find admits nothing
  for setting in SETTINGS[1:]:
    assert results[setting][0].tobytes() == rows.tobytes(), setting  # to the bit
    assert results[setting][1] == statistics, setting


@pytest.mark.parametrize("setting", SETTINGS[1:])
def test_training_is_unchanged(monkeypatch, setting):
  """The gradient of a lookup still reaches the update keyed by every id (the optimizer sums the
  duplicates), so one training step leaves the table as without deduplication."""
  ids = tf.constant(_ids(2))
  exported = []
  for variant in ("0", setting):
    monkeypatch.setenv("TF_EXT_FIND_DEDUP", variant)
    table = _table(f"find_dedup_train_{setting}_{variant}")
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))

    @tf.function
    def step(ids, table=table, optimizer=optimizer):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(table.lookup(ids) - 1.0))
      anchor = table.gradient_anchor
      optimizer.apply_gradients([(tape.gradient(loss, anchor), anchor)])

    step(ids)
    step(ids)
    keys, values = (x.numpy() for x in table.export())
    order = np.argsort(keys)
    exported.append((keys[order], values[order], _statistics(table)))
  (keys_0, values_0, stats_0), (keys_1, values_1, stats_1) = exported
  np.testing.assert_array_equal(keys_1, keys_0)
  assert values_1.tobytes() == values_0.tobytes()
  assert stats_1 == stats_0
  assert stats_0["admitted"] > 0  # missing ids seen twice were admitted by the updates


def test_string_ids_are_looked_up_one_by_one_as_before(monkeypatch):
  monkeypatch.setenv("TF_EXT_FIND_DEDUP", "1")
  table = tf_ext.DynamicEmbeddingVariable("find_dedup_strings", 4, key_dtype=tf.string)
  ids = tf.constant([b"a", b"b", b"a"] * 100)
  rows = tf.function(table.lookup)(ids).numpy()
  np.testing.assert_array_equal(rows[0], rows[2])
  assert int(table.statistics()["lookups"]) == 300

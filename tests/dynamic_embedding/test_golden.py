"""Golden values: the rows a served model returns for ids it never trained on.

A missing id reads its initial row, computed from the id and the table's initializer alone
(InitialRowKeyHash and FillInitialRow, kernels/dynamic_embedding/core/initializers.h). The same id
must read the same row in every process, every version of tf_ext and whatever the table holds.
These are the rows, pinned to the bit, for each way of giving an initializer and for int64 and
string ids; tests/kernels/dynamic_embedding/initial_rows_golden_test.cc pins the same function in
C++. A failure means the change would silently alter what served models return for unseen ids.
Recorded from tf_ext at commit 9cba35a.
"""

import numpy as np
import pytest
import tensorflow as tf
from _subprocess import run_python

import tf_ext

DIM = 3
INT64_IDS = [0, -1, 10**15, 2**63 - 1]
STRING_IDS = [b"", b"abcdefghi", b"a\x00b"]

# Rows as float32 values written in hex, for INT64_IDS then STRING_IDS.
DEFAULT = [  # mean 0, stddev 0.001, seed 0: initializer=None
  ["0x1.06f6d0p-11", "-0x1.e289c8p-11", "0x1.616fa2p-10"],
  ["0x1.37694ap-14", "0x1.042004p-14", "0x1.120fc8p-12"],
  ["-0x1.60c568p-10", "-0x1.337fa8p-11", "0x1.95d0d8p-13"],
  ["-0x1.2d1766p-13", "0x1.a1f58ep-11", "-0x1.ee0f90p-11"],
  ["-0x1.77c7e2p-11", "0x1.3ce3a6p-11", "0x1.81cb8cp-12"],
  ["0x1.62d27ap-14", "0x1.d36660p-10", "-0x1.de5bb0p-11"],
  ["-0x1.4ea472p-12", "-0x1.8395f8p-13", "0x1.9e70c8p-12"],
]
UNIFORM_DEFAULT = [  # uniform in [-0.05, 0.05), seed 0: "uniform"
  ["0x1.47043ap-10", "0x1.074c3ep-5", "-0x1.17722p-6"],
  ["-0x1.4a0eacp-6", "-0x1.a60e6p-6", "0x1.0034c2p-5"],
  ["-0x1.ed8bdap-6", "0x1.7a0028p-7", "0x1.1809fcp-5"],
  ["0x1.6e4fb2p-9", "0x1.78633cp-6", "-0x1.4c317ep-6"],
  ["0x1.a11ffp-6", "-0x1.39ba7ep-8", "0x1.d1134ap-6"],
  ["-0x1.5d3166p-6", "0x1.a790b6p-6", "-0x1.3838f2p-5"],
  ["0x1.70c25ap-5", "0x1.0ebc34p-10", "0x1.abe536p-7"],
]
NORMAL_DEFAULT = [  # mean 0, stddev 0.05, seed 0
  ["0x1.9ae1a4p-6", "-0x1.78fba2p-5", "0x1.141f36p-4"],
  ["0x1.e69482p-9", "0x1.967206p-9", "0x1.ac38a8p-7"],
  ["-0x1.139a3ap-4", "-0x1.e07774p-6", "0x1.3d0b28p-7"],
  ["-0x1.d6749p-8", "0x1.4687d6p-5", "-0x1.81fc28p-5"],
  ["-0x1.259428p-5", "0x1.ef23b2p-6", "0x1.2d6706p-6"],
  ["0x1.15346ep-8", "0x1.6d27fap-4", "-0x1.75b7a2p-5"],
  ["-0x1.057078p-6", "-0x1.2ecd28p-7", "0x1.43c81ap-6"],
]
# No draw of these rows falls beyond two standard deviations, so nothing is redrawn.
TRUNCATED_NORMAL_DEFAULT = NORMAL_DEFAULT
UNIFORM_SEED_17 = [  # uniform in [-0.3, 0.7), seed 17
  ["-0x1.8b36a4p-4", "0x1.2473a2p-2", "0x1.3add86p-2"],
  ["-0x1.a1e7eep-6", "0x1.916b5ep-2", "-0x1.21d0bcp-3"],
  ["0x1.940098p-2", "-0x1.06e3bep-2", "0x1.075182p-1"],
  ["0x1.1c7006p-1", "-0x1.a429dp-3", "0x1.319f36p-2"],
  ["-0x1.2b1e1p-3", "-0x1.d56cbcp-4", "0x1.ba0e34p-2"],
  ["0x1.3809cp-1", "-0x1.02410cp-4", "-0x1.0eaa3cp-2"],
  ["-0x1.125ba2p-2", "0x1.472346p-1", "0x1.7e8a7ap-3"],
]
NORMAL_SEED_123 = [  # mean 0.5, stddev 2, seed 123
  ["0x1.b2af68p+1", "0x1.86d548p-1", "0x1.6a639ep+1"],
  ["0x1.6836aap-1", "-0x1.05527p+0", "-0x1.5d0c2ap+1"],
  ["-0x1.3a3ff4p-2", "0x1.798824p+1", "0x1.85bb6ep+1"],
  ["0x1.e84adcp+1", "0x1.8775d8p+0", "-0x1.d1295cp+1"],
  ["0x1.088962p-5", "-0x1.5643b6p-1", "-0x1.0ca2eep+1"],
  ["-0x1.51192ep+1", "0x1.5b199cp+0", "0x1.b75eep+0"],
  ["-0x1.03edd4p+1", "0x1.fdaaep-1", "-0x1.923fc4p-2"],
]
TRUNCATED_NORMAL_SEED_MINUS_99 = [  # mean -1, stddev 0.1, seed -99; the row of b"" redraws
  ["-0x1.f2898p-1", "-0x1.f2c06cp-1", "-0x1.285a3cp+0"],
  ["-0x1.efe92ap-1", "-0x1.097e38p+0", "-0x1.bf4a8ep-1"],
  ["-0x1.de70fep-1", "-0x1.ec8c5cp-1", "-0x1.07b422p+0"],
  ["-0x1.011552p+0", "-0x1.2b0718p+0", "-0x1.c9c66cp-1"],
  ["-0x1.dc7be8p-1", "-0x1.dc916p-1", "-0x1.2b9b6p+0"],
  ["-0x1.ea7de4p-1", "-0x1.0955ccp+0", "-0x1.0ef006p+0"],
  ["-0x1.fbdb18p-1", "-0x1.f658eap-1", "-0x1.ef322cp-1"],
]

# (how the initializer is given, a factory of it, its pinned rows or constant value)
CASES = [
  ("None", lambda: None, DEFAULT),
  ("'uniform'", lambda: "uniform", UNIFORM_DEFAULT),
  ("'normal'", lambda: "normal", NORMAL_DEFAULT),
  ("'truncated_normal'", lambda: "truncated_normal", TRUNCATED_NORMAL_DEFAULT),
  ("'zeros'", lambda: "zeros", 0.0),
  ("'constant'", lambda: "constant", 0.0),
  ("0.5", lambda: 0.5, 0.5),
  ("-2", lambda: -2, -2.0),
  ("keras Zeros", tf.keras.initializers.Zeros, 0.0),
  ("keras Ones", tf.keras.initializers.Ones, 1.0),
  ("keras Constant", lambda: tf.keras.initializers.Constant(0.25), 0.25),
  ("tf.constant_initializer", lambda: tf.constant_initializer(0.25), 0.25),
  (
    "keras RandomUniform",
    lambda: tf.keras.initializers.RandomUniform(-0.3, 0.7, 17),
    UNIFORM_SEED_17,
  ),
  (
    "v1 random_uniform_initializer",
    lambda: tf.compat.v1.random_uniform_initializer(-0.3, 0.7, seed=17),
    UNIFORM_SEED_17,
  ),
  ("spec", lambda: tf_ext.InitializerSpec("uniform", -0.3, 0.7, 17), UNIFORM_SEED_17),
  (
    "keras RandomNormal",
    lambda: tf.keras.initializers.RandomNormal(0.5, 2.0, 123),
    NORMAL_SEED_123,
  ),
  (
    "tf.random_normal_initializer",
    lambda: tf.random_normal_initializer(0.5, 2.0, 123),
    NORMAL_SEED_123,
  ),
  ("dict", lambda: {"kind": "normal", "a": 0.5, "b": 2.0, "seed": 123}, NORMAL_SEED_123),
  (
    "keras TruncatedNormal",
    lambda: tf.keras.initializers.TruncatedNormal(-1.0, 0.1, seed=-99),
    TRUNCATED_NORMAL_SEED_MINUS_99,
  ),
  (
    "v1 truncated_normal_initializer",
    lambda: tf.compat.v1.truncated_normal_initializer(-1.0, 0.1, seed=-99),
    TRUNCATED_NORMAL_SEED_MINUS_99,
  ),
]


def _pinned(rows_or_value, key_dtype):
  """The pinned rows of INT64_IDS or STRING_IDS as float32, [num_ids, DIM]."""
  if not isinstance(rows_or_value, list):
    num_ids = len(INT64_IDS if key_dtype == tf.int64 else STRING_IDS)
    return np.full([num_ids, DIM], rows_or_value, np.float32)
  rows = (
    rows_or_value[: len(INT64_IDS)] if key_dtype == tf.int64 else rows_or_value[len(INT64_IDS) :]
  )
  exact = np.array([[float.fromhex(v) for v in row] for row in rows])
  assert (exact.astype(np.float32) == exact).all(), f"a pinned value is not a float32: {rows}"
  return exact.astype(np.float32)


def _ids(key_dtype):
  return tf.constant(INT64_IDS if key_dtype == tf.int64 else STRING_IDS, key_dtype)


def _assert_bits_equal(rows, pinned, what):
  """Exact to the bit: no drift in the last place, and -0.0 is not 0.0."""
  rows = np.asarray(rows, np.float32)
  assert rows.shape == pinned.shape, what
  differ = rows.view(np.uint32) != pinned.view(np.uint32)
  assert not differ.any(), (
    f"{what}: served rows changed at {np.argwhere(differ).tolist()}:\n{rows!r}\npinned:\n{pinned!r}"
  )


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=["int64", "string"])
@pytest.mark.parametrize("label,make_initializer,pinned", CASES, ids=[c[0] for c in CASES])
def test_missing_ids_read_pinned_rows(label, make_initializer, pinned, key_dtype):
  table = tf_ext.DynamicEmbeddingVariable(
    "golden", DIM, key_dtype=key_dtype, initializer=make_initializer()
  )
  _assert_bits_equal(table.lookup(_ids(key_dtype)), _pinned(pinned, key_dtype), label)
  assert int(table.size()) == 0


def _train(table, ids):
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(table.lookup(ids))
  anchor = table.gradient_anchor
  optimizer.apply_gradients(zip(tape.gradient(loss, [anchor]), [anchor]))


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=["int64", "string"])
def test_served_rows_do_not_depend_on_the_tables_state(key_dtype):
  table = tf_ext.DynamicEmbeddingVariable(
    "golden_state",
    DIM,
    key_dtype=key_dtype,
    initializer=tf.keras.initializers.TruncatedNormal(-1.0, 0.1, seed=-99),
  )
  ids, pinned = _ids(key_dtype), _pinned(TRUNCATED_NORMAL_SEED_MINUS_99, key_dtype)
  count = 20000
  other_ids = (
    tf.range(1, count + 1, dtype=tf.int64) * 7919
    if key_dtype == tf.int64
    else tf.strings.as_string(tf.range(count)) + "/other"
  )

  def check(after):
    _assert_bits_equal(table.lookup(ids), pinned, f"after {after}")

  table.insert(other_ids, tf.fill([count, DIM], 7.0))
  check("inserting other ids")
  table.remove(other_ids[::3])
  check("removing some of them")
  _train(table, other_ids[1::3][:500])  # Adam: every row gets two slots, so the entries move
  check("training other ids")
  table.insert(ids, tf.fill([len(pinned), DIM], 3.0))
  table.remove(ids)
  check("inserting and removing the ids themselves")
  snapshot = [t.numpy() for t in table.export_with_slots()]
  table.clear()
  table.import_with_slots(*snapshot)
  check("clearing and restoring the table")
  assert int(table.size()) == len(other_ids) - len(other_ids[::3])


def test_keras_layer_and_graph_mode_serve_the_pinned_rows():
  layer = tf_ext.keras.layers.DynamicEmbedding(
    DIM, initializer=tf.keras.initializers.RandomNormal(0.5, 2.0, seed=123)
  )
  _assert_bits_equal(layer(_ids(tf.int64)), _pinned(NORMAL_SEED_123, tf.int64), "Keras layer")
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    table = tf_ext.get_dynamic_embedding_variable(
      "golden_graph", DIM, key_dtype=tf.string, initializer="normal"
    )
    rows = table.lookup(_ids(tf.string))
    session.run(tf.compat.v1.global_variables_initializer())
    rows = session.run(rows)
  _assert_bits_equal(rows, _pinned(NORMAL_DEFAULT, tf.string), "TF1 graph")


def test_saved_model_serves_the_pinned_rows_in_a_fresh_process(tmp_path):
  class Serving(tf.Module):
    def __init__(self):
      super().__init__()
      self.ids_table = tf_ext.DynamicEmbeddingVariable(
        "golden_ids", DIM, initializer=tf.random_normal_initializer(0.5, 2.0, seed=123)
      )
      self.names_table = tf_ext.DynamicEmbeddingVariable("golden_names", DIM, key_dtype=tf.string)
      # The lookups read the gradient anchors: the module must track them (a Keras layer does).
      self.anchors = [self.ids_table.gradient_anchor, self.names_table.gradient_anchor]

    @tf.function(
      input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.string)]
    )
    def lookup(self, ids, names):
      return self.ids_table.lookup(ids), self.names_table.lookup(names)

  module = Serving()
  module.ids_table.insert([5, 6], tf.ones([2, DIM]))  # trained ids: saved, and not asked for
  module.names_table.insert([b"seen"], tf.ones([1, DIM]))
  export = str(tmp_path / "saved")
  tf.saved_model.save(module, export)
  out = str(tmp_path / "served.npz")
  run_python(f"""
    import numpy as np, tensorflow as tf, tf_ext
    loaded = tf.saved_model.load({export!r})
    ids, names = loaded.lookup(tf.constant({INT64_IDS!r}, tf.int64), tf.constant({STRING_IDS!r}))
    np.savez({out!r}, ids=ids.numpy(), names=names.numpy())
  """)
  served = np.load(out)
  _assert_bits_equal(served["ids"], _pinned(NORMAL_SEED_123, tf.int64), "SavedModel, int64")
  _assert_bits_equal(served["names"], _pinned(DEFAULT, tf.string), "SavedModel, string")

"""Initializer versions: version 2 of normal and truncated-normal rows, chosen per table.

Version 1 stays the default and frozen (test_golden.py). Version 2's rows are pinned here as the
ops serve them (the same rows as tests/kernels/dynamic_embedding/initial_rows_v2_test.cc); the
version is part of the table's config, and a snapshot keeps it: restoring into a table of another
version is an error.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ext
from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import initializers

INT64_IDS = [0, -1, 10**15, 2**63 - 1]
STRING_IDS = [b"", b"abcdefghi", b"a\x00b"]
# The first 3 elements of the pinned rows, for INT64_IDS then STRING_IDS.
NORMAL_V2_SEED_123 = [  # mean 0.5, stddev 2, seed 123
  ["-0x1.a36b84p-1", "-0x1.5265d8p-2", "0x1.8ddc0ap-2"],
  ["-0x1.c0744cp+1", "0x1.9c6894p+0", "-0x1.6fa65p-1"],
  ["0x1.a3bbecp+1", "0x1.8866ep-2", "-0x1.235a1ap+1"],
  ["0x1.1df0e4p+1", "0x1.b0a8ecp+0", "-0x1.e38274p+0"],
  ["0x1.8ed112p+1", "-0x1.1b3cb4p+2", "0x1.090b98p+0"],
  ["0x1.95425ep+2", "0x1.3dbbb8p+1", "-0x1.07c698p-1"],
  ["0x1.46b76cp+0", "0x1.e4031p-3", "0x1.59e846p+1"],
]
TRUNCATED_V2_SEED_MINUS_99 = [  # mean -1, stddev 0.1, seed -99; -1's element 0 is a redraw
  ["-0x1.c3bf8ep-1", "-0x1.274b56p+0", "-0x1.e43c34p-1"],
  ["-0x1.08b1aep+0", "-0x1.f19022p-1", "-0x1.0f34d6p+0"],
  ["-0x1.ffddbep-1", "-0x1.143bbp+0", "-0x1.0ca526p+0"],
  ["-0x1.e73708p-1", "-0x1.0b9e48p+0", "-0x1.02c408p+0"],
  ["-0x1.d63498p-1", "-0x1.01e588p+0", "-0x1.07906p+0"],
  ["-0x1.1b0b58p+0", "-0x1.1c985ap+0", "-0x1.25d87cp+0"],
  ["-0x1.b35358p-1", "-0x1.164f16p+0", "-0x1.112b46p+0"],
]


def _rows(hex_rows):
  return np.array([[float.fromhex(x) for x in row] for row in hex_rows], np.float32)


@pytest.mark.parametrize(
  "initializer, pinned",
  [
    (tf_ext.InitializerSpec("normal", 0.5, 2.0, 123, version=2), NORMAL_V2_SEED_123),
    (
      {"kind": "truncated_normal", "a": -1.0, "b": 0.1, "seed": -99, "version": 2},
      TRUNCATED_V2_SEED_MINUS_99,
    ),
  ],
)
def test_version_2_tables_serve_the_pinned_rows(initializer, pinned):
  expected = _rows(pinned)
  ints = tf_ext.DynamicEmbeddingVariable("v2_ints", 3, initializer=initializer)
  strings = tf_ext.DynamicEmbeddingVariable(
    "v2_strings", 3, key_dtype=tf.string, initializer=initializer
  )
  got = np.concatenate([ints.lookup(INT64_IDS).numpy(), strings.lookup(STRING_IDS).numpy()])
  np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_the_default_version_is_1_and_the_version_is_in_the_config():
  assert initializers.spec_from("normal", 4, "t").version == 1
  assert initializers.spec_from({"kind": "normal", "a": 0.0, "b": 1.0}, 4, "t").version == 1
  spec = tf_ext.InitializerSpec("truncated_normal", 0.0, 0.05, 3, version=2)
  config = initializers.to_config(spec)
  assert config["version"] == 2
  assert initializers.spec_from(config, 4, "t") == spec
  assert tf_ext.InitializerSpec(**config) == spec


def test_versions_differ_only_for_normal_kinds():
  ids = tf.constant([5, 6, 7], tf.int64)
  for kind in ("uniform", "normal", "truncated_normal"):
    v1 = tf_ext.DynamicEmbeddingVariable(f"{kind}_1", 8, initializer={"kind": kind, "b": 0.5})
    v2 = tf_ext.DynamicEmbeddingVariable(
      f"{kind}_2", 8, initializer={"kind": kind, "b": 0.5, "version": 2}
    )
    same = np.array_equal(v1.lookup(ids).numpy(), v2.lookup(ids).numpy())
    assert same == (kind == "uniform"), kind


def test_an_unknown_version_is_refused():
  with pytest.raises(tf.errors.InvalidArgumentError, match="unknown initializer version 3"):
    tf_ext.DynamicEmbeddingVariable(
      "t", 4, initializer=tf_ext.InitializerSpec("normal", 0, 1, 0, 3)
    )


def test_a_snapshot_keeps_its_version_and_refuses_a_table_of_another(tmp_path):
  v2 = tf_ext.InitializerSpec("normal", 0.0, 0.05, 0, version=2)
  saved = tf_ext.DynamicEmbeddingVariable("emb", 4, initializer=v2)
  saved.insert([1, 2], np.ones((2, 4), np.float32))
  tf_ext.DeltaCheckpointManager(tmp_path / "chain", [saved]).save(step=1)

  same = tf_ext.DynamicEmbeddingVariable("emb", 4, initializer=v2)
  tf_ext.DeltaCheckpointManager(tmp_path / "chain", [same]).restore()
  np.testing.assert_array_equal(same.lookup([1, 2, 3]).numpy(), saved.lookup([1, 2, 3]).numpy())

  other = tf_ext.DynamicEmbeddingVariable("emb", 4, initializer="normal")
  with pytest.raises(tf.errors.InvalidArgumentError, match="initializer version 2, the table has"):
    tf_ext.DeltaCheckpointManager(tmp_path / "chain", [other]).restore()


def test_initializer_versions_are_the_kernels():
  def raw_table(name, version):
    return _ops_loader.load().tf_ext_dynamic_table(
      table_name=name,
      shared_name=f"{name}_{id(object())}",
      key_dtype=tf.int64,
      dim=2,
      initializer="normal",
      init_b=1.0,
      initializer_version=version,
    )

  for version in initializers.VERSIONS:
    raw_table(f"version_{version}", version)
  for version in (min(initializers.VERSIONS) - 1, max(initializers.VERSIONS) + 1):
    with pytest.raises(tf.errors.InvalidArgumentError, match="initializer version must be in"):
      raw_table(f"version_{version}", version)

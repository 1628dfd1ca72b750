"""benchmarks/_criteo_like.py, the seeded click-stream generator, and a smoke run of
benchmarks/quality.py (--quick --no-tfra). No timing is asserted: the benchmark's targets are
reported by the script, not checked here."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
if not os.path.isfile(os.path.join(BENCHMARKS, "_criteo_like.py")):
  pytest.skip("benchmarks/ is not in this test's files", allow_module_level=True)
sys.path.insert(0, BENCHMARKS)

import _criteo_like  # noqa: E402

N = 20_000


@pytest.fixture(scope="module")
def gen():
  return _criteo_like.CriteoLike(seed=7)


@pytest.fixture(scope="module")
def days(gen):
  return [gen.day(d, N) for d in range(4)]


def test_shapes_and_dtypes(days):
  day = days[0]
  assert len(day) == N
  assert day.ids.shape == (N, _criteo_like.NUM_FIELDS) and day.ids.dtype == np.int64
  assert day.dense.shape == (N, _criteo_like.NUM_DENSE) and day.dense.dtype == np.float32
  assert day.label.shape == (N,) and day.label.dtype == np.float32
  assert day.prob.shape == (N,) and day.prob.dtype == np.float64
  assert (day.ids >= 0).all()
  assert set(np.unique(day.label)) <= {0.0, 1.0}
  assert ((day.prob > 0) & (day.prob < 1)).all()
  assert np.isfinite(day.dense).all()


def test_deterministic_for_a_seed(gen, days):
  again = _criteo_like.CriteoLike(seed=7).day(2, N)
  for name in ("ids", "dense", "label", "prob"):
    np.testing.assert_array_equal(getattr(again, name), getattr(days[2], name))
  other = _criteo_like.CriteoLike(seed=8).day(2, N)
  assert not np.array_equal(other.ids, days[2].ids)


def test_vocabularies_include_millions():
  assert max(_criteo_like.VOCAB) >= 10**7
  assert sum(v >= 10**6 for v in _criteo_like.VOCAB) >= 3


def test_zipf_head(days):
  ids = days[0].ids
  for f in (0, 3, 11):
    _, counts = np.unique(ids[:, f], return_counts=True)
    counts = np.sort(counts)[::-1]
    # The most frequent id is far more frequent than the median one, and the top 1 % of the
    # distinct ids carries a large share of the traffic.
    assert counts[0] >= 20 * np.median(counts)
    top = max(1, len(counts) // 100)
    assert counts[:top].sum() >= 0.2 * N
  # The smallest fields have at most their vocabulary's distinct ids.
  assert len(np.unique(ids[:, -1])) <= _criteo_like.VOCAB[-1]


def test_drift_new_ids_appear_and_old_ones_fade(gen, days):
  f = 0
  seen = [set(day.ids[:, f].tolist()) for day in days]
  # New ids appear every day (more than sampling alone would give), ...
  slots = np.arange(1000, dtype=np.int64)
  head = [set(gen.slot_ids(f, slots, d).tolist()) for d in range(4)]
  new_in_head = len(head[3] - head[0])
  assert 0 < new_in_head < len(head[3])
  # ... old ones fade: some of day 0's head ids never come back.
  assert len(head[0] - head[3]) == new_in_head
  assert len(seen[3] - seen[0]) > 0
  # A churned slot's old id is gone from the later day's stream.
  gone = head[0] - head[3]
  assert not gone & seen[3]
  # Stable (non-churning) fields keep their ids.
  small = _criteo_like.NUM_FIELDS - 1
  assert _criteo_like.CHURN[small] == 0
  np.testing.assert_array_equal(
    gen.slot_ids(small, np.arange(2, dtype=np.int64), 0),
    gen.slot_ids(small, np.arange(2, dtype=np.int64), 3),
  )


def test_labels_follow_the_hidden_probability(days):
  for day in days:
    assert abs(day.label.mean() - day.prob.mean()) < 4 * np.sqrt(0.25 / N)
    # Calibrated by decile of the true probability.
    order = np.argsort(day.prob)
    for part in np.array_split(order, 5):
      assert abs(day.label[part].mean() - day.prob[part].mean()) < 0.03
    assert day.bayes_auc() > 0.7
    shuffled = np.random.default_rng(0).permutation(day.prob)
    assert abs(_criteo_like.auc(shuffled, day.label) - 0.5) < 0.03


def test_hidden_weights_are_pure_functions_of_the_id(gen):
  ids = np.array([1, 2, 3, 10**15], np.int64)
  np.testing.assert_array_equal(gen.field_weights(0, ids), gen.field_weights(0, ids[::-1])[::-1])
  assert not np.allclose(gen.field_weights(0, ids), gen.field_weights(1, ids))


def test_quality_quick_smoke_run(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  png, out = tmp_path / "quality.png", tmp_path / "quality.json"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(BENCHMARKS, "quality.py"),
      "--quick",
      "--no-tfra",
      "--png",
      str(png),
      "--json",
      str(out),
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=180,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  text = proc.stdout
  assert "AUC on each day" in text
  assert "samples/s" in text
  assert "tf_ext / hashed" in text
  assert "skipped (--no-tfra)" in text
  assert "tf_ext AUC >= hashed" in text
  assert out.exists()
  try:
    import matplotlib  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return
  assert png.exists() and png.stat().st_size > 0

"""LightCC in TF1 graph mode: MonitoredTrainingSession and Estimator (real ranks)."""

import numpy as np
from _launch import assert_ok, horovodrun


def test_tf1_session_and_estimator_with_broadcast_hook(tmp_path):
  assert_ok(horovodrun("_worker_tf1.py", OUT_DIR=tmp_path))
  for mode in ("session", "estimator"):
    ranks = [np.load(tmp_path / f"{mode}_{r}.npz") for r in range(4)]
    for name in ("w", "b"):
      assert all(np.array_equal(ranks[0][name], r[name]) for r in ranks), f"{mode} replicas differ"
  losses = np.load(tmp_path / "session_0.npz")["losses"]
  assert losses[-1] < losses[0] * 0.01

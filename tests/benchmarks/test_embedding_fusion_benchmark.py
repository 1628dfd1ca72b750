"""benchmarks/embedding_fusion.py runs end to end on a tiny setting (no timing is asserted: its
targets are for the full run) and reports every variant, tower and API."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_embedding_fusion_tiny_run(tmp_path):
  out, png = tmp_path / "fusion.json", tmp_path / "fusion.png"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "benchmarks", "embedding_fusion.py"),
      "--batch=64",
      "--batches=2",
      "--steps=2",
      "--rounds=1",
      "--towers=none;8",
      f"--json={out}",
      f"--png={png}",
    ],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  assert proc.stdout.count("passes on >= 1.3x off") == 4  # 2 towers x (Session, Keras)
  results = json.loads(out.read_text())
  assert [t["hidden"] for t in results["towers"]] == [[], [8]]
  for tower in results["towers"]:
    for api in ("session", "keras"):
      assert set(tower[api]["steps_per_s"]) == {"off", "fusion", "all"}
      assert all(r > 0 for rates in tower[api]["steps_per_s"].values() for r in rates)
  bad = subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "embedding_fusion.py"), "--towers=a,b"],
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert bad.returncode == 2 and "--towers" in bad.stderr

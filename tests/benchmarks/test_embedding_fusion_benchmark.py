"""benchmarks/embedding_fusion.py runs end to end on a tiny setting (no timing is asserted: its
targets are for the full run) and reports every variant, tower and API."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--batch=64", "--batches=2", "--steps=2", "--rounds=1", "--towers=none;8"]


def run(*args, timeout=300):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "embedding_fusion.py"), *args],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_embedding_fusion_tiny_run(tmp_path):
  out, png = tmp_path / "fusion.json", tmp_path / "fusion.png"
  proc = run(*TINY, f"--json={out}", f"--png={png}")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  assert proc.stdout.count("passes on >= 1.3x off") == 4  # 2 towers x (Session, Keras)
  results = json.loads(out.read_text())
  assert [t["hidden"] for t in results["towers"]] == [[], [8]]
  for tower in results["towers"]:
    for api in ("session", "keras"):
      assert set(tower[api]["steps_per_s"]) == {"off", "fusion", "all"}
      assert all(r > 0 for rates in tower[api]["steps_per_s"].values() for r in rates)
  bad = run("--towers=a,b", timeout=120)
  assert bad.returncode == 2 and "--towers" in bad.stderr


def test_shared_tables_run_in_the_session_and_bad_values_are_refused():
  proc = run(*TINY, "--shared=2", "--apis=session", "--png=")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  assert "2 of them share a single-id field's table" in proc.stdout
  assert proc.stdout.count("passes on >= 1.3x off") == 2  # 2 towers x Session
  for args, message in [
    (["--shared=2"], "--shared needs --apis session"),
    (["--shared=7", "--apis=session"], "--shared must be in [0, 6]"),
  ]:
    bad = run(*args, timeout=120)
    assert bad.returncode == 2 and message in bad.stderr, bad.stderr

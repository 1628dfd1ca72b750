"""benchmarks/tfra_quality.py runs end to end on a tiny setting with tf_ext.tfra and the native
API (TFRA itself is a benchmark-only install): the TFRA program on tf_ext.tfra trains as the native
program with bias_correction_step="optimizer", and bad arguments are refused."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, timeout=300):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "tfra_quality.py"), *args],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_tfra_api_trains_as_the_native_api_in_a_tiny_run(tmp_path, monkeypatch):
  # With the table's per-key initial rows, the TFRA program makes the native program's updates
  # (by default tf_ext.tfra draws rows per lookup, as TFRA, and trains as TFRA instead).
  monkeypatch.setenv("TF_EXT_TFRA_INITIAL_ROWS", "per_key")
  out = tmp_path / "quality.json"
  proc = run("--configs=tfra_api,optimizer,row,defaults", "--seeds=1", "--steps=3", f"--json={out}")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  runs = json.loads(out.read_text())["runs"]
  (compat,), (native,), (row,), (defaults,) = (
    runs[c] for c in ("tfra_api", "optimizer", "row", "defaults")
  )
  assert 0.0 < compat["auc"] < 1.0 and 0.0 < row["auc"] < 1.0
  # tf_ext's default rows (N(0, 0.001^2)) are not the benchmark's N(0, 0.01^2): another model.
  assert 0.0 < defaults["auc"] < 1.0 and defaults["auc"] != native["auc"]
  assert abs(compat["auc"] - native["auc"]) < 1e-4, (compat, native)
  assert compat["per_day"].keys() == native["per_day"].keys() == {"0"}
  assert "Mean AUC per day" in proc.stdout and "CPU features" in proc.stdout
  assert "optimizer-tfra_api" in proc.stdout


def test_bad_arguments_are_refused():
  proc = run("--configs=tfra_api,nope", timeout=120)
  assert proc.returncode == 2 and "nope" in proc.stderr
  proc = run("--initial-stddev=0", timeout=120)
  assert proc.returncode == 2 and "initial-stddev" in proc.stderr

"""benchmarks/tfra_compat.py runs end to end on a tiny setting (no timing is asserted: its targets
are for the full run) with tf_ext.tfra and the native API (TFRA itself is a benchmark-only
install), and refuses bad arguments."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, timeout=300):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "tfra_compat.py"), *args],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_tfra_compat_tiny_run(tmp_path):
  out = tmp_path / "tfra.json"
  proc = run("--quick", "--impls=tf_ext.tfra,native,floor", f"--json={out}")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  results = json.loads(out.read_text())
  assert set(results["runs"]) == {
    f"{p}/{i}" for p in ("keras", "tf1") for i in ("tf_ext.tfra", "native", "floor")
  }
  assert all(rate > 0 for rates in results["runs"].values() for rate in rates)
  assert set(results["verdicts"]) == {"keras/native", "tf1/native"}
  assert "CPU features" in proc.stdout


def test_bad_arguments_are_refused():
  proc = run("--impls=tfra,nope", timeout=120)
  assert proc.returncode == 2 and "nope" in proc.stderr

"""The Estimator example runs end to end: train_and_evaluate, export, serving in a fresh process."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_estimator_columns_quick():
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "examples", "estimator_columns.py"), "--quick"],
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  assert "served in a fresh process: max |probability difference| to Estimator.predict = 0" in (
    proc.stdout
  )

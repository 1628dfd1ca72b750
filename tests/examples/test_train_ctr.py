"""The demo (make demo) runs end to end on a small click log and checks its own invariants."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_train_ctr_quick():
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "examples", "train_ctr.py"), "--quick"],
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "AUC" in proc.stdout and "equal" in proc.stdout

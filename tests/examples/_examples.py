"""Runs an example script of examples/ in a fresh process, on this source tree."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_example(script, *args, timeout=240):
  """Runs examples/<script> with args; asserts it exits 0 and returns its stdout."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "examples", script), *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  return proc.stdout

"""Runs a Python snippet in a fresh process that imports tf_ext from this source tree."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code, timeout=240, check=True, args=(), env=None):
  """Runs `code` with sys.argv[1:] = args; `env` adds to (or overrides) the environment."""
  env = dict(
    os.environ,
    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    TF_CPP_MIN_LOG_LEVEL="2",
    **(env or {}),
  )
  proc = subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code), *args],
    env=env,
    timeout=timeout,
    capture_output=True,
    text=True,
  )
  if check and proc.returncode != 0:
    raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
  return proc

"""The README's Python examples run, in order, in one fresh process (as a reader pastes them)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_blocks():
  with open(os.path.join(ROOT, "README.md")) as readme:
    return re.findall(r"```python\n(.*?)```", readme.read(), re.S)


def test_readme_python_examples_run():
  blocks = python_blocks()
  assert len(blocks) >= 4
  program = "\n".join(f"# ---- README example {i}\n{block}" for i, block in enumerate(blocks))
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(
    [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0, proc.stderr[-4000:]

"""The docs' code-block convention: a block fenced ```python runs, one fenced ```py is shown only.

A file's ```python blocks run in order, in one fresh process (as a reader pastes them one after the
other), with tf_ext imported from this checkout (or Bazel's runfiles).
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The fence at the start of a line: "```python" and nothing else ("```py" and "```pycon" are shown).
_PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)


def python_blocks(path):
  """The ```python blocks of the Markdown file `path`, in order."""
  with open(path) as f:
    return _PYTHON_BLOCK.findall(f.read())


def _program(blocks, source):
  """The blocks as one program, and for each of its lines (1-based) the block and line it is."""
  lines, origin = [], [None]
  for i, block in enumerate(blocks):
    lines.append(f"# ---- {source} example {i + 1}")
    origin.append(None)
    for j, line in enumerate(block.rstrip("\n").split("\n"), start=1):
      lines.append(line)
      origin.append((i + 1, j, line))
  return "\n".join(lines) + "\n", origin


def run_blocks(blocks, source, cwd=None, timeout=300):
  """Runs `blocks` as one program in a fresh Python process: (returncode, stdout, report), where
  the report is stderr's tail and, on a failure, the example and line it happened at."""
  program, origin = _program(blocks, source)
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run(
    [sys.executable, "-c", program],
    env=env,
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  report = proc.stderr[-4000:]
  at = re.findall(r'File "<string>", line (\d+)', proc.stderr)
  if proc.returncode != 0 and at and int(at[-1]) < len(origin) and origin[int(at[-1])]:
    example, line, text = origin[int(at[-1])]
    report += f"\nFailed at {source}, example {example} (its ```python block), line {line}: {text}"
  return proc.returncode, proc.stdout, report

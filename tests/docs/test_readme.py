"""The README's Python examples run, in order, in one fresh process (as a reader pastes them)."""

import os

from _code_blocks import ROOT, python_blocks, run_blocks


def test_readme_python_examples_run():
  blocks = python_blocks(os.path.join(ROOT, "README.md"))
  assert len(blocks) >= 4
  returncode, _, report = run_blocks(blocks, "README.md")
  assert returncode == 0, report

"""The Python examples of every page of docs/ run (the README's: test_readme.py).

The convention (_code_blocks.py): a block fenced ```python runs, the blocks of a page in order in
one fresh process; a block fenced ```py is shown only.
"""

import glob
import os

import pytest
from _code_blocks import ROOT, python_blocks, run_blocks

PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
PAGES_WITH_EXAMPLES = [page for page in PAGES if python_blocks(page)]


def test_the_pages_are_found():
  assert os.path.join(ROOT, "docs", "index.md") in PAGES


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda page: os.path.relpath(page, ROOT))
def test_page_python_examples_run(page, tmp_path):
  blocks = python_blocks(page)
  returncode, _, report = run_blocks(blocks, os.path.relpath(page, ROOT), cwd=tmp_path)
  assert returncode == 0, report


def test_python_blocks_run_in_order_in_one_process_and_py_blocks_are_shown_only(tmp_path):
  page = tmp_path / "page.md"
  page.write_text(
    "Text.\n\n```python\nanswer = 42\n```\n\n"
    "```py\nraise SystemExit('a py block is shown only')\n```\n\n"
    "```pycon\n>>> raise SystemExit\n```\n\n"
    "```python\nassert answer == 42\nprint('ran', answer)\n```\n"
  )
  blocks = python_blocks(str(page))
  assert blocks == ["answer = 42\n", "assert answer == 42\nprint('ran', answer)\n"]
  returncode, stdout, report = run_blocks(blocks, "page.md", cwd=tmp_path)
  assert returncode == 0 and "ran 42" in stdout, report


def test_a_failing_block_fails_and_says_where(tmp_path):
  blocks = ["x = 1\n", "y = x + 1\nraise ValueError('stale example')\n"]
  returncode, _, report = run_blocks(blocks, "page.md", cwd=tmp_path)
  assert returncode != 0 and "ValueError: stale example" in report
  assert "Failed at page.md, example 2 (its ```python block), line 2: raise ValueError" in report

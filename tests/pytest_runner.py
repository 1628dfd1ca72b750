"""Runs pytest on one test file; the entry point of every py_test in tests/BUILD."""

import os
import sys

import pytest


def main(argv):
  if len(argv) < 2:
    sys.exit("usage: pytest_runner.py TEST_FILE [PYTEST_ARGS...]")
  test_file = argv[1]
  # Bazel runs the test with the runfiles tree as working directory; make sibling helper modules
  # importable even if pytest's rootdir logic picks another base directory.
  sys.path.insert(0, os.path.dirname(os.path.abspath(test_file)))
  sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # helpers shared by all folders
  args = [test_file, "-q", "-p", "no:cacheprovider"] + argv[2:]
  # Bazel: write a JUnit report where the test XML goes, so failures show up per test case.
  xml = os.environ.get("XML_OUTPUT_FILE")
  if xml:
    args.append("--junitxml=" + xml)
  sys.exit(int(pytest.main(args)))


if __name__ == "__main__":
  main(sys.argv)

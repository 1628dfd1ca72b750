import os
import sys

# Helper modules at the top of tests/ (e.g. _keras_models.py) are importable from every folder,
# as tests/pytest_runner.py makes them under Bazel.
TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
  sys.path.append(TESTS)

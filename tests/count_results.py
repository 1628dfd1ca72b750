"""Prints 'N passed, M failed' over the test cases of the last `bazel test` (its JUnit files).

Usage: count_results.py TESTLOGS_DIR LABEL...   (the labels of the targets that ran)
"""

import os
import sys
import xml.etree.ElementTree as ElementTree


def main(testlogs, labels):
  passed = failed = 0
  for label in labels:
    path = os.path.join(testlogs, label.lstrip("/").replace(":", "/"), "test.xml")
    if not os.path.exists(path):
      failed += 1  # a target without a report did not run to the end
      continue
    for case in ElementTree.parse(path).iter("testcase"):
      if case.find("failure") is not None or case.find("error") is not None:
        failed += 1
      elif case.find("skipped") is None:
        passed += 1
  print(f"{passed} passed, {failed} failed")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])

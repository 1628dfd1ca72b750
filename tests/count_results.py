"""After `bazel test`: 'N passed, M failed' over the test cases of the targets that ran (their JUnit
files), then the slowest targets, so that a slow suite shows where its time goes.

Usage: count_results.py TESTLOGS_DIR BAZEL_LOG [SLOWEST]   (SLOWEST targets listed; default 15)
"""

import os
import re
import sys
import xml.etree.ElementTree as ElementTree

# Bazel's summary line of a target: "//tests:name   (cached) PASSED in 12.3s" (a sharded
# target's time is its slowest shard's; "FLAKY, failed in 1 out of 2 in 3.4s").
SUMMARY = re.compile(r"^(//\S+)\s+(\(cached\) )?([A-Z][A-Z ]*[A-Z])(.*)$", re.M)
SECONDS = re.compile(r"\bin ([0-9.]+)s\s*$")


def summaries(log_text):
  """{label: (status, seconds or None, cached)} of the targets the log reports."""
  found = {}
  for label, cached, status, rest in SUMMARY.findall(log_text):
    seconds = SECONDS.search(rest)
    found[label] = (status, float(seconds.group(1)) if seconds else None, bool(cached))
  return found


def count_cases(testlogs, labels):
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
  return passed, failed


def slowest(found, count):
  timed = [(s, label, status, cached) for label, (status, s, cached) in found.items() if s]
  return sorted(timed, reverse=True)[:count]


def main(testlogs, log_path, count=15):
  with open(log_path, errors="replace") as f:
    found = summaries(f.read())
  passed, failed = count_cases(testlogs, sorted(found))
  print(f"{passed} passed, {failed} failed")
  rows = slowest(found, count)
  if rows:
    print(f"slowest {len(rows)} targets:")
    for seconds, label, status, cached in rows:
      print(f"  {seconds:7.1f} s  {label} {'(cached) ' if cached else ''}{status}")


if __name__ == "__main__":
  if len(sys.argv) not in (3, 4):
    sys.exit(__doc__)
  main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))

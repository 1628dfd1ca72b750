"""The summary `make test` prints after `bazel test`: case counts from the JUnit files of the
targets the log names, and the slowest targets."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import count_results  # noqa: E402

LOG = """\
INFO: Build completed successfully, 12 total actions
//tests:fast                                                    (cached) PASSED in 2.0s
//tests:slow                                                             PASSED in 301.5s
  Stats over 4 runs: max = 301.5s, min = 20.1s, avg = 90.0s, dev = 10.0s
//tests:flaky                                FLAKY, failed in 1 out of 2 in 40.0s
//tests:broken                                                  FAILED TO BUILD
//tests:middle                                                           FAILED in 75.25s
Executed 3 out of 5 tests: 3 tests pass and 2 fail locally.
"""

CASES = "<testsuites><testsuite>{}</testsuite></testsuites>"


def write_report(testlogs, label, cases):
  folder = os.path.join(testlogs, label.lstrip("/").replace(":", "/"))
  os.makedirs(folder)
  with open(os.path.join(folder, "test.xml"), "w") as f:
    f.write(CASES.format(cases))


def test_counts_cases_and_lists_the_slowest_first(tmp_path, capsys):
  testlogs = str(tmp_path / "testlogs")
  write_report(testlogs, "//tests:fast", "<testcase/><testcase><skipped/></testcase>")
  write_report(testlogs, "//tests:slow", "<testcase/><testcase/>")
  write_report(testlogs, "//tests:flaky", "<testcase/>")
  write_report(testlogs, "//tests:middle", "<testcase><failure/></testcase><testcase/>")
  log = tmp_path / "bazel.log"
  log.write_text(LOG)
  count_results.main(testlogs, str(log), 3)
  lines = capsys.readouterr().out.splitlines()
  # 5 passed (the skipped case is neither); failed: one case, and the target that did not build.
  assert lines[0] == "5 passed, 2 failed"
  assert lines[1] == "slowest 3 targets:"
  assert [line.split()[2] for line in lines[2:]] == [
    "//tests:slow",
    "//tests:middle",
    "//tests:flaky",
  ]
  assert lines[2].split()[0] == "301.5" and lines[3].endswith("FAILED")


def test_a_cached_target_is_marked(tmp_path, capsys):
  testlogs = str(tmp_path)
  write_report(testlogs, "//tests:fast", "<testcase/>")
  log = tmp_path / "bazel.log"
  log.write_text(LOG.splitlines()[1] + "\n")
  count_results.main(testlogs, str(log))
  out = capsys.readouterr().out
  assert "1 passed, 0 failed" in out and "//tests:fast (cached) PASSED" in out

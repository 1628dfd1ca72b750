"""benchmarks/repeat.py: the median and range of a benchmark's ratios over fresh processes."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import repeat  # noqa: E402 (benchmarks/ is not a package)

REPORT = """\
ratios (wall keys/s of tf_ext over the baseline):
  tf_ext / dense gather                 :   0.85x  [0.85x]  (0.85x CPU)   target >= 0.6
  tf_ext / TFRA embedding_lookup        :   2.41x  [2.40x]
  PASS  tf_ext/dense_gather >= 0.6         measured 0.852
"""


def test_reads_every_ratio_line_and_nothing_else():
  assert repeat.ratios_of(REPORT) == {
    "tf_ext / dense gather": 0.85,
    "tf_ext / TFRA embedding_lookup": 2.41,
  }
  assert repeat.ratios_of("no ratios here\n  PASS  x >= 1 measured 2\n") == {}


def test_summary_gives_median_and_range_per_ratio():
  lines = repeat.summary([{"a / b": 0.8}, {"a / b": 0.9, "a / c": 2.0}, {"a / b": 0.85}])
  assert "median 0.85x, range 0.80x..0.90x over 3 runs" in lines[0]
  assert "median 2.00x, range 2.00x..2.00x over 1 runs" in lines[1]


def run_repeat(tmp_path, body, *args):
  script = tmp_path / "fake_bench.py"
  script.write_text(body)
  # repeat.py resolves the script under benchmarks/: give it the absolute path instead.
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "repeat.py"), *args, str(script)],
    capture_output=True,
    text=True,
    check=False,
  )


def test_runs_fresh_processes_and_prints_the_summary(tmp_path):
  body = "import os\nprint('  tf_ext / dense gather : %.2fx' % (0.7 + 0.1 * (os.getpid() % 2)))\n"
  proc = run_repeat(tmp_path, body, "--runs", "3")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.count("[repeat] run ") == 3
  assert "ratios over 3 runs" in proc.stdout and "over 3 runs (" in proc.stdout


def test_a_failing_run_or_a_script_without_ratios_is_an_error(tmp_path):
  failing = run_repeat(tmp_path, "import sys\nprint('boom')\nsys.exit(3)\n", "--runs", "2")
  assert failing.returncode == 3 and "run 1 failed (exit 3)" in failing.stderr
  silent = run_repeat(tmp_path, "print('nothing to summarize')\n", "--runs", "2")
  assert silent.returncode == 1 and "printed no" in silent.stderr
  bad = run_repeat(tmp_path, "print(1)\n", "--runs", "0")
  assert bad.returncode == 2 and "--runs must be at least 1" in bad.stderr

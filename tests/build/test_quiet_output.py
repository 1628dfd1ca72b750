"""`make demo` is quiet by default, and VERBOSE=1 brings TensorFlow's log back.

Runs the demo's make recipe itself (`-o build`: without its set-up and build prerequisites), in
the environment the Makefile gives it, on the files this test has (a checkout or Bazel's runfiles).
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A line of TensorFlow's C++ log: "2026-11-22 07:09:25.273087: E external/...] ...".
TF_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ", re.MULTILINE)


def make_demo(demo_args, *make_args):
  # The caller's log settings and make's own must not leak in: the Makefile decides.
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("TF_CPP_MIN_LOG_LEVEL", "VERBOSE", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
  }
  return subprocess.run(
    ["make", "--no-print-directory", "-o", "build", "demo", f"DEMO_ARGS={demo_args}"]
    + [f"VENV={sys.prefix}"]
    + list(make_args),
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=280,
  )


def test_the_quick_demo_prints_no_tensorflow_log():
  proc = make_demo("--quick")
  output = proc.stdout + proc.stderr
  assert proc.returncode == 0, output[-5000:]
  assert "AUC" in proc.stdout  # the demo ran
  assert not TF_LOG_LINE.findall(output), output[:5000]
  for noise in ("Unable to register", "TF-TRT Warning", "oneDNN custom operations"):
    assert noise not in output


def test_verbose_shows_the_full_log():
  # --help: importing TensorFlow is enough to print its start-up log.
  proc = make_demo("--help", "VERBOSE=1")
  assert proc.returncode == 0, proc.stderr[-5000:]
  assert "usage:" in proc.stdout
  assert "Unable to register cuDNN factory" in proc.stderr, proc.stderr[-5000:]
  # INFO and WARNING lines are back. Which ones depends on the CPU: oneDNN's notice comes only
  # where TensorFlow turns oneDNN on by default (CPUs with AVX-512 and up), not on AVX2 ones.
  info_or_warning = TF_LOG_LINE.pattern.replace("[IWEF]", "[IW]")
  assert re.search(info_or_warning, proc.stderr, re.MULTILINE), proc.stderr

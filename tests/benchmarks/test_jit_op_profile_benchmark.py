"""benchmarks/jit_op_profile.py profiles both workloads' steps at tiny shapes (no timing is
asserted) and rejects bad options."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "jit_op_profile.py")


def run(*args):
  return subprocess.run(
    [sys.executable, SCRIPT, *args],
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=280,
  )


def test_tiny_profile_splits_both_steps_into_matrix_products_and_other_ops():
  proc = run("--shapes-a=16", "--shapes-b=4x3", "--steps=3")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  for header in ("Workload A, shape 16", "Workload B, shape 4x3"):
    table = proc.stdout.split(header, 1)[1].split("Workload", 1)[0]
    for part in ("matrix products", "other ops"):
      # Both kinds of step were traced: each part took time in TensorFlow's kernels and in XLA.
      tf_us, xla_us = re.search(rf"{part}\s+(-?\d+)\s+(-?\d+)", table).groups()
      assert int(tf_us) > 0 and int(xla_us) > 0, table
    speed_ups = re.search(
      r"XLA alone (\d+\.\d\d)x; XLA clusters\s+between the matrix products \(jit_scope\) "
      r"(\d+\.\d\d)x; the best mix (\d+\.\d\d)x \((reaches|short of) 1\.3x\)",
      table,
    )
    assert speed_ups and all(float(x) > 0 for x in speed_ups.groups()[:3]), table


def test_bad_options_are_refused_with_their_name():
  for args, message in [
    (["--workloads=C"], "--workloads"),
    (["--shapes-b=128"], "bad shape '128'"),
    (["--shapes-a=0"], "bad shape '0'"),
    (["--shapes-b=12x"], "bad shape '12x'"),
    (["--steps=0"], "--steps must be >= 1"),
  ]:
    proc = run(*args)
    assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr[-2000:])

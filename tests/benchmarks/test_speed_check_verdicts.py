"""benchmarks/speed_check_verdicts.py runs, and on its seeded simulation the fitted-lines rule of
tf_ext.jit's speed check decides at least as well as the medians rule it replaced, and much better
where small calls' fixed cost misleads the medians (benchmark B's "keep compiling?")."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fitted_lines_decide_better_than_medians():
  script = os.path.join(ROOT, "benchmarks", "speed_check_verdicts.py")
  proc = subprocess.run(
    [sys.executable, script, "--checks", "300", "--seed", "1"],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {}
  for line in proc.stdout.splitlines():
    match = re.match(r"^(\S.*?)\s+([\d.]+)\s+([\d.]+)\s+(\d+) ->\s+(\d+)\s+(\d+) ->\s+(\d+)$", line)
    if match:
      rows[match.group(1)] = [int(match.group(k)) for k in (4, 5, 6, 7)]
  assert len(rows) == 7, proc.stdout
  for name, (medians_run, ours_run, medians_keep, ours_keep) in rows.items():
    assert ours_run >= medians_run - 5 and ours_keep >= medians_keep - 5, (name, proc.stdout)
  # A's first check (one bucket of 512): small calls' fixed cost made the medians misjudge it.
  assert rows["A, bucket 512, XLA 10 us/el"][1] >= rows["A, bucket 512, XLA 10 us/el"][0] + 10
  # B: XLA is not faster even unpadded; the medians per padded element kept compiling.
  for name in ("B, seq bucket 208", "B, seq buckets 76/208"):
    medians_keep, ours_keep = rows[name][2:]
    assert medians_keep <= 40 and ours_keep >= 70, (name, proc.stdout)

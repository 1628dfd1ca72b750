"""benchmarks/soak.py on a tiny setting: half a minute, killed with SIGKILL once (or more) and
restarted from its last link; its verdicts on rows and restores pass (the memory line needs the
long run and is not asserted). Each child is killed only after it wrote a link, so a slow or busy
machine still gets a restore to check."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
  "--minutes=0.5",
  "--kill-interval=10",
  "--day-samples=20000",
  "--ttl-steps=100",
  "--warmup-s=5",
  "--png=",
]


def _run(*options, timeout):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), *options],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_soak_survives_a_kill_and_loses_nothing(tmp_path):
  out = tmp_path / "soak.json"
  proc = _run(*TINY, f"--dir={tmp_path / 'run'}", f"--json={out}", timeout=240)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  lines = {line.split(":")[0].strip(): line for line in proc.stdout.splitlines() if ":" in line}
  assert "PASS" in lines["rows lost"] and lines["rows lost"].split(":")[1].split()[0] == "0"
  assert "PASS" in lines["restores"] and "PASS" in lines["AUC"] and "PASS" in lines["lookups"]
  results = json.loads(out.read_text())
  assert results["kills"] >= 1 and results["restores"] == results["restores_matched"] >= 1
  assert results["rows_lost"] == 0 and results["steps"] > 0
  events = [
    json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
  ]
  for killed in range(results["kills"]):
    assert any(e["kind"] == "save" and e["seg"] == killed for e in events), killed


def test_a_negative_kill_count_is_refused():
  proc = _run("--min-kills=-1", timeout=60)
  assert proc.returncode == 2 and "--min-kills must be >= 0" in proc.stderr

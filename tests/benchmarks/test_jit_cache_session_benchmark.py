"""benchmarks/jit_cache_session.py runs end to end on a tiny setting (no timing is asserted: its
targets are for the full run) and reports every configuration."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_benchmark(*args, **env):
  command = [sys.executable, os.path.join(ROOT, "benchmarks", "jit_cache_session.py"), *args]
  proc = subprocess.run(
    command,
    env=dict(os.environ, PYTHONPATH=ROOT, **env),
    capture_output=True,
    text=True,
    timeout=700,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  return proc


def test_jit_cache_session_tiny_run(tmp_path):
  out, png = tmp_path / "session.json", tmp_path / "session.png"
  proc = run_benchmark(
    "--quick", "--steps=6", f"--json={out}", f"--plot={png}", TF_EXT_JIT_MIN_OBSERVATIONS="2"
  )
  assert "ours vs xla_async" in proc.stdout and "steady state per sample" in proc.stdout
  assert png.exists() or "not written (No module named 'matplotlib'" in proc.stdout
  results = {r["config"]: r for r in json.loads(out.read_text())}
  assert set(results) == {"plain", "xla", "xla_async", "ours"}
  assert results["plain"]["compiles"] == 0  # no XLA without the clustering
  assert results["ours"]["buckets"] and results["ours"]["compiles"] <= 8
  for r in results.values():
    assert len(r["times"]) == 6 and r["total_s"] > 0


def test_rounds_report_each_configurations_median_run(tmp_path):
  out = tmp_path / "rounds.json"
  run_benchmark("--quick", "--steps=4", "--configs=plain,ours", "--rounds=3", f"--json={out}")
  saved = json.loads(out.read_text())
  assert [len(saved["rounds"][c]) for c in ("plain", "ours")] == [3, 3]
  for median in saved["median_runs"]:
    totals = sorted(r["total_s"] for r in saved["rounds"][median["config"]])
    assert median["total_s"] == totals[1]

"""benchmarks/alltoall_tables.py: --help works anywhere; a tiny run of the all-to-all tables on the
emulated cluster (2 network namespaces x 2 ranks, link uncapped) runs end to end and reports sane
figures. No timing is asserted (the issue's targets are for the full run). The run needs root and
`ip`/`tc`: skipped where they are missing."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "alltoall_tables.py")


def _skip_reason():
  if os.geteuid() != 0:
    return "needs root (network namespaces, veth, tc)"
  for tool in ("ip", "tc"):
    if shutil.which(tool) is None:
      return f"`{tool}` is not installed"
  probe = f"a2ab_probe_{os.getpid()}"
  if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
    return "cannot create network namespaces here"
  subprocess.run(["ip", "netns", "del", probe], capture_output=True)
  return None


def _run(tmp_path, *options, timeout):
  """Runs the script; past `timeout` it gets SIGTERM first, so it still removes its namespaces."""
  with subprocess.Popen(
    [sys.executable, SCRIPT, *options],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_EXT_CACHE_DIR=str(tmp_path / "cache")),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.terminate()
      stdout, stderr = proc.communicate(timeout=60)
      pytest.fail(f"no result after {timeout} s:\n{stdout}\n{stderr[-5000:]}")
  return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_help(tmp_path):
  proc = _run(tmp_path, "--help", timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert "--quick" in proc.stdout and "--rates" in proc.stdout


def test_tiny_run_of_the_alltoall_tables(tmp_path, monkeypatch):
  reason = _skip_reason()
  if reason:
    pytest.skip(reason)
  # With the table's per-key initial rows (and so tf_ext's owners), the TFRA program makes the
  # native program's updates; by default tf_ext.tfra follows TFRA's rows and owners instead.
  monkeypatch.setenv("TF_EXT_TFRA_INITIAL_ROWS", "per_key")
  out, png = tmp_path / "a2a.json", tmp_path / "a2a.png"
  proc = _run(
    tmp_path,
    "--configs=alltoall,tfra_api",
    "--rates=uncapped",
    "--rounds=1",
    "--batch=256",
    "--warmup=2",
    "--steps=2",
    "--day-samples=2000",
    "--native-rows=same",  # the TFRA program's rows for the native tables too
    f"--json={out}",
    f"--png={png}",
    # About 45 s alone; CI runs two test actions at once, and one may be as heavy as this.
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  assert "Targets (link uncapped" in proc.stdout, proc.stdout
  assert "AUC per day" in proc.stdout and "CPU features" in proc.stdout
  results = json.loads(out.read_text())
  row, compat = results["rows"]
  assert "error" not in row and "error" not in compat, results["rows"]
  # TFRA's program on tf_ext.tfra trains tf_ext's all-to-all tables with the same updates.
  assert compat["config"] == "tfra_api" and compat["table_rows"] == row["table_rows"]
  assert abs(compat["auc"] - row["auc"]) < 1e-3
  assert row["config"] == "alltoall" and row["rate"] == "uncapped"
  assert row["samples_per_s"] > 0
  # Ids of the other node's ranks cross the link; every rank holds a part of the table.
  assert all(b > 0 for b in row["link_bytes_per_step"])
  assert len(row["table_rows"]) == 4 and all(n > 0 for n in row["table_rows"])
  assert sum(row["table_rows"]) <= results["workload"]["distinct_ids"]
  assert 0.0 < row["auc"] < 1.0
  assert png.exists() or "not written" in proc.stdout

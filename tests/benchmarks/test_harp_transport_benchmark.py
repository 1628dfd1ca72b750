"""benchmarks/harp_transport.py --quick runs end to end: two network namespaces, both tc profiles,
HARP's plugin and the baseline plugin, every byte of the check pass verified. No timing is
asserted (the issue's targets are for the full run), only that the figures are sane. Needs root
(network namespaces) and `ip`/`tc`/g++: skipped where they are missing."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "harp_transport.py")
QUICK_SIZES = [64 * 1024, 1 << 20, 4 << 20]
_AGGREGATE_THROUGHPUT = "aggregate: throughput, messages >= 1 MiB (worst size)"


def _skip_reason():
  if os.geteuid() != 0:
    return "needs root (network namespaces, veth, tc)"
  for tool in ("ip", "tc", "g++"):
    if shutil.which(tool) is None:
      return f"`{tool}` is not installed"
  probe = f"harpb_probe_{os.getpid()}"
  if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
    return "cannot create network namespaces here"
  subprocess.run(["ip", "netns", "del", probe], capture_output=True)
  return None


def _run(tmp_path, *options):
  return subprocess.run(
    [sys.executable, SCRIPT, *options],
    env=dict(os.environ, PYTHONPATH=ROOT, TF_EXT_CACHE_DIR=str(tmp_path / "cache")),
    capture_output=True,
    text=True,
    timeout=240,
  )


def test_quick_run_of_both_plugins(tmp_path):
  reason = _skip_reason()
  if reason:
    pytest.skip(reason)
  out, png = tmp_path / "harp.json", tmp_path / "harp.png"
  proc = _run(tmp_path, "--quick", f"--json={out}", f"--plot={png}")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  assert "targets (issue 12; ratios harp/baseline" in proc.stdout, proc.stdout
  assert png.exists() or "not written (No module named 'matplotlib'" in proc.stdout
  results = json.loads(out.read_text())
  assert set(results["profiles"]) == {"aggregate", "cloud"}
  for profile, entry in results["profiles"].items():
    assert entry["check"]["one_flow_gbps"] > 0, profile
    assert set(entry["plugins"]) == {"harp", "baseline"}
    for name, result in entry["plugins"].items():
      assert result["ok"], f"{profile}/{name}: {result.get('error')}"
      data = result["data"]
      assert data["plugin_name"] == ("HARP" if name == "harp" else "BaselineSocket")
      assert sorted(int(s) for s in data["sizes"]) == QUICK_SIZES
      for size, figures in data["sizes"].items():
        assert figures["gbps"] > 0 and figures["cpu_ns_per_byte"] > 0, (profile, name, size)
        assert figures["bytes"] >= int(size)
        # The driving threads' part of the CPU: all of it for the thread-less baseline.
        driver, total = figures["driver_cpu_ns_per_byte"], figures["cpu_ns_per_byte"]
        assert 0 < driver <= total * 1.01, (profile, name, size, driver, total)
        if name == "baseline":
          assert driver >= 0.9 * total, (profile, size, driver, total)
        assert figures["sleeps_per_mib"] >= 0, (profile, name, size)
      # The check pass: every size, every byte (one message each in --quick) plus the ping-pongs.
      assert sorted(data["verified_sizes"]) == QUICK_SIZES
      assert data["bytes_in_check_pass"] == sum(QUICK_SIZES)
      assert data["verified_bytes"] >= sum(QUICK_SIZES)
      assert data["latency_us"]["median"] > 0 and data["latency_us"]["iters"] == 200
  # 8 streams where a per-flow cap makes two streams' port-bit collision matter; elsewhere HARP
  # runs at its defaults.
  assert results["settings"]["harp_env"] == {"cloud": {"HARP_NSTREAMS": "8"}, "aggregate": {}}
  # Throughput, CPU and latency for each profile, each with its verdict.
  assert len(results["targets"]) == 6
  assert all(t["ratio"] > 0 and isinstance(t["met"], bool) for t in results["targets"])
  # A miss that no transport could avoid (the baseline above 4 / 1.2 Gbit/s) says so.
  aggregate_throughput = next(t for t in results["targets"] if t["what"] == _AGGREGATE_THROUGHPUT)
  baseline = results["profiles"]["aggregate"]["plugins"]["baseline"]["data"]["sizes"]
  baseline_gbps = min(d["gbps"] for size, d in baseline.items() if int(size) >= 1 << 20)
  unreachable = not aggregate_throughput["met"] and baseline_gbps * 1.2 > 4
  assert ("no transport can: the baseline moves" in proc.stdout) == unreachable, proc.stdout
  # Nothing left behind.
  netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  assert "harpb_" not in netns


def _quick_aggregate_run(tmp_path, *options):
  """A --quick run of the aggregate profile with `options`, both plugins' check pass complete:
  (its output, its JSON results)."""
  reason = _skip_reason()
  if reason:
    pytest.skip(reason)
  out = tmp_path / "harp.json"
  proc = _run(tmp_path, "--quick", "--profiles=aggregate", *options, f"--json={out}")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
  results = json.loads(out.read_text())
  for name, result in results["profiles"]["aggregate"]["plugins"].items():
    assert result["ok"], f"{name}: {result.get('error')}"
    assert result["data"]["bytes_in_check_pass"] == sum(QUICK_SIZES), name
    assert sorted(result["data"]["verified_sizes"]) == QUICK_SIZES, name
  return proc.stdout, results


def test_channels_split_every_message_and_check_every_part(tmp_path):
  """--channels 3: three data connections per plugin, each message cut into three parts (64 KiB
  does not divide by 3, so the parts differ by a byte); the driver checks every part's bytes and
  reported size, so a wrong split or a part lost on one connection fails the run."""
  stdout, results = _quick_aggregate_run(tmp_path, "--channels=3")
  assert "3 channel(s) of 8 outstanding chunks" in stdout, stdout
  assert results["settings"]["channels"] == 3


def test_an_uncapped_link_runs_without_a_qdisc(tmp_path):
  """--aggregate-rate none: the aggregate profile with no tc qdisc at all (the veth is the link)."""
  stdout, results = _quick_aggregate_run(tmp_path, "--aggregate-rate=none")
  assert "(no cap: the veth alone)" in stdout, stdout
  assert results["settings"]["aggregate_rate"] == "none"
  # The cloud profile caps the aggregate: it needs a rate.
  proc = _run(tmp_path, "--quick", "--aggregate-rate=none")
  assert proc.returncode == 2 and "--aggregate-rate none" in proc.stderr, proc.stderr


def test_bad_channel_counts_are_refused(tmp_path):
  for bad in ("0", "65"):
    proc = _run(tmp_path, "--quick", f"--channels={bad}")
    assert proc.returncode == 2 and "--channels" in proc.stderr, (bad, proc.stderr)

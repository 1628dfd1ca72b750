"""One plugin pair of harp_transport.py: the C++ it compiles (the driver, the baseline plugin),
HARP's plugin found, the settings of each side, both driver processes run in their namespaces,
their output parsed, and the rounds merged (medians)."""

import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from _common import REPO

HERE = os.path.dirname(os.path.abspath(__file__))
BASELINE_SOURCE = os.path.join(HERE, "harp_baseline", "socket_baseline_plugin.cc")
DRIVER_SOURCE = os.path.join(HERE, "harp_baseline", "transport_bench.cc")
ABI_HEADER = os.path.join(REPO, "kernels", "harp", "core", "nccl_net_abi.h")
MIB = 1024 * 1024
# Per profile; elsewhere HARP runs at its defaults (4 streams: 8 cost more CPU per byte at
# 100 Gbit/s, 1.13x the baseline's against 1.07x, docs/benchmarks.md).
HARP_PROFILE_ENV = {"cloud": {"HARP_NSTREAMS": "8"}}


def cache_dir():
  base = os.environ.get("TF_EXT_CACHE_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "tf_ext"
  )
  return os.path.join(base, "harp_bench")


def compile_cc(source, output_name, shared):
  """g++ -O2 of `source` (with the ABI header) into the cache, keyed by the sources' hash."""
  digest = hashlib.sha256()
  for path in (source, ABI_HEADER):
    with open(path, "rb") as f:
      digest.update(f.read())
  digest.update(b"shared" if shared else b"exe")
  folder = os.path.join(cache_dir(), digest.hexdigest()[:16])
  out = os.path.join(folder, output_name)
  if os.path.exists(out):
    return out
  os.makedirs(folder, exist_ok=True)
  tmp = f"{out}.{os.getpid()}.tmp"
  cmd = ["g++", "-O2", "-std=c++17", "-pthread", f"-I{REPO}", source, "-o", tmp, "-ldl"]
  if shared:
    cmd[1:1] = ["-shared", "-fPIC"]
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode != 0:
    raise SystemExit(f"compiling {source} failed:\n{proc.stderr}")
  os.replace(tmp, out)
  return out


def harp_plugin_path(explicit):
  """--harp-plugin, else what tf_ext.harp.plugin_path() returns: the library beside the tf_ext
  package this checkout (or the environment) provides. Found without importing tf_ext (whose
  __init__ imports TensorFlow)."""
  if explicit:
    return explicit
  folders = [os.path.join(REPO, "tf_ext")]
  spec = importlib.util.find_spec("tf_ext")
  if spec is not None and spec.submodule_search_locations:
    folders += list(spec.submodule_search_locations)
  for folder in folders:
    path = os.path.join(folder, "harp", "libnccl-net-harp.so")
    if os.path.exists(path):
      return path
  raise SystemExit(
    f"harp_transport: HARP's plugin is not built ({folders[0]}/harp/libnccl-net-harp.so): run "
    "`make build`, pass --harp-plugin PATH, or --plugins baseline,baseline2"
  )


def harp_env(profile, args):
  """The HARP_* settings of a run on `profile` (without HARP_IFNAME, the namespace's veth)."""
  return {**HARP_PROFILE_ENV.get(profile, {}), **args.harp_env}


def plugin_env(name, link, side, args, profile):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("HARP_", "NCCL_"))}
  if name.startswith("harp"):
    env.update(harp_env(profile, args))
    env["HARP_IFNAME"] = link.ifname[side]
  else:
    env["NCCL_SOCKET_IFNAME"] = link.ifname[side]
  return env


def run_pair(link, name, plugin, driver, args, profile):
  """Both driver processes for one plugin; (parsed result, error text or None)."""
  workdir = tempfile.mkdtemp(prefix="harp_bench_")
  sizes = ",".join(str(s) for s in args.sizes)
  common = [str(args.bytes_per_size), str(args.min_messages), str(args.latency_iters)]
  common += [str(args.verify_messages), str(args.channels)]
  procs = {}
  try:
    for side, role in ((1, "recv"), (0, "send")):
      procs[role] = link.popen(
        side,
        [driver, plugin, role, workdir, sizes] + common,
        env=plugin_env(name, link, side, args, profile),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
    outputs, deadline = {}, time.monotonic() + args.pair_timeout
    for role, proc in procs.items():
      try:
        outputs[role] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        link.kill_all()
        return None, f"{role} side did not finish within {args.pair_timeout:.0f} s"
    errors = []
    for role, proc in procs.items():
      out, err = outputs[role]
      if proc.returncode != 0:
        failed = [line for line in out.splitlines() if line.startswith("FAILED")]
        detail = failed[-1] if failed else (err.strip().splitlines() or ["no output"])[-1]
        # The plugin's own account of the failure (its warnings), which a bare status code lacks.
        warnings = [line for line in err.splitlines() if line.startswith("plugin warning:")]
        if warnings:
          detail += f" ({warnings[0]})"
        errors.append(f"{role} side exited {proc.returncode}: {detail}")
    if errors:
      return None, "; ".join(errors)
    return parse_pair(outputs["recv"][0], outputs["send"][0]), None
  finally:
    link.procs = [p for p in link.procs if p.poll() is None]
    shutil.rmtree(workdir, ignore_errors=True)


def parse_pair(recv_out, send_out):
  lines = {"recv": [], "send": []}
  for role, out in (("recv", recv_out), ("send", send_out)):
    lines[role] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  timed = {r: {e["size"]: e for e in lines[r] if e["kind"] == "timed"} for r in lines}
  sizes = {}
  for size, rx in timed["recv"].items():
    tx = timed["send"][size]
    sizes[size] = {
      "bytes": rx["bytes"],
      "seconds": rx["seconds"],
      "gbps": rx["bytes"] * 8 / rx["seconds"] / 1e9,
      "cpu_s": rx["cpu_s"] + tx["cpu_s"],
      "cpu_ns_per_byte": (rx["cpu_s"] + tx["cpu_s"]) / rx["bytes"] * 1e9,
      # The two driving threads alone (NCCL's proxy threads' part); the rest is the plugin's.
      "driver_cpu_ns_per_byte": (rx["driver_cpu_s"] + tx["driver_cpu_s"]) / rx["bytes"] * 1e9,
      # How often the two processes' threads slept and were woken (each wake-up costs CPU).
      "sleeps_per_mib": (rx["sleeps"] + tx["sleeps"]) / (rx["bytes"] / MIB),
    }
  latency = next(e for e in lines["send"] if e["kind"] == "latency")
  rtt = latency["rtt_us"]
  done = {r: next(e for e in lines[r] if e["kind"] == "done") for r in lines}
  verified = [e for e in lines["recv"] if e["kind"] == "verify"]
  plugin = next(e for e in lines["recv"] if e["kind"] == "plugin")
  return {
    "plugin_name": plugin["name"],
    "device": plugin["device"],
    "sizes": sizes,
    "latency_us": {
      "median": statistics.median(rtt) / 2,
      "p99": rtt[min(len(rtt) - 1, int(0.99 * len(rtt)))] / 2,
      "iters": len(rtt),
    },
    "verified_bytes": done["recv"]["verified_bytes"] + done["send"]["verified_bytes"],
    "verified_sizes": [e["size"] for e in verified],
    "bytes_in_check_pass": sum(e["bytes"] for e in verified),
  }


def merge_rounds(rounds):
  """Median per size (throughput, CPU) and of the latency medians over the rounds."""
  first = rounds[0]
  merged = dict(first)
  merged["rounds"] = len(rounds)
  merged["sizes"] = {}
  for size in first["sizes"]:
    per = [r["sizes"][size] for r in rounds]
    merged["sizes"][size] = {
      "gbps": statistics.median(p["gbps"] for p in per),
      "cpu_ns_per_byte": statistics.median(p["cpu_ns_per_byte"] for p in per),
      "driver_cpu_ns_per_byte": statistics.median(p["driver_cpu_ns_per_byte"] for p in per),
      "sleeps_per_mib": statistics.median(p["sleeps_per_mib"] for p in per),
      "gbps_rounds": [p["gbps"] for p in per],
      "bytes": per[0]["bytes"],
    }
  merged["latency_us"] = {
    "median": statistics.median(r["latency_us"]["median"] for r in rounds),
    "p99": statistics.median(r["latency_us"]["p99"] for r in rounds),
    "iters": sum(r["latency_us"]["iters"] for r in rounds),
  }
  if "flow_classes_used" in first:
    merged["flow_classes_used"] = [r["flow_classes_used"] for r in rounds]
  merged["verified_bytes"] = sum(r["verified_bytes"] for r in rounds)
  merged["bytes_in_check_pass"] = sum(r["bytes_in_check_pass"] for r in rounds)
  return merged

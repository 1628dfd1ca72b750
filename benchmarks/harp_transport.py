#!/usr/bin/env python3
"""HARP against a stand-in for NCCL's default socket transport, across two network namespaces.

Needs root (network namespaces, a veth pair, tc qdiscs), `ip`, `tc` and g++. Issue 12, section 4.

What runs: benchmarks/harp_baseline/transport_bench.cc (compiled here with g++ into a cache
folder), one process per namespace, dlopens an NCCL net plugin and drives its ncclNetPlugin_v8
table as NCCL's proxy thread does. The plugins:
  harp      tf_ext/harp/libnccl-net-harp.so (tf_ext.harp.plugin_path(); built by `make build`)
  baseline  benchmarks/harp_baseline/socket_baseline_plugin.cc (compiled here): NCCL's built-in
            socket transport as it runs by default (one socket per connection, no helper threads,
            progress inside test(), 64 KiB minimum task size), written for this benchmark.

Topology (names unique to this run; removed on exit, Ctrl-C or error):

    netns harpb_<pid>_s  (sender)                  netns harpb_<pid>_r  (receiver)
    hb<pid>s 10.78.0.1/24  <====== veth, tc on both egresses ======>  hb<pid>r 10.78.0.2/24

Profiles (the same qdisc on both veth ends, so both directions of every connection are shaped):
  aggregate  tbf --aggregate-rate (default 4gbit): one cap for everything. With
             --aggregate-rate none, no qdisc at all: the veth is the link, as fast as the CPUs
             move data (for telling a transport's cost from that of tbf's one lock, which every
             sending thread takes).
  cloud      htb: a root class at --aggregate-rate; under it --flow-classes (default 64) leaf
             classes of rate aggregate/(classes+1) and ceil --flow-rate (default 1gbit), and a
             default leaf (ceil: the aggregate) for everything else. A u32 filter per leaf sends
             a TCP packet to the leaf selected by bits 1..6 of its source port (`match ip sport
             (i << 1) 0x7e`). Bit 0 is skipped: Linux prefers even ephemeral ports for connect(),
             so it is nearly always 0. Data flows from the side that called connect(), so every
             data stream is capped at --flow-rate as long as no two streams share those port
             bits (1/64 per pair: a collision halves those two streams, as an unlucky hash would
             on a real VPC); the aggregate stays capped.
The script checks each profile with a tiny Python TCP test: one flow must measure near the
per-flow cap (cloud) or the aggregate cap (aggregate, when the machine can reach it).

Measured, per profile and plugin, in one run (plugins alternate per round, --rounds rounds,
the median is reported):
  - throughput for message sizes 64 KiB ... 64 MiB, NCCL-like pipelining: each message as chunks
    of min(S, clamp(S/8, 512 KiB, 4 MiB)) bytes with 8 outstanding, --bytes-per-size per size;
    with --channels N, as NCCL's N channels: N data connections, each carrying 1/N of every
    message through its own window of 8 (chunks sized by its part), all of them progressed by the
    driver's one thread, as NCCL's proxy thread progresses every channel's connection;
  - CPU time per byte: getrusage(RUSAGE_SELF) of both processes (all threads: the plugin's own
    workers included) over the timed transfer, divided by the bytes;
  - latency: --latency-iters 8-byte ping-pongs (median and p99 of half the round trip);
  - first, a check pass: every byte of every chunk of every size compared with its pattern, every
    reported size checked (receives posted larger than the chunk); ping-pong replies are checked.
Ratios are HARP/baseline of the same run. Targets (issue 12; informational, exit status 0):
cloud-like profile HARP >= 3x the baseline's throughput for messages >= 1 MiB; aggregate-only
>= 1.2x (also for >= 1 MiB); CPU per byte <= 1.1x; 8-byte latency <= 1.2x.

HARP's settings: HARP_IFNAME is the namespace's veth (its address is what HARP listens on);
otherwise the plugin's defaults, but for HARP_NSTREAMS=8 on the cloud profile (more streams than
aggregate / per-flow cap, so that a port-bit collision of two streams does not decide the
result); --harp-env NAME=VALUE overrides or adds any HARP_* setting, on every profile. The
baseline reads NCCL_SOCKET_IFNAME (the veth).

  make bench-harp                              # sudo when not root
  make bench-harp BENCH_ARGS=--quick           # seconds: small sizes, few bytes
  sudo .venv/bin/python benchmarks/harp_transport.py --aggregate-rate 2gbit --flow-rate 500mbit
  sudo .venv/bin/python benchmarks/harp_transport.py --plugins baseline,baseline2  # self-check
"""

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import _common

REPO = _common.REPO
HERE = os.path.dirname(os.path.abspath(__file__))
BASELINE_SOURCE = os.path.join(HERE, "harp_baseline", "socket_baseline_plugin.cc")
DRIVER_SOURCE = os.path.join(HERE, "harp_baseline", "transport_bench.cc")
ABI_HEADER = os.path.join(REPO, "kernels", "harp", "core", "nccl_net_abi.h")
SUBNET = "10.78.0"
KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [64 * KIB, MIB, 4 * MIB]
# Per profile; elsewhere HARP runs at its defaults (4 streams: 8 cost more CPU per byte at
# 100 Gbit/s, 1.13x the baseline's against 1.07x, docs/benchmarks.md).
HARP_PROFILE_ENV = {"cloud": {"HARP_NSTREAMS": "8"}}
CPU_FLAGS = ("sse4_2", "avx", "avx2", "avx512f", "pclmulqdq", "aes", "erms", "fsrm", "constant_tsc")
TARGETS = {"cloud": 3.0, "aggregate": 1.2}
CPU_TARGET, LATENCY_TARGET = 1.1, 1.2
BIG = MIB  # throughput targets apply to messages of at least this size


# --------------------------------------------------------------------------------------- building


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


# -------------------------------------------------------------------------------------- the link


def sh(cmd, check=True):
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if check and proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
  return proc


def parse_rate(text):
  """tc rate text ("4gbit", "500mbit", "100kbit", "1000000bit") -> bits/s."""
  text = text.strip().lower()
  for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
    if text.endswith(suffix):
      return float(text[: -len(suffix)]) * scale
  return float(text)


class Link:
  """Two namespaces joined by a veth pair; apply(profile) (re)places the qdiscs on both ends."""

  def __init__(self, tag):
    self.netns = [f"harpb_{tag}_s", f"harpb_{tag}_r"]
    self.ifname = [f"hb{tag}s"[:15], f"hb{tag}r"[:15]]
    self.addr = [f"{SUBNET}.1", f"{SUBNET}.2"]
    self.created = []
    self.procs = []

  def setup(self):
    for ns in self.netns:
      sh(["ip", "netns", "add", ns])
      self.created.append(ns)
      sh(["ip", "-n", ns, "link", "set", "lo", "up"])
    sh(
      ["ip", "link", "add", self.ifname[0], "netns", self.netns[0], "type", "veth"]
      + ["peer", "name", self.ifname[1], "netns", self.netns[1]]
    )
    for ns, ifname, addr in zip(self.netns, self.ifname, self.addr):
      sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
      sh(["ip", "-n", ns, "link", "set", ifname, "up"])

  def apply(self, profile, args):
    for ns, ifname in zip(self.netns, self.ifname):
      sh(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
      for cmd in profile_commands(profile, ifname, args):
        sh(["tc", "-n", ns] + cmd)

  def class_bytes(self, side=0):
    """Bytes sent per htb leaf class on one veth end ({classid: bytes}; empty under tbf)."""
    out = sh(["tc", "-n", self.netns[side], "-s", "class", "show", "dev", self.ifname[side]])
    counts, classid = {}, None
    for line in out.stdout.splitlines():
      words = line.split()
      if words[:2] == ["class", "htb"]:
        classid = words[2]
      elif words[:1] == ["Sent"] and classid is not None:
        counts[classid] = int(words[1])
        classid = None
    return counts

  def popen(self, side, argv, env, **kwargs):
    proc = subprocess.Popen(
      ["ip", "netns", "exec", self.netns[side]] + argv,
      env=env,
      start_new_session=True,
      **kwargs,
    )
    self.procs.append(proc)
    return proc

  def kill_all(self):
    for proc in self.procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signal.SIGKILL)  # the session created for it
        except ProcessLookupError:
          pass
        proc.wait()
    self.procs = []

  def close(self):
    self.kill_all()
    for ns in self.created:
      sh(["ip", "netns", "del", ns], check=False)
    self.created = []


def profile_commands(profile, ifname, args):
  """The tc commands (after `tc -n NS`) that shape egress of `ifname` as `profile`."""
  if args.aggregate_rate == "none":
    return []  # the aggregate profile without a cap (parse_args refuses cloud)
  aggregate = parse_rate(args.aggregate_rate)
  # A burst of about 1 ms at the rate, at least 256 KiB: veth hands tc 64 KiB GSO packets.
  burst = max(256 * KIB, int(aggregate / 8 / 1000))
  if profile == "aggregate":
    return [
      ["qdisc", "add", "dev", ifname, "root", "handle", "1:", "tbf"]
      + ["rate", args.aggregate_rate, "burst", str(burst), "latency", "20ms"]
    ]
  classes = args.flow_classes
  mask = (classes - 1) << 1
  flow_rate_bps = parse_rate(args.flow_rate)
  flow_burst = max(128 * KIB, int(flow_rate_bps / 8 / 1000))
  guarantee = f"{max(1, int(aggregate / (classes + 1) / 1000))}kbit"
  cmds = [
    ["qdisc", "add", "dev", ifname, "root", "handle", "1:", "htb", "default", "ffff"],
    ["class", "add", "dev", ifname, "parent", "1:", "classid", "1:1", "htb"]
    + ["rate", args.aggregate_rate, "ceil", args.aggregate_rate]
    + ["burst", str(burst), "cburst", str(burst)],
    ["class", "add", "dev", ifname, "parent", "1:1", "classid", "1:ffff", "htb"]
    + ["rate", guarantee, "ceil", args.aggregate_rate, "burst", str(burst), "cburst", str(burst)],
  ]
  for i in range(classes):
    classid = f"1:{i + 16:x}"
    cmds.append(
      ["class", "add", "dev", ifname, "parent", "1:1", "classid", classid, "htb"]
      + ["rate", guarantee, "ceil", args.flow_rate]
      + ["burst", str(flow_burst), "cburst", str(flow_burst)]
    )
    cmds.append(
      ["filter", "add", "dev", ifname, "parent", "1:", "protocol", "ip", "prio", "1", "u32"]
      + ["match", "ip", "protocol", "6", "0xff"]
      + ["match", "ip", "sport", str(i << 1), f"0x{mask:04x}", "flowid", classid]
    )
  return cmds


# A receiver that counts bytes for a fixed time after the first one; its Gbit/s on stdout.
FLOW_SERVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8)
print("listening", flush=True)
conns = [s.accept()[0] for _ in range(int(sys.argv[4]))]
for c in conns: c.setblocking(False)
buf = bytearray(1 << 20); total = 0; start = None; duration = float(sys.argv[3])
while start is None or time.perf_counter() - start < duration:
  for c in conns:
    try:
      n = c.recv_into(buf)
    except BlockingIOError:
      continue
    if n and start is None: start = time.perf_counter()
    total += n
print(total * 8 / (time.perf_counter() - start) / 1e9, flush=True)
"""
FLOW_CLIENT = """
import socket, sys, time
socks = [socket.create_connection((sys.argv[1], int(sys.argv[2]))) for _ in range(int(sys.argv[4]))]
data = b"x" * (1 << 20); end = time.perf_counter() + float(sys.argv[3]) + 1.0
for s in socks: s.setblocking(False)
while time.perf_counter() < end:
  for s in socks:
    try:
      s.send(data)
    except (BlockingIOError, BrokenPipeError, ConnectionResetError):
      pass
"""


def measure_flows(link, flows, seconds, port):
  """Gbit/s that `flows` parallel TCP streams from the sender namespace reach in `seconds`."""
  py = sys.executable
  server = link.popen(
    1,
    [py, "-c", FLOW_SERVER, link.addr[1], str(port), str(seconds), str(flows)],
    env=dict(os.environ),
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    if server.stdout.readline().strip() != "listening":
      raise RuntimeError("the flow test's receiver did not start")
    client = link.popen(
      0,
      [py, "-c", FLOW_CLIENT, link.addr[1], str(port), str(seconds), str(flows)],
      env=dict(os.environ),
      stderr=subprocess.DEVNULL,
    )
    out, _ = server.communicate(timeout=seconds + 30)
    client.wait(timeout=30)
    return float(out.strip().splitlines()[-1])
  finally:
    link.kill_all()


def check_profile(link, profile, args):
  """Single-flow (and, for cloud, multi-flow) rates; a warning when the shaping looks wrong."""
  seconds = 0.4 if args.quick else 1.5
  one = measure_flows(link, 1, seconds, 17001)
  check = {"one_flow_gbps": one}
  if args.aggregate_rate == "none":
    check.update(expected_one_flow_gbps=None, ok=True)
    print(f"profile check: {profile:9s} 1 TCP flow {one:.2f} Gbit/s (no cap: the veth alone)")
    return check
  aggregate, flow = parse_rate(args.aggregate_rate) / 1e9, parse_rate(args.flow_rate) / 1e9
  if profile == "cloud":
    check["expected_one_flow_gbps"] = flow
    check["ok"] = 0.6 * flow <= one <= 1.15 * flow
    line = f"1 TCP flow {one:.2f} Gbit/s (per-flow cap {flow:g})"
  else:
    check["expected_one_flow_gbps"] = aggregate
    check["ok"] = one <= 1.15 * aggregate
    line = f"1 TCP flow {one:.2f} Gbit/s (aggregate cap {aggregate:g})"
    if one < 0.6 * aggregate:
      line += ": this machine cannot fill the cap with one flow"
  print(f"profile check: {profile:9s} {line}{'' if check['ok'] else '  WARNING: off'}")
  return check


# ------------------------------------------------------------------------------- one plugin pair


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


# ---------------------------------------------------------------------------------- the report


def human(size):
  return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def report_profile(profile, results, names):
  print()
  print(f"== profile {profile} ==")
  header = f"{'size':>8s}"
  for n in names:
    header += f" {n + ' Gbit/s':>17s} {n + ' ns/B':>15s}"
  if len(names) == 2:
    header += f" {'tput ratio':>10s} {'CPU ratio':>9s}"
  print(header)
  ok_names = [n for n in names if results.get(n, {}).get("ok")]
  sizes = sorted({s for n in ok_names for s in results[n]["data"]["sizes"]})
  for size in sizes:
    line = f"{human(size):>8s}"
    for n in names:
      data = results.get(n, {}).get("data")
      if data and size in data["sizes"]:
        d = data["sizes"][size]
        line += f" {d['gbps']:17.3f} {d['cpu_ns_per_byte']:15.3f}"
      else:
        line += f" {'-':>17s} {'-':>15s}"
    if len(names) == 2 and len(ok_names) == 2:
      a, b = (results[n]["data"]["sizes"][size] for n in names)
      line += f" {a['gbps'] / b['gbps']:10.2f} {a['cpu_ns_per_byte'] / b['cpu_ns_per_byte']:9.2f}"
    print(line)
  for n in names:
    r = results.get(n, {})
    if r.get("ok"):
      figures = sorted(r["data"]["sizes"].items())
      print(
        f"{n:>8s}: CPU in the driving threads (as NCCL's proxy; the rest in the plugin's): "
        + ", ".join(
          f"{human(s)} {d['driver_cpu_ns_per_byte'] / d['cpu_ns_per_byte']:.0%}" for s, d in figures
        )
      )
      print(
        f"{n:>8s}: threads put to sleep (woken later) per MiB moved, both sides: "
        + ", ".join(f"{human(s)} {d['sleeps_per_mib']:.2f}" for s, d in figures)
      )
      lat = r["data"]["latency_us"]
      print(
        f"{n:>8s}: 8-byte latency {lat['median']:.1f} us median, {lat['p99']:.1f} us p99 "
        f"(half round trip, {lat['iters']} ping-pongs); {r['data']['verified_bytes']:,} bytes "
        f"verified"
        + (
          f"; per-flow classes used per round: {r['data']['flow_classes_used']}"
          if "flow_classes_used" in r["data"]
          else ""
        )
      )
    else:
      print(f"{n:>8s}: FAILED: {r.get('error')}")


def verdicts(profile, results, names):
  """The issue's targets for this profile: a list of (name, ratio or None, target, met)."""
  if len(names) != 2 or not all(results.get(n, {}).get("ok") for n in names):
    return []
  a, b = (results[n]["data"] for n in names)
  big = [s for s in a["sizes"] if s >= BIG and s in b["sizes"]]
  out = []
  if big:
    worst = min(a["sizes"][s]["gbps"] / b["sizes"][s]["gbps"] for s in big)
    out.append((f"{profile}: throughput, messages >= 1 MiB (worst size)", worst, TARGETS[profile]))
    cpu = max(a["sizes"][s]["cpu_ns_per_byte"] / b["sizes"][s]["cpu_ns_per_byte"] for s in big)
    out.append((f"{profile}: CPU per byte, messages >= 1 MiB (worst size)", cpu, CPU_TARGET))
  lat = a["latency_us"]["median"] / b["latency_us"]["median"]
  out.append((f"{profile}: 8-byte latency (median)", lat, LATENCY_TARGET))
  return out


def unreachable_throughput(profile, baseline, target, args):
  """Why no transport could meet `target` on this aggregate cap, or None: the baseline already
  moves more than cap / target."""
  if profile != "aggregate" or args.aggregate_rate == "none":
    return None
  cap = parse_rate(args.aggregate_rate) / 1e9
  moved = min(d["gbps"] for size, d in baseline["sizes"].items() if size >= BIG)
  if moved * target <= cap:
    return None
  return (
    f"no transport can: the baseline moves {moved:.2f} of the {cap:g} Gbit/s cap. A cap that one "
    f"flow cannot fill shows the difference, e.g. --aggregate-rate 100gbit --channels 2 "
    f"(docs/benchmarks.md, HARP at 100 Gbit/s)."
  )


def draw_chart(path, all_results, names, args):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [3, 3, 2]})
  bars = []
  styles = {0: "-", 1: "--"}
  for p_index, (profile, results) in enumerate(all_results.items()):
    for n_index, n in enumerate(names):
      r = results.get(n, {})
      if not r.get("ok"):
        continue
      sizes = sorted(r["data"]["sizes"])
      x = [s / MIB for s in sizes]
      label = f"{n} ({profile})"
      color = f"C{n_index}"
      for ax, key in zip(axes, ("gbps", "cpu_ns_per_byte")):
        ax.plot(
          x,
          [r["data"]["sizes"][s][key] for s in sizes],
          styles[p_index % 2],
          marker="o",
          color=color,
          label=label,
        )
      # The driving threads' part of the CPU, where the plugin's own threads took a share.
      figures = [r["data"]["sizes"][s] for s in sizes]
      if any(f["driver_cpu_ns_per_byte"] < 0.98 * f["cpu_ns_per_byte"] for f in figures):
        axes[1].plot(
          x,
          [f["driver_cpu_ns_per_byte"] for f in figures],
          ":",
          marker=".",
          color=color,
          label=f"{label}: driving threads only",
        )
      bars.append((f"{n}\n{profile}", r["data"]["latency_us"]["median"], color))
  all_sizes = sorted(args.sizes)
  for ax, title in zip(axes, ("throughput (Gbit/s)", "CPU time per byte (ns, both processes)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks([s / MIB for s in all_sizes], [human(s) for s in all_sizes])
    ax.set_xlabel("message size")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
  axes[2].bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
  axes[2].set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
  axes[2].set_ylim(bottom=0)
  axes[2].set_title("8-byte latency, median half round trip (us)")
  axes[2].grid(True, axis="y", alpha=0.3)
  fig.suptitle(
    f"HARP vs NCCL-default-socket stand-in over veth, {args.channels} channel(s): aggregate "
    + ("uncapped" if args.aggregate_rate == "none" else args.aggregate_rate)
    + (f", cloud = aggregate + {args.flow_rate} per flow" if "cloud" in all_results else "")
  )
  _common.save_figure(fig, plt, path, dpi=110)


# ----------------------------------------------------------------------------------------- main


def parse_args(argv):
  p = _common.argument_parser(__doc__)
  p.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few bytes")
  p.add_argument("--profiles", default="aggregate,cloud", help="aggregate and/or cloud")
  p.add_argument("--plugins", default="harp,baseline", help="two of harp, baseline (or one)")
  p.add_argument("--harp-plugin", help="HARP's library (default: tf_ext.harp.plugin_path())")
  p.add_argument(
    "--harp-env",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="a HARP_* setting for HARP's processes (repeatable)",
  )
  p.add_argument("--aggregate-rate", default="4gbit", help="tc rate of the aggregate cap")
  p.add_argument("--flow-rate", default="1gbit", help="tc rate of the per-flow cap (cloud)")
  p.add_argument("--flow-classes", type=int, default=64, help="per-flow htb classes (power of 2)")
  p.add_argument("--sizes", help="message sizes in bytes, comma-separated (default 64K..64M x4)")
  p.add_argument("--bytes-per-size", type=int, help="bytes per size in the timed pass")
  p.add_argument("--min-messages", type=int, default=4, help="messages per size, at least")
  p.add_argument("--latency-iters", type=int, help="8-byte ping-pongs")
  p.add_argument("--verify-messages", type=int, help="messages per size in the check pass")
  p.add_argument("--rounds", type=int, help="rounds per profile (plugins alternate first)")
  p.add_argument(
    "--channels",
    type=int,
    default=1,
    help="data connections, as NCCL's channels: each message split over them, all progressed by "
    "the driver's one thread (NCCL opened 2 on the GPU machines here)",
  )
  p.add_argument("--pair-timeout", type=float, default=600, help="seconds for one plugin pair")
  p.add_argument("--no-profile-check", action="store_true", help="skip the TCP check of the qdiscs")
  p.add_argument(
    "--plot",
    default=None,
    help="chart path (default: build/charts/harp_transport.png; a --quick run writes none)",
  )
  _common.add_json(p)
  args = p.parse_args(argv)
  q = args.quick
  if args.plot is None and not q:  # a smoke run draws none
    args.plot = _common.chart_path("harp_transport.png")
  args.sizes = _common.int_list(args.sizes) if args.sizes else (QUICK_SIZES if q else FULL_SIZES)
  args.bytes_per_size = args.bytes_per_size or (16 * MIB if q else 256 * MIB)
  args.latency_iters = args.latency_iters or (200 if q else 2000)
  args.verify_messages = args.verify_messages or (1 if q else 2)
  args.rounds = args.rounds or (1 if q else 3)
  args.profiles = [x for x in args.profiles.split(",") if x]
  args.plugins = [x for x in args.plugins.split(",") if x]
  for profile in args.profiles:
    if profile not in TARGETS:
      p.error(f"unknown profile {profile} (aggregate, cloud)")
  for name in args.plugins:
    if not name.startswith(("harp", "baseline")):
      p.error(f"unknown plugin {name} (harp, baseline)")
  if len(set(args.plugins)) != len(args.plugins) or not 1 <= len(args.plugins) <= 2:
    p.error("--plugins: one or two distinct names (e.g. harp,baseline or baseline,baseline2)")
  if args.aggregate_rate == "none" and "cloud" in args.profiles:
    p.error("--aggregate-rate none: the aggregate profile only (cloud caps the aggregate)")
  if args.aggregate_rate != "none":
    try:
      parse_rate(args.aggregate_rate)
    except ValueError:
      p.error(f"--aggregate-rate {args.aggregate_rate}: a tc rate (e.g. 4gbit) or none")
  if (
    args.flow_classes < 1 or args.flow_classes & (args.flow_classes - 1) or args.flow_classes > 256
  ):
    p.error("--flow-classes: a power of 2 up to 256")
  env = {}
  for item in args.harp_env:
    name, sep, value = item.partition("=")
    if not sep or not name.startswith("HARP_"):
      p.error(f"--harp-env {item}: expected HARP_NAME=VALUE")
    env[name] = value
  args.harp_env = env
  _common.require_positive(
    p, args, ["min_messages", "latency_iters", "verify_messages", "rounds", "channels"]
  )
  if args.channels > 64:
    p.error("--channels: at most 64")
  return args


def preflight():
  problems = []
  if os.geteuid() != 0:
    problems.append("must run as root (network namespaces, veth, tc): use `make bench-harp`")
  for tool in ("ip", "tc", "g++"):
    if shutil.which(tool) is None:
      problems.append(f"`{tool}` is not installed")
  if problems:
    raise SystemExit("harp_transport: " + "; ".join(problems))


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  preflight()
  wall_start = time.perf_counter()
  model, flags = _common.cpu_model_and_flags(CPU_FLAGS)
  print(f"machine      : {model}, {_common.cpus_available()} CPUs available")
  print(f"CPU features : {' '.join(flags) or 'unknown'} (of {', '.join(CPU_FLAGS)})")

  driver = compile_cc(DRIVER_SOURCE, "transport_bench", shared=False)
  baseline = compile_cc(BASELINE_SOURCE, "libnccl-net-baseline.so", shared=True)
  plugins = {}
  for name in args.plugins:
    plugins[name] = harp_plugin_path(args.harp_plugin) if name.startswith("harp") else baseline
  for name, path in plugins.items():
    print(f"plugin       : {name:8s} {path}")
  if any(n.startswith("harp") for n in plugins):
    for profile in args.profiles:
      settings = sorted(harp_env(profile, args).items()) + [("HARP_IFNAME", "<the veth>")]
      print(f"HARP env     : {profile:9s} {' '.join(f'{k}={v}' for k, v in settings)}")
  print(
    f"workload     : sizes {', '.join(human(s) for s in args.sizes)}; {human(args.bytes_per_size)}"
    f" per size (>= {args.min_messages} messages); {args.channels} channel(s) of 8 outstanding "
    f"chunks of min(P, clamp(P/8, 512 KiB, 4 MiB)) for parts P = S/{args.channels}; "
    f"{args.latency_iters} 8-byte ping-pongs; {args.rounds} round(s)"
  )

  link = Link(os.getpid())

  def on_signal(signum, _frame):
    raise SystemExit(f"interrupted by signal {signum}")

  signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGHUP, on_signal)
  atexit.register(link.close)
  results = {
    "machine": {"cpu": model, "cpus": _common.cpus_available(), "cpu_flags": flags},
    "settings": {
      "aggregate_rate": args.aggregate_rate,
      "flow_rate": args.flow_rate,
      "flow_classes": args.flow_classes,
      "sizes": args.sizes,
      "bytes_per_size": args.bytes_per_size,
      "latency_iters": args.latency_iters,
      "rounds": args.rounds,
      "channels": args.channels,
      "harp_env": {profile: harp_env(profile, args) for profile in args.profiles},
      "plugins": plugins,
    },
    "profiles": {},
    "targets": [],
  }
  names = list(plugins)
  try:
    link.setup()
    print(
      f"link         : {link.netns[0]} {link.ifname[0]} {link.addr[0]} <-> "
      f"{link.netns[1]} {link.ifname[1]} {link.addr[1]}"
    )
    for profile in args.profiles:
      link.apply(profile, args)
      entry = {"plugins": {}}
      if not args.no_profile_check:
        entry["check"] = check_profile(link, profile, args)
      rounds = {n: [] for n in names}
      errors = {}
      for round_index in range(args.rounds):
        for name in _common.rotated(names, round_index):
          if name in errors:
            continue
          _common.log(f"[{profile}] round {round_index + 1}/{args.rounds}: {name}")
          before = link.class_bytes() if profile == "cloud" else {}
          data, error = run_pair(link, name, plugins[name], driver, args, profile)
          if error:
            errors[name] = error
          else:
            if profile == "cloud":  # per-flow classes that carried >= 1 % of the data
              after = link.class_bytes()
              moved = {c: after[c] - before.get(c, 0) for c in after if c not in ("1:1", "1:ffff")}
              data["flow_classes_used"] = sum(
                1 for b in moved.values() if b >= 0.01 * sum(moved.values())
              )
            rounds[name].append(data)
      for n in names:
        if n in errors:
          entry["plugins"][n] = {"ok": False, "error": errors[n]}
        else:
          entry["plugins"][n] = {"ok": True, "data": merge_rounds(rounds[n])}
      report_profile(profile, entry["plugins"], names)
      results["profiles"][profile] = entry
  finally:
    link.close()

  print()
  print(f"targets (issue 12; ratios {names[0]}/{names[-1]} measured in this run):")
  for profile, entry in results["profiles"].items():
    checks = verdicts(profile, entry["plugins"], names)
    if not checks:
      print(f"  {profile}: not evaluated (a plugin failed, or one plugin only)")
    for what, ratio, target in checks:
      lower_is_better = "CPU" in what or "latency" in what
      met = ratio <= target if lower_is_better else ratio >= target
      sign = "<=" if lower_is_better else ">="
      print(f"  {what:58s} {ratio:6.2f}x  target {sign} {target}x  {_common.verdict(met)}")
      if not met and "throughput" in what:
        why = unreachable_throughput(profile, entry["plugins"][names[-1]]["data"], target, args)
        if why:
          print(f"    {why}")
      results["targets"].append(
        {
          "what": what,
          "ratio": ratio,
          "target": target,
          "lower_is_better": lower_is_better,
          "met": met,
        }
      )
  if args.plot:
    _common.write_chart(
      args.plot,
      results,
      lambda path: draw_chart(
        path, {p: e["plugins"] for p, e in results["profiles"].items()}, names, args
      ),
    )
  # JSON keys must be strings: sizes as their byte counts.
  for entry in results["profiles"].values():
    for r in entry["plugins"].values():
      if r.get("ok"):
        r["data"]["sizes"] = {str(k): v for k, v in r["data"]["sizes"].items()}
  _common.finish(results, args.json, wall_start)
  failed = [
    f"{profile}/{n}"
    for profile, e in results["profiles"].items()
    for n, r in e["plugins"].items()
    if not r["ok"]
  ]
  if failed:
    print(f"FAILED: {', '.join(failed)} (see above)")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())

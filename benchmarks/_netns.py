"""Network namespaces joined by a veth pair, shaped with tc, and the processes run inside them:
the emulated links of the network benchmarks (the two-node cluster of _horovod_cluster.py, the
sender and receiver of harp_transport.py and harp_nccl_e2e.py). Needs root, `ip` and `tc`.
Everything a pair makes is removed by close(), which the scripts call on exit, Ctrl-C or error.
Imported as `_netns` (the scripts run from this folder)."""

import os
import shutil
import signal
import subprocess
import sys

KIB = 1024


def sh(cmd, check=True):
  """Runs `cmd` (a list, or a shell line); raises RuntimeError with its stderr when it fails."""
  proc = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True)
  if check and proc.returncode:
    raise RuntimeError(f"command failed ({proc.returncode}): {cmd}\n{proc.stderr.strip()}")
  return proc


def rate_bps(text):
  """tc rate text ("4gbit", "500mbit", "100kbit", "1000000bit", a bare number of bits) -> bits/s."""
  text = text.strip().lower()
  for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
    if text.endswith(suffix):
      return float(text[: -len(suffix)]) * scale
  return float(text)


def missing_for_netns(run_as_root, tools=("ip", "tc")):
  """What keeps this process from building namespaces: root (`run_as_root` says how to get it)
  and each of `tools`; [] when nothing is missing."""
  problems = []
  if os.geteuid() != 0:
    problems.append(
      f"must run as root (it creates network namespaces, veth links and tc qdiscs): {run_as_root}"
    )
  for tool in tools:
    if shutil.which(tool) is None:
      package = "iproute2" if tool in ("ip", "tc") else tool
      problems.append(f"`{tool}` not found (Debian: apt-get install {package})")
  return problems


def exit_on_signals(interrupt=False):
  """SIGTERM and SIGHUP (and with `interrupt`, SIGINT, also in a background job) raise
  SystemExit, so that the finally blocks and atexit handlers remove the namespaces."""

  def on_signal(signum, _frame):
    raise SystemExit(f"interrupted by signal {signum}")

  if interrupt:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGHUP, on_signal)


def tbf(ifname, rate, burst, latency, handle=None):
  """The tc command (after `tc -n NS`) that caps egress of `ifname` with a token bucket."""
  root = ["root", "handle", handle] if handle else ["root"]
  return ["qdisc", "add", "dev", ifname, *root, "tbf", "rate", rate, "burst", str(burst)] + [
    "latency",
    latency,
  ]


class VethPair:
  """Two namespaces joined by a veth pair, each end with its address; processes started in them
  (each the leader of its own session, so that killing it kills what it started); close()
  removes everything it made. `kill_grace_s`: how long a process may take to end on SIGTERM
  before SIGKILL (0: SIGKILL at once)."""

  kill_grace_s = 0

  def __init__(self, netns, ifnames, addrs):
    self.netns, self.ifname, self.addr = list(netns), list(ifnames), list(addrs)
    self.created = []  # the namespaces made so far
    self.procs = []  # Popen objects started in them

  def setup(self):
    for ns in self.netns:
      sh(["ip", "netns", "add", ns])
      self.created.append(ns)
    sh(
      ["ip", "link", "add", self.ifname[0], "netns", self.netns[0], "type", "veth"]
      + ["peer", "name", self.ifname[1], "netns", self.netns[1]]
    )
    for ns, ifname, addr in zip(self.netns, self.ifname, self.addr):
      sh(["ip", "-n", ns, "link", "set", "lo", "up"])
      sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
      sh(["ip", "-n", ns, "link", "set", ifname, "up"])

  def shape(self, commands_of):
    """Replaces the qdiscs on both ends: commands_of(ifname) gives the tc commands of one."""
    for ns, ifname in zip(self.netns, self.ifname):
      sh(["tc", "-n", ns, "qdisc", "del", "dev", ifname, "root"], check=False)
      for cmd in commands_of(ifname):
        sh(["tc", "-n", ns] + cmd)

  def popen(self, side, argv, **kwargs):
    proc = subprocess.Popen(
      ["ip", "netns", "exec", self.netns[side]] + argv, start_new_session=True, **kwargs
    )
    self.procs.append(proc)
    return proc

  def kill(self, proc):
    if proc.poll() is not None:
      return
    try:
      if self.kill_grace_s:
        os.killpg(proc.pid, signal.SIGTERM)  # the session created for it
        proc.wait(timeout=self.kill_grace_s)
        return
    except (ProcessLookupError, subprocess.TimeoutExpired):
      pass
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()

  def kill_all(self):
    for proc in self.procs:
      self.kill(proc)
    self.procs = []

  def forget_finished(self):
    self.procs = [p for p in self.procs if p.poll() is None]

  def close(self):
    self.kill_all()
    for ns in self.created:
      sh(["ip", "netns", "del", ns], check=False)
    self.created = []


# ---- the transport benchmarks' link: a sender, a receiver, and two shaping profiles ----------


SUBNET = "10.78.0"


class TransportLink(VethPair):
  """The sender's namespace (side 0) and the receiver's (side 1) of the transport benchmarks;
  apply(profile, args) (re)places the qdiscs of `profile` on both ends, so that both directions
  of every connection are shaped."""

  def __init__(self, tag):
    super().__init__(
      [f"harpb_{tag}_s", f"harpb_{tag}_r"],
      [f"hb{tag}s"[:15], f"hb{tag}r"[:15]],
      [f"{SUBNET}.1", f"{SUBNET}.2"],
    )

  def apply(self, profile, args):
    self.shape(lambda ifname: profile_commands(profile, ifname, args))

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


def profile_commands(profile, ifname, args):
  """The tc commands (after `tc -n NS`) that shape egress of `ifname` as `profile`."""
  if args.aggregate_rate == "none":
    return []  # the aggregate profile without a cap (parse_args refuses cloud)
  aggregate = rate_bps(args.aggregate_rate)
  # A burst of about 1 ms at the rate, at least 256 KiB: veth hands tc 64 KiB GSO packets.
  burst = max(256 * KIB, int(aggregate / 8 / 1000))
  if profile == "aggregate":
    return [tbf(ifname, args.aggregate_rate, burst, "20ms", handle="1:")]
  classes = args.flow_classes
  mask = (classes - 1) << 1
  flow_rate_bps = rate_bps(args.flow_rate)
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
  aggregate, flow = rate_bps(args.aggregate_rate) / 1e9, rate_bps(args.flow_rate) / 1e9
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

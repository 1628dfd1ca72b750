"""The emulated two-node cluster that Horovod ranks run on (lightcc_cluster.py,
lightcc_scaling.py, alltoall_tables.py): two network namespaces joined by a veth that tc tbf
throttles, ranks launched as `horovodrun --gloo` launches them, the counters that tell where a
slow run's time went, and the rule that runs a run the hypervisor disturbed again. Needs root,
`ip` and `tc`. Imported as `_horovod_cluster` (the scripts run from this folder).

    netns lcc_node0_<pid>                         netns lcc_node1_<pid>
    ranks 0..R-1 -- lo (intra-node) --            ranks R..2R-1 -- lo (intra-node) --
    lcc0 10.77.0.1/24  <==== veth, tc tbf --rate each direction ====>  lcc0 10.77.0.2/24

Two ranks of one node talk to the node's lcc0 address, which the kernel routes over its loopback,
so only inter-node traffic crosses (and is throttled on) the veth."""

import glob
import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

from _common import REPO, use_checkout
from _netns import VethPair, missing_for_netns, sh, tbf
from _report import machine_report

NODES = 2
RANKS_PER_NODE = 2  # set_ranks_per_node changes it (and WORLD) for a whole run
WORLD = NODES * RANKS_PER_NODE
SUBNET = "10.77.0"
IFACE = "lcc0"  # the veth end's name inside each node's namespace (like eth0 on every host)

# Third-party modules of the run (matplotlib for the chart at the very end), checked before
# anything starts: `make bench-cluster` installs them (requirements.txt, Horovod from `make setup`,
# requirements-bench.txt).
REQUIRED_MODULES = ("numpy", "tensorflow", "horovod", "matplotlib")

_SLOT_VARS = (
  "HOROVOD_HOSTNAME",
  "HOROVOD_RANK",
  "HOROVOD_SIZE",
  "HOROVOD_LOCAL_RANK",
  "HOROVOD_LOCAL_SIZE",
  "HOROVOD_CROSS_RANK",
  "HOROVOD_CROSS_SIZE",
)

RENDEZVOUS_CODE = r"""
import sys
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer
server = RendezvousServer(verbose=0)
port = server.start()
server.init(get_host_assignments(parse_hosts(sys.argv[1]), int(sys.argv[2])))
print(port, flush=True)
sys.stdin.read()  # runs until the benchmark closes our stdin
server.stop()
"""


def set_ranks_per_node(ranks):
  global RANKS_PER_NODE, WORLD  # pylint: disable=global-statement
  RANKS_PER_NODE, WORLD = ranks, NODES * ranks


class Cluster(VethPair):
  """Two namespaces joined by a tbf-throttled veth (not throttled with rate None); removes
  everything it made on close()."""

  kill_grace_s = 10

  def __init__(self, rate, burst, latency):
    assert NODES == 2, "one veth pair joins exactly two nodes (use a bridge for more)"
    tag = os.getpid()
    super().__init__(
      [f"lcc_node{i}_{tag}" for i in range(NODES)],
      [IFACE] * NODES,
      [f"{SUBNET}.{i + 1}" for i in range(NODES)],
    )
    self.rate, self.burst, self.latency = rate, burst, latency
    self.etc_dirs = []  # /etc/netns/<ns> directories we created
    self.made_etc_netns = False

  def setup(self):
    # Horovod 0.28 builds the Gloo device of every process set (the global one included) without
    # HOROVOD_GLOO_IFACE (GlooContext::InitializeForProcessSet reads its own, empty gloo_iface_),
    # so Gloo falls back to resolving gethostname(). On a real cluster that is the host's address;
    # here it is 127.0.0.1 for both "nodes". `ip netns exec` bind-mounts /etc/netns/<ns>/hosts
    # over /etc/hosts, so each node resolves the hostname to its own link address, as a host would.
    hostname = socket.gethostname()
    self.made_etc_netns = not os.path.isdir("/etc/netns")
    for ns, addr in zip(self.netns, self.addr):
      os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
      self.etc_dirs.append(f"/etc/netns/{ns}")
      with open(f"/etc/netns/{ns}/hosts", "w") as f:
        f.write(f"127.0.0.1 localhost\n{addr} {hostname}\n")
    super().setup()
    if self.rate is not None:  # uncapped: the veth as fast as the CPUs move it
      self.shape(lambda ifname: [tbf(ifname, self.rate, self.burst, self.latency)])
    # The link works both ways before anything is timed.
    sh(
      ["ip", "netns", "exec", self.netns[0], "ping", "-c", "1", "-W", "2", self.addr[1]],
      check=False,
    )

  def describe(self):
    lines = []
    for ns in self.netns:
      q = sh(["tc", "-n", ns, "qdisc", "show", "dev", IFACE]).stdout.strip()
      a = sh(["ip", "-n", ns, "-br", "addr", "show", "dev", IFACE]).stdout.strip()
      lines.append(f"  {ns}: {a} | {q}")
    return "\n".join(lines)

  def close(self):
    super().close()
    for d in self.etc_dirs:
      shutil.rmtree(d, ignore_errors=True)
    self.etc_dirs = []
    if self.made_etc_netns:
      try:
        os.rmdir("/etc/netns")  # only if we created it and it is empty
      except OSError:
        pass


def launch_ranks(cluster, argv, env, result_dir, timeout):
  """Runs one process per rank of the WORLD ranks (`argv`, in its node's namespace, with the
  Horovod variables of a `horovodrun --gloo` job, `env` and the caller's environment less its
  LIGHT_*), each writing rank<r>.log and rank<r>.json into result_dir; waits up to `timeout`
  seconds. Returns ({rank: its JSON}, None) or (None, {"error": ..., "logs": the logs' tails})."""
  from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
  from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

  os.makedirs(result_dir, exist_ok=True)
  for stale in glob.glob(os.path.join(result_dir, "rank*.json")):  # a run again in the same dir
    os.remove(stale)
  hosts = ",".join(f"node{i}:{RANKS_PER_NODE}" for i in range(NODES))
  server = cluster.popen(
    0,
    [sys.executable, "-c", RENDEZVOUS_CODE, hosts, str(WORLD)],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )
  port = int(server.stdout.readline())
  run_env = {k: str(v) for k, v in create_run_env_vars(cluster.addr[0], [IFACE], port).items()}
  # The caller's LIGHT_* settings never leak into a configuration; other HOROVOD_* knobs (e.g.
  # HOROVOD_LOG_LEVEL, HOROVOD_FUSION_THRESHOLD) pass through, as with horovodrun.
  base = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("LIGHT_") and k not in run_env and k not in _SLOT_VARS
  }
  base.update(env)
  base.update(run_env)
  base["PYTHONUNBUFFERED"] = "1"
  base["PYTHONPATH"] = REPO + os.pathsep + base.get("PYTHONPATH", "")
  base["TF_CPP_MIN_LOG_LEVEL"] = "2"
  ranks = []
  for slot in get_host_assignments(parse_hosts(hosts), WORLD):
    slot_env = dict(base, **create_slot_env_vars(slot))
    node = int(slot.hostname[len("node") :])
    log = open(os.path.join(result_dir, f"rank{slot.rank}.log"), "w")
    ranks.append(
      (
        slot.rank,
        cluster.popen(node, argv, env=slot_env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO),
        log,
      )
    )
  deadline = time.time() + timeout
  failed = None
  while any(p.poll() is None for _, p, _ in ranks):
    bad = [(r, p.returncode) for r, p, _ in ranks if p.poll() not in (None, 0)]
    if bad or time.time() > deadline:
      failed = f"rank {bad[0][0]} exited with {bad[0][1]}" if bad else f"timeout {timeout}s"
      break
    time.sleep(0.5)
  for _, p, log in ranks:
    cluster.kill(p)
    log.close()
  server.stdin.close()
  cluster.kill(server)
  cluster.forget_finished()
  if failed is None:
    bad = [(r, p.returncode) for r, p, _ in ranks if p.returncode]
    failed = f"rank {bad[0][0]} exited with {bad[0][1]}" if bad else None
  results = {}
  for r, _, _ in ranks:
    path = os.path.join(result_dir, f"rank{r}.json")
    if os.path.exists(path):
      with open(path) as f:
        results[r] = json.load(f)
  if failed or len(results) != WORLD:
    tails = []
    for r, _, _ in ranks:
      with open(os.path.join(result_dir, f"rank{r}.log")) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
      tails.append(f"--- rank {r} (last lines) ---\n" + "\n".join(lines[-15:]))
    return None, {"error": failed or "missing results", "logs": "\n".join(tails)}
  return results, None


def read_counters():
  """Counters to tell where a slow run's time went, each read before and after the timed steps:
  - bytes of this namespace's lcc0 and lo (/sys as remounted by `ip netns exec`);
  - its TCP segments sent again (/proc/net/snmp is per namespace), its tail loss probes (sent
    when an ACK is late, though nothing need be lost; new data or a segment sent again) and its
    retransmission timeouts;
  - the packets lcc0's tbf dropped (`tc -s`): the link's own losses;
  - the host's CPU ticks and those stolen from this VM by its hypervisor (/proc/stat, not per
    namespace): time the ranks wait that their own CPU time does not show.
  A worker run by hand outside the cluster has no lcc0: its link counters are left out (the
  cluster always makes lcc0, so its reports always have them)."""
  out = {}
  for dev in (IFACE, "lo"):
    if not os.path.isdir(f"/sys/class/net/{dev}"):
      continue
    for key in ("tx_bytes", "rx_bytes"):
      with open(f"/sys/class/net/{dev}/statistics/{key}") as f:
        out[f"{dev}_{key}"] = int(f.read())
  tcp = _proc_net_table("/proc/net/snmp", "Tcp:")
  tcp_ext = _proc_net_table("/proc/net/netstat", "TcpExt:")
  out["tcp_retrans_segs"] = tcp["RetransSegs"]
  out["tcp_loss_probes"] = tcp_ext.get("TCPLossProbes", 0)
  out["tcp_timeouts"] = tcp_ext.get("TCPTimeouts", 0)
  if f"{IFACE}_tx_bytes" in out:
    shown = subprocess.run(
      ["tc", "-s", "-j", "qdisc", "show", "dev", IFACE], capture_output=True, text=True
    )
    if shown.returncode == 0 and shown.stdout.strip():
      out["qdisc_drops"] = sum(q.get("drops", 0) for q in json.loads(shown.stdout))
  with open("/proc/stat") as f:
    ticks = [int(v) for v in f.readline().split()[1:]]
  out["cpu_ticks"] = sum(ticks[:8])  # user .. steal (guest time is inside user)
  out["cpu_steal_ticks"] = ticks[7]
  return out


def steal_share(counters):
  """The share of the host's CPU time that its hypervisor gave to others between two readings
  (the counters' differences): time the ranks waited that their own CPU time does not show."""
  return counters.get("cpu_steal_ticks", 0) / max(1, counters.get("cpu_ticks", 0))


def _proc_net_table(path, prefix):
  """One table of /proc/net/snmp or /proc/net/netstat (a names line, then a values line)."""
  with open(path) as f:
    names, values = [line.split()[1:] for line in f if line.startswith(prefix)]
  return dict(zip(names, map(int, values)))


def add_steal_options(parser):
  """--max-steal and --steal-retries, for run_undisturbed."""
  parser.add_argument(
    "--max-steal",
    type=float,
    default=0.05,
    help="a run during whose timed steps the hypervisor gave more than this share of the host's "
    "CPU to others is run again (1 never)",
  )
  parser.add_argument(
    "--steal-retries", type=int, default=2, help="times a disturbed run is run again at most"
  )


def check_steal_options(parser, args):
  if not 0 <= args.max_steal <= 1 or args.steal_retries < 0:
    parser.error("--max-steal is a share in [0, 1] and --steal-retries at least 0")


def run_undisturbed(run_once, args, show):
  """Calls run_once() -> a row with its "steal_share" (or a failure row, with "error") again while
  the host lent more than --max-steal of the CPU to others during its timed steps, at most
  --steal-retries times: such a run measures the neighbours, and hits configurations that need
  more CPU harder. When no run was under --max-steal, the one with the least steal is kept.
  show(row, again, seconds it took) prints each run. Returns the row kept and those it replaced
  (in run order)."""
  runs = []
  while True:
    started = time.perf_counter()
    row = run_once()
    again = (
      "error" not in row and row["steal_share"] > args.max_steal and len(runs) < args.steal_retries
    )
    show(row, again, time.perf_counter() - started)
    if "error" in row:
      return row, runs
    runs.append(row)
    if not again:
      kept = min(runs, key=lambda r: r["steal_share"])  # the last one, unless all were disturbed
      return kept, [r for r in runs if r is not kept]


def check_modules(modules=REQUIRED_MODULES, script="lightcc_cluster.py", target="bench-cluster"):
  missing = [name for name in modules if importlib.util.find_spec(name) is None]
  if missing:
    sys.exit(
      f"{script}: {sys.executable} lacks {', '.join(missing)}. Run the benchmark with "
      f"`make {target}` (it installs requirements-bench.txt, then runs this script as root), "
      "or install them with `make bench-deps`."
    )


def preflight(script="lightcc_cluster.py"):
  sudo = "sudo " + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
  problems = missing_for_netns(sudo)
  if problems:
    sys.exit(f"{script}: " + "\n  ".join(problems))


def start_driver(modules, script, target):
  """What a cluster benchmark's driver does first: its modules and root checked (exits saying
  what to run), then TensorFlow and this checkout's tf_ext imported. Returns (tf, tf_ext, np,
  results holding the machine report)."""
  check_modules(modules, script, target)
  preflight(script)
  use_checkout()
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  return tf, tf_ext, np, {"machine": machine_report(tf, tf_ext, np)}


def barrier(horovod_hvd, tf, name):
  """Horovod's own flat allreduce on the global set, whatever LIGHT_* says."""
  horovod_hvd.allreduce(tf.constant(0.0), op=horovod_hvd.Sum, name=name).numpy()

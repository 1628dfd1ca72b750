#!/usr/bin/env python3
"""LightCC on an emulated two-node cluster: steps/s and inter-node bytes, against Horovod.

Needs root (it creates network namespaces, a veth link and tc qdiscs) and `ip` / `tc`.

Topology (everything is created fresh with names unique to this run, and removed on exit, Ctrl-C
or error):

    netns lcc_node0_<pid>                         netns lcc_node1_<pid>
    ranks 0,1  -- lo (intra-node) --              ranks 2,3  -- lo (intra-node) --
    lcc0 10.77.0.1/24  <==== veth, tc tbf --rate each direction ====>  lcc0 10.77.0.2/24

Ranks are launched the way `horovodrun` launches a Gloo job (horovod/runner/gloo_run.py): one
Horovod RendezvousServer (started inside node 0, reachable at 10.77.0.1), and per rank the
HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo,
HOROVOD_GLOO_IFACE=lcc0 and the slot variables (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*/HOSTNAME) built
by Horovod's own create_run_env_vars / create_slot_env_vars; one process per rank, started with
`ip netns exec <its node's netns>`. Gloo binds to the node's lcc0 address; two ranks of one node
talk to that local address, which the kernel routes over the node's loopback, so only inter-node
traffic crosses (and is throttled on) the veth. The script checks this with per-interface byte
counters (lcc0 and lo, read inside each namespace).

Workload: gradients with exactly the shapes of a Keras model's trainable variables (ResNet50 by
default: 214 tensors, 25,583,592 float32 = 102.3 MB). Each step is a real
`hvd.DistributedGradientTape` over `loss = sum(v * g)` (so the local gradient is the fixed random
g), followed by an SGD update of v with the reduced gradient.

For every configuration (CONFIGS below: name -> LIGHT_* environment; extend it, or pass
--extra-config NAME:VAR=VALUE,...), it reports steps/s (rank 0, between two barriers around
--steps steps after --warmup steps), the bytes per step that really crossed the link in each
direction (lcc0 tx_bytes of each node, headers included), the analytic inter-node bytes per step
(hvd.traffic(), summed over the node's ranks; for Horovod the flat-ring model 2(W-1)/W*S per node),
and the ring-allreduce lower bound 2(n-1)/n * S per node and direction (n = 2 nodes -> S).
Each configuration also prints the host's steal share over its timed steps (CPU time the
hypervisor gave to other machines, /proc/stat): a run over --max-steal (5 %) is run again, at most
--steal-retries (2) times, and the report lists the runs it replaced.
Targets (informational, exit status 0): 2D + TOPK >= 2x Horovod steps/s; 2D inter-node bytes
<= 1.1x the lower bound.

  make bench-cluster                    # installs what it needs, then runs it (sudo if not root)
  make bench-cluster BENCH_ARGS="--rate 500mbit --configs horovod,2d"
  sudo .venv/bin/python benchmarks/lightcc_cluster.py                      # ResNet50, 1 Gbit/s
  .venv/bin/python benchmarks/lightcc_cluster.py --rate 500mbit --steps 10 --configs horovod,2d
  .venv/bin/python benchmarks/lightcc_cluster.py \
      --extra-config fusion:LIGHT_2D_ALLREDUCE=1,LIGHT_INTRA_SIZE=2,LIGHT_FUSION=1
"""

import argparse
import atexit
import glob
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

NODES = 2
RANKS_PER_NODE = 2
WORLD = NODES * RANKS_PER_NODE
SUBNET = "10.77.0"
IFACE = "lcc0"  # the veth end's name inside each node's namespace (like eth0 on every host)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_2D = {"LIGHT_2D_ALLREDUCE": "1", "LIGHT_INTRA_SIZE": str(RANKS_PER_NODE)}
_TOPK = {"LIGHT_TOPK_ALLREDUCE": "1", "LIGHT_TOPK_RATIO": "0.01"}
# Configuration name -> LIGHT_* settings (every LIGHT_* not named is unset, i.e. at its default).
# Add entries here (e.g. "2d+fusion": {**_2D, "LIGHT_FUSION": "1"}) or with --extra-config.
# 128 MiB (Horovod's default fusion threshold) holds the whole step: one bucket, as Horovod
# fuses it.
_FUSION = {
  "LIGHT_FUSION": "1",
  "LIGHT_FUSION_BUCKETS_MB": "4,16,64,128",
  "LIGHT_FUSION_PROBE_STEPS": "2",
  "LIGHT_FUSION_REPROBE_STEPS": "0",
}
CONFIGS = {
  "horovod": {},
  "2d": dict(_2D),
  "2d+topk": {**_2D, **_TOPK},
  "2d+topk+fp16": {**_2D, **_TOPK, "LIGHT_TOPK_FP16": "1"},
  # Adaptive fusion: short probes so that exploring 4 sizes fits in a warm-up of >= 8 steps.
  "fusion": dict(_FUSION),
  "2d+fusion": {**_2D, **_FUSION},
  "2d+topk+fusion": {**_2D, **_TOPK, **_FUSION},
}
LABELS = {
  "horovod": "Horovod",
  "2d": "LightCC 2D",
  "2d+topk": "2D + TOPK",
  "2d+topk+fp16": "2D + TOPK + FP16",
  "fusion": "adaptive fusion",
  "2d+fusion": "2D + fusion",
  "2d+topk+fusion": "2D + TOPK + fusion",
}
DEFAULT_CONFIGS = ["horovod", "2d", "2d+topk", "2d+topk+fp16"]

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


# ----------------------------------------------------------------------------------- rank side


def _read_counters():
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


def worker(args):
  import horovod.tensorflow as horovod_hvd
  import numpy as np
  import tensorflow as tf

  import tf_ext.lightcc as hvd

  with open(args.spec) as f:
    spec = json.load(f)
  hvd.init()
  rank, local_rank = hvd.rank(), hvd.local_rank()
  rng = np.random.default_rng(1234 + rank)
  shapes = [tuple(s) for s in spec["shapes"]]
  variables = [tf.Variable(tf.zeros(s, tf.float32), name=f"w{i}") for i, s in enumerate(shapes)]
  targets = [tf.constant(rng.standard_normal(s, dtype=np.float32)) for s in shapes]

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, targets)])
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
      v.assign_sub(1e-3 * g)
    return loss

  def barrier():  # Horovod's own flat allreduce on the global set, whatever LIGHT_* says
    horovod_hvd.allreduce(tf.constant(0.0), op=horovod_hvd.Sum, name="lcc_bench_barrier").numpy()

  t = time.perf_counter()
  for _ in range(args.warmup):
    step()
  warmup_s = time.perf_counter() - t
  barrier()
  hvd.reset_traffic()
  before = _read_counters()
  t0 = time.perf_counter()
  for _ in range(args.steps):
    step()
  barrier()
  elapsed = time.perf_counter() - t0
  after = _read_counters()
  traffic = hvd.traffic()
  result = {
    "rank": rank,
    "local_rank": local_rank,
    "node": rank // RANKS_PER_NODE,
    "steps": args.steps,
    "elapsed_s": elapsed,
    "warmup_s": warmup_s,
    "counters": {k: after[k] - before[k] for k in after},
    "traffic": traffic,
    "light_config": repr(hvd.light_config()),
    "fusion": [
      {
        "candidates_mb": [float(c) for c in hvd.light_config().fusion_buckets_mb],
        "chosen": p.current,
        "median_step_s": p.medians,
      }
      for p in hvd.fusion_policies()
    ],
  }
  with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
  barrier()  # nobody leaves (tearing down Gloo) while a peer still reads its counters


# --------------------------------------------------------------------------------- parent side


def sh(cmd, check=True):
  proc = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True)
  if check and proc.returncode:
    raise RuntimeError(f"command failed ({proc.returncode}): {cmd}\n{proc.stderr.strip()}")
  return proc


class Cluster:
  """Two namespaces joined by a tbf-throttled veth (not throttled with rate None); removes
  everything it made on close()."""

  def __init__(self, rate, burst, latency):
    tag = os.getpid()
    self.netns = [f"lcc_node{i}_{tag}" for i in range(NODES)]
    self.addr = [f"{SUBNET}.{i + 1}" for i in range(NODES)]
    self.rate, self.burst, self.latency = rate, burst, latency
    self.procs = []  # Popen objects we started (each the leader of its own session)
    self.etc_dirs = []  # /etc/netns/<ns> directories we created

  def setup(self):
    assert NODES == 2, "one veth pair joins exactly two nodes (use a bridge for more)"
    for ns in self.netns:
      sh(["ip", "netns", "add", ns])
    sh(
      [
        "ip",
        "link",
        "add",
        IFACE,
        "netns",
        self.netns[0],
        "type",
        "veth",
        "peer",
        "name",
        IFACE,
        "netns",
        self.netns[1],
      ]
    )
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
    for ns, addr in zip(self.netns, self.addr):
      sh(["ip", "-n", ns, "link", "set", "lo", "up"])
      sh(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE])
      sh(["ip", "-n", ns, "link", "set", IFACE, "up"])
      if self.rate is None:  # uncapped: the veth as fast as the CPUs move it
        continue
      sh(
        [
          "tc",
          "-n",
          ns,
          "qdisc",
          "add",
          "dev",
          IFACE,
          "root",
          "tbf",
          "rate",
          self.rate,
          "burst",
          self.burst,
          "latency",
          self.latency,
        ]
      )
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

  def popen(self, node, argv, **kwargs):
    proc = subprocess.Popen(
      ["ip", "netns", "exec", self.netns[node]] + argv, start_new_session=True, **kwargs
    )
    self.procs.append(proc)
    return proc

  def kill(self, proc):
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGTERM)  # the session we created for it
        proc.wait(timeout=10)
      except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()

  def close(self):
    for proc in self.procs:
      self.kill(proc)
    self.procs = []
    for ns in self.netns:
      if sh(["ip", "netns", "pids", ns], check=False).returncode == 0:
        sh(["ip", "netns", "del", ns], check=False)
    for d in self.etc_dirs:
      shutil.rmtree(d, ignore_errors=True)
    self.etc_dirs = []
    if getattr(self, "made_etc_netns", False):
      try:
        os.rmdir("/etc/netns")  # only if we created it and it is empty
      except OSError:
        pass


def model_shapes(model, input_size):
  """Shapes of the Keras model's trainable variables (built once, no weights downloaded)."""
  import tensorflow as tf

  builder = {"resnet50": tf.keras.applications.ResNet50, "vgg16": tf.keras.applications.VGG16}[
    model
  ]
  m = builder(weights=None, include_top=True, input_shape=(input_size, input_size, 3))
  shapes = [list(v.shape) for v in m.trainable_variables]
  del m
  tf.keras.backend.clear_session()
  return shapes


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
  cluster.procs = [p for p in cluster.procs if p.poll() is None]
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


def show_run(row, again, seconds, args):
  """Prints one run of a configuration (run_undisturbed's show)."""
  if "error" in row:
    print(f"   FAILED after {seconds:.0f}s: {row['error']}\n{row['logs']}", flush=True)
    return
  n = row["nodes"]
  for policy in row["fusion"]:
    mb = policy["candidates_mb"]
    print(
      f"   fusion: bucket {mb[policy['chosen']]:g} MiB chosen; median step s by size: "
      + ", ".join(f"{mb[int(i)]:g}: {t:.3f}" for i, t in sorted(policy["median_step_s"].items()))
    )
  print(
    f"   {row['steps_per_s']:.3f} steps/s; link bytes/step node0->1 "
    f"{n[0]['link_tx'] / 1e6:.2f} MB, node1->0 {n[1]['link_tx'] / 1e6:.2f} MB; "
    f"lo bytes/step {n[0]['lo_tx'] / 1e6:.2f} / {n[1]['lo_tx'] / 1e6:.2f} MB; steal "
    f"{row['steal_share']:.0%}; {row['light_config']} ({seconds:.0f}s)"
    + (f"; steal over {args.max_steal:.0%}: run again" if again else ""),
    flush=True,
  )


def run_config(cluster, name, env_light, args, spec_path, workdir):
  result_dir = os.path.join(workdir, name.replace("+", "_"))
  argv = [sys.executable, os.path.abspath(__file__), "--worker", "--spec", spec_path]
  argv += ["--result-dir", result_dir, "--steps", str(args.steps), "--warmup", str(args.warmup)]
  results, failure = launch_ranks(cluster, argv, env_light, result_dir, args.timeout)
  if failure:
    return {"name": name, **failure}
  return summarize(name, env_light, results, args)


def summarize(name, env_light, results, args):
  S = args.total_bytes
  steps = args.steps
  per_node = []
  for node in range(NODES):
    rs = [results[r] for r in range(WORLD) if r // RANKS_PER_NODE == node]
    c = rs[0]["counters"]
    per_node.append(
      {
        "link_tx": c[f"{IFACE}_tx_bytes"] / steps,
        "link_rx": c[f"{IFACE}_rx_bytes"] / steps,
        "lo_tx": c["lo_tx_bytes"] / steps,
        "analytic_inter": sum(r["traffic"]["inter_bytes"] for r in rs) / steps,
        "analytic_intra": sum(r["traffic"]["intra_bytes"] for r in rs) / steps,
      }
    )
  two_d_or_topk = any(
    env_light.get(k) == "1" for k in ("LIGHT_2D_ALLREDUCE", "LIGHT_TOPK_ALLREDUCE")
  )
  model = not two_d_or_topk
  if model:  # Horovod: flat ring over WORLD ranks ordered by node: one crossing edge per node
    for n in per_node:
      n["analytic_inter"] = 2 * (WORLD - 1) / WORLD * S
  return {
    "name": name,
    "env": env_light,
    "steps_per_s": steps / results[0]["elapsed_s"],
    "step_s": results[0]["elapsed_s"] / steps,
    "steal_share": steal_share(results[0]["counters"]),
    "warmup_s": results[0]["warmup_s"],
    "nodes": per_node,
    "analytic_is_model": model,
    "light_config": results[0]["light_config"],
    "fusion": results[0]["fusion"],
  }


def report(rows, args):
  S = args.total_bytes
  lb = 2 * (NODES - 1) / NODES * S

  def mb(b):
    return f"{b / 1e6:9.2f}"

  base = next((r for r in rows if r["name"] == "horovod" and "error" not in r), None)
  print(
    f"\nWorkload: {args.model_desc}: {args.num_tensors} gradient tensors, "
    f"{args.num_params:,} float32 = S = {S / 1e6:.2f} MB per step"
  )
  print(
    f"Cluster: {NODES} nodes x {RANKS_PER_NODE} ranks, link {args.rate} (tbf) each direction; "
    f"lower bound 2(n-1)/n*S = {lb / 1e6:.2f} MB per node and direction "
    f"(link time at rate: {lb * 8 / args.rate_bps:.3f} s)"
  )
  print(
    "Bytes are per step; 'node0->1' is node 0's lcc0 tx_bytes (headers included), "
    "'analytic' is hvd.traffic() summed per node (max of the nodes)\n"
  )
  hdr = (
    f"{'config':<18} {'steps/s':>8} {'vs hvd':>7} {'node0->1 MB':>12} {'node1->0 MB':>12} "
    f"{'analytic MB':>12} {'meas/LB':>8} {'anal/LB':>8} {'lo MB/node':>11}"
  )
  print(hdr)
  print("-" * len(hdr))
  for r in rows:
    label = r["name"]
    if "error" in r:
      print(f"{label:<18} FAILED: {r['error']}")
      continue
    n0, n1 = r["nodes"]
    meas = max(n0["link_tx"], n1["link_tx"])
    anal = max(n0["analytic_inter"], n1["analytic_inter"])
    ratio = f"{r['steps_per_s'] / base['steps_per_s']:6.2f}x" if base else "    n/a"
    print(
      f"{label:<18} {r['steps_per_s']:8.3f} {ratio:>7} {mb(n0['link_tx']):>12} "
      f"{mb(n1['link_tx']):>12} {mb(anal):>11}{'*' if r['analytic_is_model'] else ' '} "
      f"{meas / lb:8.3f} {anal / lb:8.3f} {mb(max(n0['lo_tx'], n1['lo_tx'])):>11}"
    )
  print("  * Horovod: flat-ring model 2(W-1)/W*S per node (hvd.traffic() counts only LightCC)")
  print(
    f"{'lower bound':<18} {'':>8} {'':>7} {mb(lb):>12} {mb(lb):>12} {mb(lb):>11}  "
    f"{1.0:8.3f} {1.0:8.3f}"
  )
  print()
  by = {r["name"]: r for r in rows if "error" not in r}
  if base and "2d+topk" in by:
    x = by["2d+topk"]["steps_per_s"] / base["steps_per_s"]
    print(f"{'PASS' if x >= 2 else 'MISS'}: 2D + TOPK steps/s = {x:.2f}x Horovod (target >= 2x)")
  else:
    print("----: 2D + TOPK vs Horovod not measured")
  if "2d" in by:
    n0, n1 = by["2d"]["nodes"]
    meas = max(n0["link_tx"], n1["link_tx"]) / lb
    anal = max(n0["analytic_inter"], n1["analytic_inter"]) / lb
    print(
      f"{'PASS' if meas <= 1.1 else 'MISS'}: 2D inter-node bytes = {meas:.3f}x the lower bound "
      f"measured on the link ({anal:.3f}x analytic) (target <= 1.1x)"
    )
  else:
    print("----: 2D inter-node bytes not measured")


def plot(rows, args):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ok = [r for r in rows if "error" not in r]
  if not ok:
    return None
  lb = 2 * (NODES - 1) / NODES * args.total_bytes / 1e6
  names = [LABELS.get(r["name"], r["name"]) for r in ok]
  fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
  x = range(len(ok))
  bars = a1.bar(x, [r["steps_per_s"] for r in ok], color="tab:blue")
  for b, r in zip(bars, ok):
    a1.annotate(
      f"{r['steps_per_s']:.2f}",
      (b.get_x() + b.get_width() / 2, b.get_height()),
      ha="center",
      va="bottom",
      fontsize=9,
    )
  a1.set_xticks(list(x), names, rotation=15)
  a1.set_ylabel("steps/s (rank 0)")
  a1.set_title("Throughput")
  w = 0.27
  a2.bar(
    [i - w for i in x],
    [r["nodes"][0]["link_tx"] / 1e6 for r in ok],
    w,
    label="measured node0→node1",
  )
  a2.bar(list(x), [r["nodes"][1]["link_tx"] / 1e6 for r in ok], w, label="measured node1→node0")
  a2.bar(
    [i + w for i in x],
    [max(n["analytic_inter"] for n in r["nodes"]) / 1e6 for r in ok],
    w,
    label="analytic (hvd.traffic / ring model)",
    color="tab:gray",
  )
  a2.axhline(lb, color="red", ls="--", label=f"lower bound 2(n-1)/n·S = {lb:.1f} MB")
  a2.set_xticks(list(x), names, rotation=15)
  a2.set_ylabel("inter-node MB per step (per direction)")
  a2.set_yscale("log")
  a2.set_ylim(1, 6 * max(lb, max(r["nodes"][0]["link_tx"] / 1e6 for r in ok)))
  a2.set_title("Inter-node bytes per step")
  a2.legend(fontsize=8, loc="upper right", ncol=2)
  fig.suptitle(
    f"LightCC vs Horovod: {NODES} nodes x {RANKS_PER_NODE} ranks, {args.rate} link, "
    f"{args.model_desc} (S = {args.total_bytes / 1e6:.1f} MB)"
  )
  import _common  # pylint: disable=import-outside-toplevel (as in start_driver)

  path = args.out or _common.chart_path("lightcc_cluster.png")
  _common.save_figure(fig, plt, path, dpi=110)
  return os.path.abspath(path)


def rate_to_bps(rate):
  units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
  for u, m in units.items():
    if rate.lower().endswith(u):
      return float(rate[: -len(u)]) * m
  raise ValueError(f"--rate like 1gbit / 500mbit, got {rate!r}")


def parse_args(argv):
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--rate", default="1gbit", help="tc tbf rate of the inter-node link (each way)")
  p.add_argument("--burst", default="512kb", help="tc tbf burst")
  p.add_argument("--latency", default="20ms", help="tc tbf latency (queue limit)")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--model", choices=("resnet50", "vgg16"), default="resnet50")
  p.add_argument(
    "--input-size",
    type=int,
    default=32,
    help="input side for building the model (VGG16's fc1 depends on it: 224 = the "
    "real 138M-parameter VGG16, 32 = 37.7M)",
  )
  p.add_argument(
    "--configs",
    default=",".join(DEFAULT_CONFIGS),
    help=f"comma-separated subset of {list(CONFIGS)} (plus --extra-config names)",
  )
  p.add_argument(
    "--extra-config",
    action="append",
    default=[],
    metavar="NAME:VAR=V,VAR=V",
    help="add a configuration (also run, after --configs)",
  )
  p.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
  add_steal_options(p)
  p.add_argument(
    "--out", default=None, help="PNG chart path (default: build/charts/lightcc_cluster.png)"
  )
  p.add_argument("--json", help="also write the results here")
  p.add_argument("--workdir", help="rank logs and results (default: a temp dir, kept on failure)")
  p.add_argument("--keep-netns", action="store_true", help="debug: leave the namespaces up")
  # Internal: one rank.
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--spec", help=argparse.SUPPRESS)
  p.add_argument("--result-dir", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  check_steal_options(p, args)
  return args


def check_modules(modules=REQUIRED_MODULES, script="lightcc_cluster.py", target="bench-cluster"):
  missing = [name for name in modules if importlib.util.find_spec(name) is None]
  if missing:
    sys.exit(
      f"{script}: {sys.executable} lacks {', '.join(missing)}. Run the benchmark with "
      f"`make {target}` (it installs requirements-bench.txt, then runs this script as root), "
      "or install them with `make bench-deps`."
    )


def preflight(script="lightcc_cluster.py"):
  problems = []
  if os.geteuid() != 0:
    problems.append(
      "must run as root (it creates network namespaces, veth links and tc qdiscs): "
      "sudo " + " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    )
  for tool in ("ip", "tc"):
    if shutil.which(tool) is None:
      problems.append(f"`{tool}` not found (Debian: apt-get install iproute2)")
  if problems:
    sys.exit(f"{script}: " + "\n  ".join(problems))


def start_driver(modules, script, target):
  """What a cluster benchmark's driver does first: its modules and root checked (exits saying
  what to run), then TensorFlow and this checkout's tf_ext imported. Returns (tf, tf_ext, np,
  results holding the machine report)."""
  import _common  # pylint: disable=import-outside-toplevel (a sibling: benchmarks/ is on the path)

  check_modules(modules, script, target)
  preflight(script)
  _common.use_checkout()
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  return tf, tf_ext, np, {"machine": _common.machine_report(tf, tf_ext, np)}


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    return worker(args)
  check_modules()
  preflight()
  configs = dict(CONFIGS)
  selected = [c for c in args.configs.split(",") if c]
  for extra in args.extra_config:
    name, _, body = extra.partition(":")
    configs[name] = dict(kv.split("=", 1) for kv in body.split(",") if kv)
    selected.append(name)
  unknown = [c for c in selected if c not in configs]
  if unknown:
    sys.exit(f"unknown config(s) {unknown}; known: {list(configs)}")
  args.rate_bps = rate_to_bps(args.rate)
  started = time.time()

  shapes = model_shapes(args.model, args.input_size)
  args.num_tensors = len(shapes)
  args.num_params = sum(int(__import__("math").prod(s)) for s in shapes)
  args.total_bytes = 4 * args.num_params
  args.model_desc = (
    f"{args.model} (Keras, weights=None, include_top, {args.input_size}x{args.input_size} input)"
  )
  workdir = args.workdir or tempfile.mkdtemp(prefix="lcc_cluster_")
  os.makedirs(workdir, exist_ok=True)
  spec_path = os.path.join(workdir, "spec.json")
  with open(spec_path, "w") as f:
    json.dump({"shapes": shapes}, f)

  cluster = Cluster(args.rate, args.burst, args.latency)

  def on_signal(signum, _frame):
    raise SystemExit(f"interrupted by signal {signum}")

  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGHUP, on_signal)
  if not args.keep_netns:
    atexit.register(cluster.close)
  rows, disturbed = [], []
  try:
    cluster.setup()
    print(f"Emulated cluster ({time.time() - started:.0f}s):\n{cluster.describe()}")
    print(
      f"Workload {args.model_desc}: {len(shapes)} tensors, S = {args.total_bytes / 1e6:.2f} MB; "
      f"{args.warmup} warm-up + {args.steps} timed steps per config; work dir {workdir}"
    )
    for name in selected:
      print(f"\n== {name}: {configs[name] or '(all LIGHT_* unset)'}", flush=True)
      row, replaced = run_undisturbed(
        lambda name=name: run_config(cluster, name, configs[name], args, spec_path, workdir),
        args,
        lambda row, again, seconds: show_run(row, again, seconds, args),
      )
      rows.append(row)
      disturbed += replaced
  finally:
    if args.keep_netns:
      for proc in cluster.procs:
        cluster.kill(proc)
      print(f"--keep-netns: left {cluster.netns} (remove: ip netns del NAME)")
    else:
      cluster.close()
  report(rows, args)
  if disturbed:
    print(
      f"Disturbed: {len(disturbed)} run(s) ran again, the host's steal over --max-steal "
      f"{args.max_steal:.0%}: "
      + ", ".join(
        f"{r['name']} {r['steps_per_s']:.3f} steps/s ({r['steal_share']:.0%})" for r in disturbed
      )
    )
  png = plot(rows, args)
  print(f"\nChart: {png}" if png else "\nChart: none (no configuration succeeded)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {
          "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
          "rows": rows,
          "disturbed_runs": disturbed,
        },
        f,
        indent=1,
        default=str,
      )
  print(f"Total time {time.time() - started:.0f}s; rank logs in {workdir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

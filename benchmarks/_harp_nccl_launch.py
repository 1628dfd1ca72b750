"""How harp_nccl_e2e.py launches its ranks: the plan (each rank's command, environment and files,
which --dry-run prints), the run's own MPS daemon, both ranks run and their results and NCCL logs
checked, and a transport's rounds combined (median times)."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import time

import _common
from _netns import profile_commands

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harp_nccl_e2e.py")
# Transport -> the NCCL network it must use (NCCL_NET and the name its log shows).
NETWORKS = {"harp": "HARP", "socket": "Socket"}
WORLD_SIZE = 2
RENDEZVOUS_PORT = 29500  # with --netns (fresh namespaces); on the host a free port is picked


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def worker_argv(args, transport, rank, master, result_path):
  return [
    args.python,
    "-u",
    SCRIPT,
    "--worker",
    f"--transport={transport}",
    f"--rank={rank}",
    f"--world-size={WORLD_SIZE}",
    f"--master={master}",
    f"--device={args.device}",
    f"--sizes={','.join(str(s) for s in args.sizes)}",
    f"--warmup={args.warmup}",
    f"--iters={args.iters}",
    f"--min-iters={args.min_iters}",
    f"--bytes-per-size={args.bytes_per_size}",
    f"--timeout={args.run_timeout}",
    f"--result={result_path}",
  ]


def rank_environment(args, transport, rank, ifname, log_path):
  """(variables set, inherited NCCL_*/HARP_* variables removed) for one rank."""
  removed = sorted(k for k in os.environ if k.startswith(("NCCL_", "HARP_")))
  if args.mps_control:  # the run's own daemon, not an inherited one
    removed += sorted(k for k in os.environ if k.startswith("CUDA_MPS_"))
  env = {
    "NCCL_NET": NETWORKS[transport],
    # Two "hosts" on one GPU: NCCL connects them through the network transport.
    "NCCL_HOSTID": f"harp-e2e-{transport}-rank{rank}",
    "NCCL_MULTI_RANK_GPU_ENABLE": "1",
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_IB_DISABLE": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
    "NCCL_DEBUG_FILE": log_path,
    "NCCL_SOCKET_IFNAME": ifname,
    "PYTHONUNBUFFERED": "1",
  }
  if args.mps_control:
    env.update(mps_environment(args))
  if transport == "harp":
    env["NCCL_NET_PLUGIN"] = args.plugin
    env.update(args.harp_env)
    env["HARP_IFNAME"] = ifname
  env.update(args.nccl_env)
  return env, removed


def build_plan(args, link, round_index=0):
  """Per transport: the rendezvous address and, per rank, the command, environment and files."""
  plan = {}
  suffix = f".round{round_index + 1}" if args.rounds > 1 else ""
  for index, transport in enumerate(args.transports):
    if link is not None:
      master = f"{link.addr[0]}:{RENDEZVOUS_PORT + index}"
    else:
      master = f"127.0.0.1:{free_port()}"
    ranks = []
    for rank in range(WORLD_SIZE):
      prefix = os.path.join(args.log_dir, f"{transport}{suffix}.rank{rank}")
      ifname = link.ifname[rank] if link is not None else "lo"
      env, removed = rank_environment(args, transport, rank, ifname, prefix + ".nccl.log")
      argv = worker_argv(args, transport, rank, master, prefix + ".json")
      netns = link.netns[rank] if link is not None else None
      command = ["env"] + [f"{k}={v}" for k, v in env.items()]
      command += (["ip", "netns", "exec", netns] if netns else []) + argv
      ranks.append(
        {
          "rank": rank,
          "netns": netns,
          "ifname": ifname,
          "argv": argv,
          "env": env,
          "env_removed": removed,
          "command": shlex.join(command),
          "nccl_log": prefix + ".nccl.log",
          "output": prefix + ".out",
          "result": prefix + ".json",
        }
      )
    plan[transport] = {"network": NETWORKS[transport], "master": master, "ranks": ranks}
  return plan


def print_plan(plan, args, link):
  if args.mps_control:
    print(f"# MPS: {shlex.join([args.mps_control, '-d'])} with {mps_environment(args)}; quit after")
  if link is not None:
    print(
      f"# namespaces (root): {link.netns[0]} ({link.ifname[0]} {link.addr[0]}/24) <-veth-> "
      f"{link.netns[1]} ({link.ifname[1]} {link.addr[1]}/24); tc profile {args.netns}:"
    )
    for ns, ifname in zip(link.netns, link.ifname):
      for cmd in profile_commands(args.netns, ifname, args):
        print("#   " + shlex.join(["tc", "-n", ns] + cmd))
  for transport, entry in plan.items():
    print(f"# {transport}: NCCL network {entry['network']}, rendezvous tcp://{entry['master']}")
    for r in entry["ranks"]:
      print(f"# rank {r['rank']}: environment set")
      for key, value in r["env"].items():
        print(f"#   {key}={value}")
      if r["env_removed"]:
        print(f"#   removed from the inherited environment: {' '.join(r['env_removed'])}")
      print(f"#   output {r['output']}")
      print(r["command"])


# Where GPU images keep the MPS control program when it is not on PATH.
MPS_CONTROL_FOLDERS = ("/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/bin")


def find_mps_control():
  found = shutil.which("nvidia-cuda-mps-control")
  if found:
    return found
  for folder in MPS_CONTROL_FOLDERS:
    path = os.path.join(folder, "nvidia-cuda-mps-control")
    if os.access(path, os.X_OK):
      return path
  return None


def mps_environment(args):
  """The variables that point the ranks (and the daemon) at the run's own MPS daemon. The pipe
  folder is short and in /tmp: it holds Unix sockets, whose paths are limited to 107 bytes."""
  return {
    "CUDA_MPS_PIPE_DIRECTORY": f"/tmp/harp_e2e_mps_{os.getpid()}",
    "CUDA_MPS_LOG_DIRECTORY": os.path.join(args.log_dir, "mps_log"),
  }


class MpsDaemon:
  """An MPS control daemon of this run's own, started before the ranks and told to quit after."""

  def __init__(self, args):
    self.control = args.mps_control
    self.env = dict(os.environ, **mps_environment(args))
    self.started = False

  def start(self):
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
      os.makedirs(self.env[key], exist_ok=True)
    proc = subprocess.run(
      [self.control, "-d"], env=self.env, capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
      raise SystemExit(
        f"harp_nccl_e2e: `{self.control} -d` failed ({proc.returncode}): "
        f"{(proc.stderr or proc.stdout).strip()[-500:]}; --mps off runs without MPS"
      )
    self.started = True

  def stop(self):
    if not self.started:
      return
    self.started = False
    try:
      subprocess.run(
        [self.control], input="quit\n", env=self.env, capture_output=True, text=True, timeout=60
      )
    except subprocess.TimeoutExpired:
      _common.log(
        f"MPS: the daemon did not quit within 60 s (pipe {self.env['CUDA_MPS_PIPE_DIRECTORY']})"
      )
    shutil.rmtree(self.env["CUDA_MPS_PIPE_DIRECTORY"], ignore_errors=True)


def check_log(text, network):
  """Problems with one rank's NCCL log: it must name `network`, and nothing else carried data."""
  problems = []
  if not re.search(rf"NET/{network}\b|Using network {network}\b", text):
    problems.append(f"the NCCL log never names the network {network} (no `NET/{network}`)")
  others = sorted(set(re.findall(r"Using network (\S+)", text)) - {network})
  if others:
    problems.append(f"NCCL used the network(s) {', '.join(others)}, not {network}")
  # "Channel 00/0 : 0[0] -> 1[0] [send] via NET/HARP/0"; "Channel 00 : 0[1a000] -> 1[1b000] via
  # P2P/IPC" (no [send] for P2P, SHM and the like).
  via = re.findall(r" -> \d+\[[^\]]*\](?: \[\w+\])? via (\S+)", text)
  wrong = sorted({v for v in via if not v.startswith(f"NET/{network}")})
  if wrong:
    problems.append(f"connections not made through NET/{network}: {', '.join(wrong)}")
  return problems, len(via)


def read(path):
  try:
    with open(path, errors="replace") as f:
      return f.read()
  except OSError:
    return ""


def run_transport(transport, entry, args, link):
  """Runs both ranks; {"ok", "problems", per-size figures, log facts}."""
  procs, outputs = [], []
  out = {"network": entry["network"], "problems": []}
  try:
    for r in entry["ranks"]:
      for path in (r["nccl_log"], r["result"]):
        if os.path.exists(path):
          os.remove(path)
      stream = open(r["output"], "w")
      outputs.append(stream)
      env = {k: v for k, v in os.environ.items() if k not in r["env_removed"]}
      env.update(r["env"])
      if link is not None:
        proc = link.popen(r["rank"], r["argv"], env=env, stdout=stream, stderr=subprocess.STDOUT)
      else:
        proc = subprocess.Popen(
          r["argv"], env=env, stdout=stream, stderr=subprocess.STDOUT, start_new_session=True
        )
      procs.append(proc)
    deadline = time.monotonic() + args.run_timeout + 60
    for r, proc in zip(entry["ranks"], procs):
      try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        out["problems"].append(f"rank {r['rank']} did not finish within {args.run_timeout:.0f} s")
        break
      if proc.returncode != 0:  # the other rank would wait for it until its timeout
        break
  finally:
    for proc in procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()
    for stream in outputs:
      stream.close()
    if link is not None:
      link.procs = []

  results = []
  for r, proc in zip(entry["ranks"], procs):
    result = {}
    if os.path.exists(r["result"]):
      with open(r["result"]) as f:
        result = json.load(f)
    results.append(result)
    tag = f"rank {r['rank']}"
    if result.get("error"):
      out["problems"].append(f"{tag}: {result['error']}")
    elif proc.returncode not in (0, None) and not result.get("mismatches"):
      tail = read(r["output"]).strip().splitlines()[-3:]
      out["problems"].append(f"{tag} exited {proc.returncode}: {' | '.join(tail) or 'no output'}")
    for mismatch in result.get("mismatches", []):
      out["problems"].append(f"{tag}: wrong all_reduce result: {mismatch}")
    log = read(r["nccl_log"]) + read(r["output"])  # NCCL writes to stdout if the file fails
    problems, connections = check_log(log, entry["network"])
    out["problems"] += [f"{tag}: {p} (see {r['nccl_log']})" for p in problems]
    version = re.search(r"NCCL version (\S+)", log)
    warnings = [line for line in log.splitlines() if " NCCL WARN " in line]
    out.setdefault("ranks", []).append(
      {
        "nccl_version": version.group(1) if version else None,
        "connections_via_net": connections,
        "plugin_lines": [
          line.split("NCCL INFO ", 1)[-1] for line in log.splitlines() if "NET/Plugin" in line
        ][:5],
        "warnings": warnings[:10],
        "gpu": result.get("gpu"),
        "elements_checked": result.get("elements_checked", 0),
        "nccl_log": r["nccl_log"],
        "output": r["output"],
      }
    )
  sizes = {}
  if all(res.get("ok") for res in results):
    for size in args.sizes:
      per_rank = [res["sizes"][str(size)] for res in results]
      seconds = max(p["seconds"] for p in per_rank)  # the slower rank, as a collective ends
      sizes[size] = figures(size, seconds, per_rank[0]["iters"])
  elif not out["problems"]:
    out["problems"].append("a rank did not report its results")
  out["sizes"] = sizes
  out["ok"] = not out["problems"]
  return out


def figures(size, seconds, iters):
  """One size's time and bandwidths, as nccl-tests computes them."""
  algbw = size / seconds / 1e9
  return {
    "time_us": seconds * 1e6,
    "algbw_gbs": algbw,
    "busbw_gbs": algbw * 2 * (WORLD_SIZE - 1) / WORLD_SIZE,
    "iters": iters,
  }


def combine_rounds(outs):
  """One transport's rounds as one entry: per size the median time over the rounds (bandwidths
  from it), every round's problems, and each round's own figures under "rounds"."""
  if len(outs) == 1:
    return outs[0]
  out = dict(outs[0])
  out["problems"] = [f"round {i + 1}: {p}" for i, o in enumerate(outs) for p in o["problems"]]
  out["ok"] = not out["problems"]
  out["rounds"] = [o["sizes"] for o in outs]
  out["sizes"] = {}
  if out["ok"]:
    for size, first in outs[0]["sizes"].items():
      seconds = statistics.median(o["sizes"][size]["time_us"] for o in outs) / 1e6
      out["sizes"][size] = figures(size, seconds, first["iters"])
  out["ranks"] = [
    dict(facts, elements_checked=sum(o["ranks"][i]["elements_checked"] for o in outs))
    for i, facts in enumerate(outs[0].get("ranks", []))
  ]
  return out

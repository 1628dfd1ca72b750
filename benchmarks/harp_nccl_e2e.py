#!/usr/bin/env python3
"""NCCL end to end with HARP's plugin: two PyTorch ranks on one GPU, HARP against NCCL's Socket.

Issue 12, section 3. Meant for a GPU machine with PyTorch, CUDA and NCCL (e.g. the
`nvidia-nccl-cu13` package); TensorFlow is not needed (tf_ext is not imported: the plugin is found
by path). The script itself uses only the standard library; the ranks run under --python (default:
this interpreter), which must import torch.

What runs, per transport (`harp`, then `socket`), in one invocation:
  - two rank processes (world size 2, both on cuda:--device), torch.distributed with the NCCL
    backend, rendezvous over TCP (tcp://127.0.0.1:<free port>, or the first namespace's address
    with --netns). One GPU holds both ranks: each rank gets its own NCCL_HOSTID (NCCL then sees two
    hosts and connects them through its network transport), and NCCL_MULTI_RANK_GPU_ENABLE=1 is
    set too (NCCL 2.30's switch for several ranks on one GPU). NCCL_P2P_DISABLE=1 and
    NCCL_SHM_DISABLE=1, so that all data goes through the network transport under test;
  - harp:   NCCL_NET_PLUGIN=<--plugin> NCCL_NET=HARP (HARP_IFNAME: lo, or the namespace's veth;
            the other HARP_* settings at the plugin's defaults unless --harp-env sets them: NCCL
            opens a connection per channel, and 2 channels of 4 streams (the default) ran faster
            than 2 of 8 on both emulated networks; harp_transport.py's one connection takes 8);
    socket: NCCL_NET=Socket and no plugin (NCCL_SOCKET_IFNAME: the same interface);
  - NCCL_DEBUG=INFO (subsystems INIT,NET,ENV) into one log file per rank (NCCL_DEBUG_FILE). The
    run FAILS unless every rank's log names the network (`NET/<name>` or `Using network <name>`),
    and if it names another network or shows a connection not made through NET/<name> (P2P, SHM,
    ...);
  - all_reduce (sum, float32) for each size (8 B ... 64 MiB): a check pass before and after the
    timed pass compares every element with its exact expected value (small integers); the timed
    pass (--warmup, then min(--iters, --bytes-per-size / size) iterations, at least --min-iters)
    gives the time per all_reduce (the slower rank's) and, as nccl-tests computes them,
    algbw = size / time and busbw = algbw * 2 (n - 1) / n.
Printed: the CPU and GPU, the versions, a table of busbw per size for HARP and Socket with their
ratio (measured in the same run). The exit status is non-zero on any failure (a rank's error,
a wrong element, a log that does not show the expected network).

MPS: one GPU runs the processes of two ranks in turns (time slices of milliseconds), so without
NVIDIA's Multi-Process Service every all_reduce takes a few milliseconds whatever its size and the
network is invisible (an H100 gave 4.5 ms per all_reduce from 8 B to 4 MiB, both transports).
--mps auto (the default) therefore starts an MPS control daemon of the run's own (private pipe and
log folders, stopped at the end) when `nvidia-cuda-mps-control` is found, and warns when it is
not; --mps on makes a missing one an error, --mps off runs without.

--rounds N runs each transport N times, alternating which goes first, and reports per size the
median time over the rounds (each round's figures are in --json).

--netns aggregate|cloud (root; `ip`, `tc`): each rank in one of two network namespaces joined by
a veth pair, shaped with the profiles of benchmarks/harp_transport.py (its Link and tc commands
are used as they are): aggregate = tbf at --aggregate-rate; cloud = that aggregate plus a per-flow
cap (--flow-rate) through htb classes selected by the TCP source port.

--plot PATH draws busbw per size (and HARP/Socket) as a PNG; --chart-from R1.json R2.json ...
--plot PATH redraws such a chart from the --json files of earlier runs (e.g. one per profile, as
docs/benchmarks.md's chart), without running anything.

--dry-run prints, for each transport and rank, the exact command and the environment it would get
(and the namespace and tc set-up with --netns), launching nothing: it runs without GPU or torch.

  python3 benchmarks/harp_nccl_e2e.py                            # loopback, 8 B ... 64 MiB
  python3 benchmarks/harp_nccl_e2e.py --quick --json /tmp/e2e.json
  python3 benchmarks/harp_nccl_e2e.py --rounds 3 --netns cloud   # as docs/benchmarks.md's ran
  sudo python3 benchmarks/harp_nccl_e2e.py --netns cloud         # the emulated cloud network
  python3 benchmarks/harp_nccl_e2e.py --dry-run --plugin /path/to/libnccl-net-harp.so
"""

import importlib.metadata
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import _common
import harp_transport

SCRIPT = os.path.abspath(__file__)
DEFAULT_PLUGIN = os.path.join(_common.REPO, "tf_ext", "harp", "libnccl-net-harp.so")
KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = [8, 256, 4 * KIB, 64 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [8, 64 * KIB, MIB, 4 * MIB]
# Transport -> the NCCL network it must use (NCCL_NET and the name its log shows).
NETWORKS = {"harp": "HARP", "socket": "Socket"}
WORLD_SIZE = 2
RENDEZVOUS_PORT = 29500  # with --netns (fresh namespaces); on the host a free port is picked
# Where GPU images keep the MPS control program when it is not on PATH.
MPS_CONTROL_FOLDERS = ("/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/bin")


def human(size):
  if size >= MIB:
    return f"{size // MIB} MiB"
  return f"{size // KIB} KiB" if size >= KIB else f"{size} B"


# ---------------------------------------------------------------------------- the plan (dry run)


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
      for cmd in harp_transport.profile_commands(args.netns, ifname, args):
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


# ------------------------------------------------------------------------------------------ MPS


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


# ----------------------------------------------------------------------------------- the ranks


def pattern(torch, n, rank, device):
  """Small integers (exact in float32, and so is their sum over the ranks)."""
  base = torch.arange(n, device=device, dtype=torch.int64) % 1021 + 1
  return (base + 4096 * rank).to(torch.float32)


def iterations(size, args):
  return max(min(args.min_iters, args.iters), min(args.iters, args.bytes_per_size // size))


def worker_main(argv):
  p = _common.argument_parser("One rank of harp_nccl_e2e.py (started by it).")
  p.add_argument("--transport", required=True, choices=sorted(NETWORKS))
  p.add_argument("--rank", type=int, required=True)
  p.add_argument("--world-size", type=int, required=True)
  p.add_argument("--master", required=True)
  p.add_argument("--device", type=int, default=0)
  p.add_argument("--sizes", required=True)
  p.add_argument("--warmup", type=int, required=True)
  p.add_argument("--iters", type=int, required=True)
  p.add_argument("--min-iters", type=int, required=True)
  p.add_argument("--bytes-per-size", type=int, required=True)
  p.add_argument("--timeout", type=float, required=True)
  p.add_argument("--result", required=True)
  args = p.parse_args(argv)
  args.sizes_list = _common.int_list(args.sizes)
  result = {"rank": args.rank, "transport": args.transport, "sizes": {}, "ok": False}
  try:
    run_rank(args, result)
  except BaseException as error:  # the launcher reads the reason from the result file
    result["error"] = f"{type(error).__name__}: {error}"
    result["traceback"] = traceback.format_exc()
    traceback.print_exc()
  with open(args.result, "w") as f:
    json.dump(result, f, indent=2)
  return 0 if result["ok"] else 1


def run_rank(args, result):
  import datetime

  import torch
  import torch.distributed as dist

  device = torch.device("cuda", args.device)
  torch.cuda.set_device(device)
  result["gpu"] = torch.cuda.get_device_name(device)
  options = {
    "backend": "nccl",
    "init_method": f"tcp://{args.master}",
    "rank": args.rank,
    "world_size": args.world_size,
    "timeout": datetime.timedelta(seconds=args.timeout),
  }
  if "device_id" in inspect.signature(dist.init_process_group).parameters:
    options["device_id"] = device  # NCCL initialises now, not at the first collective
  dist.init_process_group(**options)
  world = dist.get_world_size()
  mismatches = []

  def check(size, when):
    n = size // 4
    x = pattern(torch, n, args.rank, device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    expected = sum(pattern(torch, n, r, device) for r in range(world))
    torch.cuda.synchronize(device)
    wrong = (x != expected).nonzero()
    if wrong.numel():
      i = int(wrong[0, 0])
      mismatches.append(
        f"{human(size)} ({when} the timed pass): {wrong.numel()} of {n} elements wrong, first "
        f"at {i}: {float(x[i])} instead of {float(expected[i])}"
      )
    return n

  sync = torch.zeros(1, device=device)
  for size in args.sizes_list:
    n = check(size, "before")
    buf = torch.zeros(n, dtype=torch.float32, device=device)  # zeros stay zeros: no overflow
    for _ in range(args.warmup):
      dist.all_reduce(buf)
    dist.all_reduce(sync)  # both ranks start the timed pass together
    torch.cuda.synchronize(device)
    iters = iterations(size, args)
    start = time.perf_counter()
    for _ in range(iters):
      dist.all_reduce(buf)
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / iters
    check(size, "after")
    result["sizes"][str(size)] = {"seconds": seconds, "iters": iters}
  dist.destroy_process_group()
  result["mismatches"] = mismatches
  result["elements_checked"] = sum(2 * (s // 4) for s in args.sizes_list)
  result["ok"] = not mismatches


def probe_main(argv):
  """In the ranks' Python: can it run them? One JSON line (versions, GPU) or the reason not."""
  device = int(argv[0]) if argv else 0
  info = {}
  try:
    import torch
  except ImportError as error:
    info["error"] = f"PyTorch is not importable ({error})"
  except Exception as error:  # e.g. a CUDA library that does not load
    info["error"] = f"importing PyTorch failed ({type(error).__name__}: {error})"
  if "error" in info:
    print(json.dumps(info))
    return 3
  info["torch"] = torch.__version__
  info["cuda"] = torch.version.cuda
  import torch.distributed as dist

  if not torch.cuda.is_available():
    info["error"] = f"PyTorch {torch.__version__} sees no CUDA GPU (CUDA {torch.version.cuda})"
  elif not (dist.is_available() and dist.is_nccl_available()):
    info["error"] = f"PyTorch {torch.__version__} has no NCCL backend for torch.distributed"
  elif device >= torch.cuda.device_count():
    info["error"] = f"--device {device}: only {torch.cuda.device_count()} GPU(s)"
  if "error" in info:
    print(json.dumps(info))
    return 4
  props = torch.cuda.get_device_properties(device)
  version = torch.cuda.nccl.version()
  info.update(
    gpu=props.name,
    gpu_memory_gib=round(props.total_memory / 2**30, 1),
    capability=f"{props.major}.{props.minor}",
    gpus=torch.cuda.device_count(),
    nccl=".".join(str(v) for v in version) if isinstance(version, tuple) else str(version),
  )
  for package in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
    try:
      info[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  print(json.dumps(info))
  return 0


# -------------------------------------------------------------------------------- the launcher


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
        proc = link.popen(r["rank"], r["argv"], env, stdout=stream, stderr=subprocess.STDOUT)
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


def report(results, transports):
  print()
  header = f"{'size':>8s}"
  for t in transports:
    n = NETWORKS[t]
    header += f" {n + ' time us':>15s} {n + ' algbw':>12s} {n + ' busbw':>12s}"
  both = len(transports) == 2 and all(results[t]["ok"] for t in transports)
  if both:
    header += f" {'busbw ratio':>11s}"
  print(header + ("   (GB/s = 1e9 B/s)" if transports else ""))
  sizes = sorted({s for t in transports for s in results[t]["sizes"]})
  for size in sizes:
    line = f"{human(size):>8s}"
    for t in transports:
      d = results[t]["sizes"].get(size)
      if d:
        line += f" {d['time_us']:15.1f} {d['algbw_gbs']:12.3f} {d['busbw_gbs']:12.3f}"
      else:
        line += f" {'-':>15s} {'-':>12s} {'-':>12s}"
    if both:
      a, b = (results[t]["sizes"][size]["busbw_gbs"] for t in transports)
      line += f" {a / b:10.2f}x"
    print(line)
  print()
  for t in transports:
    r = results[t]
    facts = r.get("ranks", [])
    conns = [f["connections_via_net"] for f in facts]
    checked = sum(f["elements_checked"] for f in facts)
    status = "ok" if r["ok"] else "FAILED"
    print(
      f"{t:>6s}: {status}; NCCL {facts[0]['nccl_version'] if facts else '?'}; connections via "
      f"NET/{r['network']} per rank {conns}; {checked:,} elements checked"
    )
    for line in dict.fromkeys(line for f in facts for line in f["plugin_lines"]):
      print(f"        {line}")
    for problem in r["problems"]:
      print(f"        FAILED: {problem}")
    if not r["ok"]:
      for f in facts:
        for w in f["warnings"][:5]:
          print(f"        {w.strip()}")


PROFILE_STYLES = {None: "-", "cloud": "--", "aggregate": ":"}


def draw_chart(runs, path):
  """busbw per size of each run's transports (one line style per network profile), and their
  ratio. `runs`: the results of one or more runs, as --json writes them."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (bw_axis, ratio_axis) = plt.subplots(1, 2, figsize=(14, 4.8))
  all_sizes = set()
  for run_index, run in enumerate(runs):
    settings = run["settings"]
    profile = settings.get("netns")
    where = profile or "loopback"
    style = PROFILE_STYLES.get(profile, "-")
    for index, (transport, entry) in enumerate(run["transports"].items()):
      sizes = sorted(int(size) for size in entry.get("sizes", {}))
      all_sizes.update(sizes)
      busbw = [entry["sizes"][str(size)]["busbw_gbs"] for size in sizes]
      label = f"{NETWORKS[transport]} ({where})"
      bw_axis.plot(sizes, busbw, style, marker="o", color=f"C{index}", label=label)
    ratio = run.get("busbw_ratio")
    if ratio:
      sizes = sorted(int(size) for size in ratio)
      ratio_axis.plot(
        sizes,
        [ratio[str(size)] for size in sizes],
        style,
        marker="o",
        color=f"C{2 + run_index}",
        label=where,
      )
  ticks = sorted(all_sizes)
  for axis in (bw_axis, ratio_axis):
    axis.set_xscale("log", base=2)
    axis.set_xticks(ticks, [human(size) for size in ticks], fontsize=8)
    axis.set_xlabel("all_reduce size (float32, 2 ranks)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
  bw_axis.set_yscale("log")
  bw_axis.set_title("bus bandwidth (GB/s)")
  ratio_axis.axhline(1.0, color="black", linewidth=0.8)
  ratio_axis.set_title("busbw HARP / Socket (same run)")
  first = runs[0]["machine"]
  rounds = {run["settings"].get("rounds", 1) for run in runs}
  fig.suptitle(
    f"NCCL {first.get('nccl')} all_reduce, 2 ranks on one {first.get('gpu')} (MPS), HARP vs "
    f"NCCL's Socket; median of {'/'.join(str(r) for r in sorted(rounds))} round(s)"
  )
  _common.save_figure(fig, plt, path, dpi=110)


def chart_from(paths, plot):
  runs = []
  for path in paths:
    with open(path) as f:
      run = json.load(f)
    if "transports" not in run or "settings" not in run or run.get("dry_run"):
      raise SystemExit(f"harp_nccl_e2e: {path} is not the --json of a run")
    runs.append(run)
  try:
    draw_chart(runs, plot)
  except ImportError as error:
    raise SystemExit(
      f"harp_nccl_e2e: --chart-from needs matplotlib ({error}): `make bench-deps` installs it "
      "into .venv (then run this with .venv/bin/python), or pip install matplotlib"
    ) from None
  print(f"chart        : {plot} (from {', '.join(paths)})")
  return 0


def parse_args(argv):
  p = _common.argument_parser(__doc__)
  p.add_argument("--plugin", default=DEFAULT_PLUGIN, help="HARP's plugin library")
  p.add_argument("--python", default=sys.executable, help="the Python (with torch) of the ranks")
  p.add_argument("--transports", default="harp,socket", help="harp and/or socket")
  p.add_argument("--device", type=int, default=0, help="the CUDA device of both ranks")
  p.add_argument("--sizes", help="all_reduce sizes in bytes, multiples of 4 (default 8 B..64 MiB)")
  p.add_argument("--quick", action="store_true", help="a few sizes and iterations")
  p.add_argument("--warmup", type=int, help="untimed all_reduces per size (default 5)")
  p.add_argument("--iters", type=int, help="timed all_reduces per size, at most (default 20)")
  p.add_argument("--min-iters", type=int, default=3, help="timed all_reduces per size, at least")
  p.add_argument(
    "--bytes-per-size", type=int, default=1 << 30, help="caps the timed iterations of big sizes"
  )
  p.add_argument("--run-timeout", type=float, default=600, help="seconds for one transport's run")
  p.add_argument("--rounds", type=int, default=1, help="runs per transport, alternating the order")
  p.add_argument(
    "--mps",
    choices=("auto", "on", "off"),
    default="auto",
    help="a private MPS daemon for the run (auto: when nvidia-cuda-mps-control is found)",
  )
  p.add_argument("--netns", choices=("aggregate", "cloud"), help="ranks in two namespaces (root)")
  p.add_argument("--aggregate-rate", default="4gbit", help="--netns: tc rate of the aggregate cap")
  p.add_argument("--flow-rate", default="1gbit", help="--netns cloud: tc rate per flow")
  p.add_argument("--flow-classes", type=int, default=64, help="--netns cloud: per-flow classes")
  p.add_argument("--no-profile-check", action="store_true", help="skip the TCP check of --netns")
  p.add_argument(
    "--harp-env", action="append", default=[], metavar="NAME=VALUE", help="a HARP_* setting"
  )
  p.add_argument(
    "--nccl-env",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="an NCCL_* setting for both transports' ranks (after the script's own)",
  )
  p.add_argument("--log-dir", help="NCCL logs and rank outputs (default: a new folder in /tmp)")
  p.add_argument("--dry-run", action="store_true", help="print the commands; launch nothing")
  p.add_argument("--plot", help="a PNG chart of the run (or of --chart-from's runs)")
  p.add_argument(
    "--chart-from", nargs="+", metavar="JSON", help="redraw --plot from earlier runs' --json"
  )
  _common.add_json(p)
  args = p.parse_args(argv)
  args.sizes = _common.int_list(args.sizes) if args.sizes else None
  args.sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
  if any(s < 4 or s % 4 for s in args.sizes):
    p.error("--sizes: float32 all_reduces, so multiples of 4 bytes (at least 4)")
  args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
  args.iters = args.iters or (5 if args.quick else 20)
  args.transports = [t for t in args.transports.split(",") if t]
  if not args.transports or any(t not in NETWORKS for t in args.transports):
    p.error("--transports: harp and/or socket")
  if len(set(args.transports)) != len(args.transports):
    p.error("--transports: each at most once")
  for option, prefix in (("harp_env", "HARP_"), ("nccl_env", "NCCL_")):
    env = {}
    for item in getattr(args, option):
      name, sep, value = item.partition("=")
      if not sep or not name.startswith(prefix):
        p.error(f"--{option.replace('_', '-')} {item}: expected {prefix}NAME=VALUE")
      env[name] = value
    setattr(args, option, env)
  if args.warmup < 0:
    p.error("--warmup must be >= 0")
  _common.require_positive(p, args, ["iters", "min_iters", "bytes_per_size", "rounds"])
  args.plugin = os.path.abspath(args.plugin)
  args.log_dir = os.path.abspath(
    args.log_dir or os.path.join(tempfile.gettempdir(), f"harp_nccl_e2e_{os.getpid()}")
  )
  args.quick = bool(args.quick)  # harp_transport.check_profile reads it
  args.mps_control = find_mps_control() if args.mps != "off" else None
  return args


def preflight(args):
  """Everything checked before anything starts: root and tools, the plugin, torch and the GPU."""
  problems = []
  if args.netns:
    if os.geteuid() != 0:
      problems.append("--netns needs root (network namespaces, veth, tc): run it with sudo")
    for tool in ("ip", "tc"):
      if shutil.which(tool) is None:
        problems.append(f"--netns needs `{tool}`, which is not installed")
  if "harp" in args.transports and not os.path.isfile(args.plugin):
    problems.append(
      f"HARP's plugin {args.plugin} does not exist: build it (`make build`) or pass --plugin PATH"
    )
  if args.mps == "on" and not args.mps_control:
    problems.append(
      "--mps on: nvidia-cuda-mps-control is neither on PATH nor in "
      + ", ".join(MPS_CONTROL_FOLDERS)
    )
  if problems:
    raise SystemExit("harp_nccl_e2e: " + "; ".join(problems))
  proc = subprocess.run(
    [args.python, SCRIPT, "--probe", str(args.device)], capture_output=True, text=True
  )
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  info = json.loads(lines[-1]) if lines else {"error": (proc.stderr.strip() or "no output")[-2000:]}
  if proc.returncode != 0 or "error" in info:
    raise SystemExit(
      f"harp_nccl_e2e: the ranks' Python ({args.python}) cannot run them: {info['error']}. This "
      "check needs a GPU machine with PyTorch (CUDA) and NCCL, e.g. `pip install torch "
      "nvidia-nccl-cu13`; --python PATH picks another interpreter; --dry-run prints the commands "
      "without running them."
    )
  return info


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["--worker"]:
    return worker_main(argv[1:])
  if argv[:1] == ["--probe"]:
    return probe_main(argv[1:])
  args = parse_args(argv)
  if args.chart_from:
    if not args.plot:
      raise SystemExit("harp_nccl_e2e: --chart-from needs --plot PATH")
    return chart_from(args.chart_from, args.plot)
  link = harp_transport.Link(os.getpid()) if args.netns else None
  plan = build_plan(args, link)
  if args.dry_run:
    print_plan(plan, args, link)
    if "harp" in args.transports and not os.path.isfile(args.plugin):
      print(f"# note: {args.plugin} does not exist yet (make build)")
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"dry_run": True, "plugin": args.plugin, "transports": plan}, f, indent=2)
    return 0

  info = preflight(args)
  wall_start = time.perf_counter()
  model, flags = _common.cpu_model_and_flags(harp_transport.CPU_FLAGS)
  print(f"machine      : {model}, {_common.cpus_available()} CPUs available")
  print(
    f"GPU          : {info['gpu']} (compute {info['capability']}, {info['gpu_memory_gib']} GiB; "
    f"{info['gpus']} GPU(s), both ranks on cuda:{args.device})"
  )
  packages = ", ".join(f"{k} {v}" for k, v in info.items() if k.startswith("nvidia-nccl"))
  print(
    f"versions     : Python ({args.python}), torch {info['torch']}, CUDA {info['cuda']}, "
    f"NCCL {info['nccl']} (torch's){', ' + packages if packages else ''}"
  )
  print(f"plugin       : {args.plugin}")
  print(
    f"workload     : all_reduce sum float32, {', '.join(human(s) for s in args.sizes)}; "
    f"{args.warmup} warm-up, min({args.iters}, {human(args.bytes_per_size)}/size) timed "
    f"(>= {args.min_iters}); checked before and after"
  )
  os.makedirs(args.log_dir, exist_ok=True)
  print(f"logs         : {args.log_dir}")
  if args.mps_control:
    print(f"MPS          : a daemon of the run's own ({args.mps_control})")
  else:
    print(
      "MPS          : off. WARNING: the two ranks take turns on the GPU (time slices), so the "
      "times below are mostly the GPU's context switches, not the network"
      + ("" if args.mps == "off" else " (nvidia-cuda-mps-control not found)")
    )
  if args.rounds > 1:
    print(f"rounds       : {args.rounds}, alternating which transport goes first; median times")
  results = {
    "machine": {"cpu": model, "cpus": _common.cpus_available(), "cpu_flags": flags, **info},
    "settings": {
      "plugin": args.plugin,
      "sizes": args.sizes,
      "warmup": args.warmup,
      "iters": args.iters,
      "netns": args.netns,
      "aggregate_rate": args.aggregate_rate if args.netns else None,
      "flow_rate": args.flow_rate if args.netns == "cloud" else None,
      "harp_env": args.harp_env,
      "nccl_env": args.nccl_env,
      "mps": bool(args.mps_control),
      "rounds": args.rounds,
    },
    "commands": {t: [r["command"] for r in e["ranks"]] for t, e in plan.items()},
    "transports": {},
  }

  def on_signal(signum, _frame):
    raise SystemExit(f"interrupted by signal {signum}")

  signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGHUP, on_signal)
  mps = MpsDaemon(args) if args.mps_control else None
  runs = {t: [] for t in args.transports}
  try:
    if mps is not None:
      mps.start()
    if link is not None:
      link.setup()
      link.apply(args.netns, args)
      print(
        f"link         : {link.netns[0]} {link.ifname[0]} {link.addr[0]} <-> "
        f"{link.netns[1]} {link.ifname[1]} {link.addr[1]}, profile {args.netns}"
      )
      if not args.no_profile_check:
        results["profile_check"] = harp_transport.check_profile(link, args.netns, args)
    for index in range(args.rounds):
      round_plan = plan if index == 0 else build_plan(args, link, index)
      for transport in _common.rotated(args.transports, index):
        progress = f" (round {index + 1}/{args.rounds})" if args.rounds > 1 else ""
        _common.log(f"{transport}: 2 ranks, NCCL_NET={NETWORKS[transport]}{progress}")
        runs[transport].append(run_transport(transport, round_plan[transport], args, link))
      if not all(r[-1]["ok"] for r in runs.values()):
        break  # the next rounds would fail alike
  finally:
    if link is not None:
      link.close()
    if mps is not None:
      mps.stop()
  for transport, outs in runs.items():
    results["transports"][transport] = combine_rounds(outs)

  report(results["transports"], args.transports)
  ok = [t for t in args.transports if results["transports"][t]["ok"]]
  if len(ok) == 2:
    a, b = (results["transports"][t]["sizes"] for t in args.transports)
    ratios = [a[s]["busbw_gbs"] / b[s]["busbw_gbs"] for s in args.sizes]
    results["busbw_ratio"] = {str(s): r for s, r in zip(args.sizes, ratios)}
    big = [r for s, r in zip(args.sizes, ratios) if s >= MIB]
    print(
      f"busbw {NETWORKS[args.transports[0]]}/{NETWORKS[args.transports[1]]} (same run): median "
      f"{statistics.median(ratios):.2f}x"
      + (f", messages >= 1 MiB {min(big):.2f}x ... {max(big):.2f}x" if big else "")
    )
    rounds = [results["transports"][t].get("rounds") for t in args.transports]
    if big and all(rounds):
      per_round = [
        statistics.median(x[s]["busbw_gbs"] / y[s]["busbw_gbs"] for s in args.sizes if s >= MIB)
        for x, y in zip(*rounds)
      ]
      print(
        "  per round, median over messages >= 1 MiB: " + ", ".join(f"{r:.2f}x" for r in per_round)
      )
  for entry in results["transports"].values():
    entry["sizes"] = {str(k): v for k, v in entry["sizes"].items()}
    for index, sizes in enumerate(entry.get("rounds", [])):
      entry["rounds"][index] = {str(k): v for k, v in sizes.items()}
  if args.plot and ok:
    _common.write_chart(args.plot, results, lambda path: draw_chart([results], path))
  _common.finish(results, args.json, wall_start)
  failed = [t for t in args.transports if t not in ok]
  if failed:
    print(f"FAILED: {', '.join(failed)} (see above; logs in {args.log_dir})")
    return 1
  print(f"PASSED: {', '.join(NETWORKS[t] for t in ok)}: logs name the network, all results exact")
  return 0


if __name__ == "__main__":
  sys.exit(main())

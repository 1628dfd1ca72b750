#!/usr/bin/env python3
"""NCCL end to end with HARP's plugin: two PyTorch ranks on one GPU, HARP against NCCL's Socket.

Meant for a GPU machine with PyTorch, CUDA and NCCL (e.g. the
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

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _common
import _report
import _rounds
from _harp_nccl_launch import (
  MPS_CONTROL_FOLDERS,
  NETWORKS,
  MpsDaemon,
  build_plan,
  combine_rounds,
  find_mps_control,
  print_plan,
  run_transport,
)
from _harp_nccl_report import chart_from, draw_chart, report
from _netns import TransportLink, check_profile, exit_on_signals, missing_for_netns
from _report import size_label as human

SCRIPT = os.path.abspath(__file__)
DEFAULT_PLUGIN = os.path.join(_common.REPO, "tf_ext", "harp", "libnccl-net-harp.so")
KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = [8, 256, 4 * KIB, 64 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [8, 64 * KIB, MIB, 4 * MIB]


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
  args.quick = bool(args.quick)  # _netns.check_profile reads it
  args.mps_control = find_mps_control() if args.mps != "off" else None
  return args


def preflight(args):
  """Everything checked before anything starts: root and tools, the plugin, torch and the GPU."""
  problems = []
  if args.netns:
    problems += [f"--netns: {problem}" for problem in missing_for_netns("run it with sudo")]
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
  if argv[:1] in (["--worker"], ["--probe"]):
    import _harp_nccl_worker  # pylint: disable=import-outside-toplevel

    run = _harp_nccl_worker.worker_main if argv[0] == "--worker" else _harp_nccl_worker.probe_main
    return run(argv[1:])
  args = parse_args(argv)
  if args.chart_from:
    if not args.plot:
      raise SystemExit("harp_nccl_e2e: --chart-from needs --plot PATH")
    return chart_from(args.chart_from, args.plot)
  link = TransportLink(os.getpid()) if args.netns else None
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
  machine = _report.cpu_report(_report.TRANSPORT_CPU_FLAGS, system=False, features=False)
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
    "machine": {**machine, **info},
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

  exit_on_signals(interrupt=True)
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
        results["profile_check"] = check_profile(link, args.netns, args)
    for index in range(args.rounds):
      round_plan = plan if index == 0 else build_plan(args, link, index)
      for transport in _rounds.rotated(args.transports, index):
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
    _report.write_chart(args.plot, results, lambda path: draw_chart([results], path))
  _report.finish(results, args.json, wall_start)
  failed = [t for t in args.transports if t not in ok]
  if failed:
    print(f"FAILED: {', '.join(failed)} (see above; logs in {args.log_dir})")
    return 1
  print(f"PASSED: {', '.join(NETWORKS[t] for t in ok)}: logs name the network, all results exact")
  return 0


if __name__ == "__main__":
  sys.exit(main())

#!/usr/bin/env python3
"""HARP against a stand-in for NCCL's default socket transport, across two network namespaces.

Needs root (network namespaces, a veth pair, tc qdiscs), `ip`, `tc` and g++.

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
Ratios are HARP/baseline of the same run. Targets (informational, exit status 0):
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
import os
import sys
import time

import _common
import _report
import _rounds
from _harp_plugin_pair import (
  BASELINE_SOURCE,
  DRIVER_SOURCE,
  compile_cc,
  harp_env,
  harp_plugin_path,
  merge_rounds,
  run_pair,
)
from _harp_transport_report import (
  TARGETS,
  draw_chart,
  report_profile,
  unreachable_throughput,
  verdicts,
)
from _netns import TransportLink, check_profile, exit_on_signals, missing_for_netns, rate_bps
from _report import size_label as human

KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
QUICK_SIZES = [64 * KIB, MIB, 4 * MIB]


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
    args.plot = _report.chart_path("harp_transport.png")
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
      rate_bps(args.aggregate_rate)
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


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  problems = missing_for_netns("use `make bench-harp`", tools=("ip", "tc", "g++"))
  if problems:
    raise SystemExit("harp_transport: " + "; ".join(problems))
  wall_start = time.perf_counter()
  machine = _report.cpu_report(_report.TRANSPORT_CPU_FLAGS, system=False)

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

  link = TransportLink(os.getpid())
  exit_on_signals(interrupt=True)
  atexit.register(link.close)
  results = {
    "machine": machine,
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
        for name in _rounds.rotated(names, round_index):
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
      print(f"  {what:58s} {ratio:6.2f}x  target {sign} {target}x  {_report.verdict(met)}")
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
    _report.write_chart(
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
  _report.finish(results, args.json, wall_start)
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

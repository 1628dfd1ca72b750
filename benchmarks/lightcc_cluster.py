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
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _horovod_cluster  # noqa: E402
import _report  # noqa: E402

# Also the names tests/lightcc/test_faults.py builds its cluster from.
from _horovod_cluster import (  # noqa: E402, F401
  IFACE,
  NODES,
  RANKS_PER_NODE,
  RENDEZVOUS_CODE,
  WORLD,
  Cluster,
  sh,
)
from _netns import exit_on_signals, rate_bps  # noqa: E402

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
  results, failure = _horovod_cluster.launch_ranks(
    cluster, argv, env_light, result_dir, args.timeout
  )
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
    "steal_share": _horovod_cluster.steal_share(results[0]["counters"]),
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
  path = args.out or _report.chart_path("lightcc_cluster.png")
  _report.save_figure(fig, plt, path, dpi=110)
  return os.path.abspath(path)


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
  _horovod_cluster.add_steal_options(p)
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
  _horovod_cluster.check_steal_options(p, args)
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    import _lightcc_cluster_worker  # pylint: disable=import-outside-toplevel

    return _lightcc_cluster_worker.worker(args)
  _horovod_cluster.check_modules()
  _horovod_cluster.preflight()
  configs = dict(CONFIGS)
  selected = [c for c in args.configs.split(",") if c]
  for extra in args.extra_config:
    name, _, body = extra.partition(":")
    configs[name] = dict(kv.split("=", 1) for kv in body.split(",") if kv)
    selected.append(name)
  unknown = [c for c in selected if c not in configs]
  if unknown:
    sys.exit(f"unknown config(s) {unknown}; known: {list(configs)}")
  args.rate_bps = rate_bps(args.rate)
  started = time.time()

  shapes = model_shapes(args.model, args.input_size)
  args.num_tensors = len(shapes)
  args.num_params = sum(int(math.prod(s)) for s in shapes)
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

  exit_on_signals()
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
      row, replaced = _horovod_cluster.run_undisturbed(
        lambda name=name: run_config(cluster, name, configs[name], args, spec_path, workdir),
        args,
        lambda row, again, seconds: show_run(row, again, seconds, args),
      )
      rows.append(row)
      disturbed += replaced
  finally:
    if args.keep_netns:
      cluster.kill_all()
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
    _report.write_json(
      args.json,
      {
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "rows": rows,
        "disturbed_runs": disturbed,
      },
      indent=1,
      default=str,
    )
  print(f"Total time {time.time() - started:.0f}s; rank logs in {workdir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

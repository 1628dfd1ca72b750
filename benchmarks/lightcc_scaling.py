#!/usr/bin/env python3
"""LightCC's scaling efficiency on an emulated cluster whose compute sleeps like a GPU.

Needs root (network namespaces, a veth link, tc qdiscs) and `ip` / `tc`: the cluster is
that of _horovod_cluster.py (2 netns nodes x RANKS ranks, one tbf-shaped veth between them, ranks
launched as `horovodrun --gloo` launches them).

Emulated compute. Each Keras layer with weights of the profile's model (tf.keras.applications,
weights=None, 224x224 input: VGG16 138,357,544 trainable parameters, ResNet50 25,583,592) is one
unit with a forward and a backward time; units without multiply-adds (batch norm) take no time. The
rule: a unit's share of the step is its multiply-adds per image (Conv2D: out_h * out_w * kh * kw *
c_in * c_out; Dense: c_in * c_out) over the model's; forward takes 1/3 of the step and backward 2/3
(backward computes the gradients of both the input and the weights). Each unit's time is a
`tf.numpy_function` that sleeps (the core is free meanwhile) on a per-process "device clock" that
runs like a GPU stream fed ahead by the CPU (--clock stream, the default): a unit starts when the
previous one ends, so neither a sleep's overshoot nor the CPU's late dispatch of the next unit (4
ranks share 2 cores) adds up over the step; only a step's first unit waits for its launch. --clock
launch starts a unit no earlier than its numpy_function runs, which charges the compute for the
ranks' CPU contention. Each unit's gradients are the unit's stored
gradient (read from a variable: no arithmetic) with a data dependency on that unit's backward sleep,
which depends on the next unit's backward: gradients become ready in backprop order, last layer
first, as on a GPU. A unit without time shares the sleeps of the next unit that takes time (it
follows that unit's backward anyway), and the timed steps record nothing per gradient: one more
step after them, untimed, records when each reduced gradient was there. That keeps the emulation's
own CPU small (ResNet50 in one process without sleeps: 9 ms a step; 53 ms with a numpy_function
per batch norm and per gradient). Each step is a real (LightCC or
Horovod) DistributedGradientTape over these gradients, then an in-place SGD update
(ResourceApplyGradientDescent, the only CPU work besides the exchange).

Seed ratio and scaling. One V100 step at batch 128: VGG16 0.51 s (251 images/s, the
seed); ResNet50 0.356 s (360 images/s, an assumption: the order of published fp32 TensorFlow
figures for one V100, not measured here). The seed's cluster has two nodes joined by 25 Gbit/s, on
which the allreduce lower bound per node and direction is S (the gradient bytes): 0.177 s for
VGG16 (S = 553 MB), so compute / link = 2.88; ResNet50 (S = 102.3 MB) 10.9. Two shared CPU
cores cannot move 553 MB per step through Gloo in a fraction of a second, so the benchmark keeps
that ratio on a smaller problem: every gradient is shrunk by --shrink (a tensor of n floats
becomes a 1-D tensor of ceil(n / shrink) floats; --shrink 1 keeps the model's exact shapes), the
link runs at --rate, and the one-device step is set to ratio * (S / shrink) / rate. What this does
not scale: the ranks' own CPU work (in-node exchange over loopback, top-k selection, the update)
that NVLink and the GPU do on the seed, and the 8 GPUs per node (2 or 4 ranks here).
--seed-link sets the seed's link (25gbit); 1gbit asks what the same GPUs would keep on an
ordinary 1 Gbit/s network (VGG16: compute/link 0.115), which the emulated link reproduces at
--rate 100mbit with 10x the bytes' time. --rate uncapped removes the tbf (the veth as fast as the
CPUs move it) and keeps the compute of --scale-rate (1gbit).

Efficiency = (N-rank images/s) / (N x one-rank images/s), the one-rank run being the same
emulated compute and update in one process without Horovod; images/s = 128 * ranks / step time.

Horovod's timeline is off in the timed runs: HOROVOD_TIMELINE=DYNAMIC alone, never started,
slows a step (a VGG16 step of 2D + TOPK by about 11 %). Each profile's Horovod and best LightCC
configuration run once more with it on, for one extra step inside hvd.start_timeline after
their warm-up: the timeline chart (second chart: rank 0's forward and backward spans, per
gradient the time from ready, its unit's backward ended, to reduced, handed to the update, and
the collectives, aligned on the barrier before the step) and the table's collective columns come
from that step.

Noise. The 4 ranks use most of the 2 cores (about 100 ms of CPU per rank in a 0.25 s ResNet50
step), so a run is slower when the hypervisor lends the machine's CPUs to others (steal time in
/proc/stat; 20 % steal makes a ResNet50 step some 40 % longer). Each run prints the host's steal
share over its timed steps, and a run over --max-steal (5 %) is run again
(--steal-retries, 2; when every try was over, the one with the least steal is kept). It also
prints its CPU time per step and, per step, its TCP retransmits, tail loss probes (an ACK came
late, as when a vCPU waits) and timeouts, and the packets its link's tbf dropped. The verdict of
fusion against its best fixed size gives its standard error over the runs, and says so when the
target lies within two of them.

  make bench-scaling                                     # VGG16 and ResNet50, every config
  make bench-scaling BENCH_ARGS=--quick                  # 2-4 min: VGG16, 3 configs
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --profiles vgg16 --configs horovod,2d+topk
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --ranks-per-node 4 --quick
  # the same V100s on an ordinary 1 Gbit/s network, at a tenth of the time scale
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --seed-link 1gbit --rate 100mbit
  sudo .venv/bin/python benchmarks/lightcc_scaling.py --rate uncapped   # compute as for 1gbit
"""

import argparse
import atexit
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import _horovod_cluster  # noqa: E402
import _report  # noqa: E402
from _emulated_compute import PROFILES, emulated_plan, model_profile  # noqa: E402
from _lightcc_scaling_configs import (  # noqa: E402
  CONFIG_NAMES,
  QUICK_CONFIGS,
  SWEPT_CONFIGS,
  config_env,
  fusion_warmup,
  pool_repeats,
  run_order,
)
from _lightcc_scaling_report import (  # noqa: E402
  COLLECTIVE_FIGURES,
  charted,
  draw_efficiency,
  draw_timeline,
  overlap_figures,
  report,
  summarize,
)
from _netns import exit_on_signals, rate_bps  # noqa: E402

UNCAPPED = "uncapped"  # --rate: no tbf on the veth (compute scaled to --scale-rate)


REQUIRED_MODULES = _horovod_cluster.REQUIRED_MODULES


def worker_argv(spec_path, result_dir):
  """The command line of one rank (or of the one-rank baseline) running this script's worker."""
  argv = [sys.executable, os.path.abspath(__file__), "--worker", "--spec", spec_path]
  return argv + ["--result-dir", result_dir]


def run_undisturbed(cluster, config, spec_path, result_dir, plan, args, single_step, shown):
  """Runs a configuration (_horovod_cluster.run_undisturbed: again while the host's steal was over
  --max-steal). Returns its row, or a failure row, and the disturbed rows it replaced."""

  def run_once():
    got, failure = launch_config(cluster, config, spec_path, result_dir, plan, args)
    return {"name": config, **failure} if failure else summarize(config, got, plan, single_step)

  def show(row, again, seconds):
    if "error" in row:
      print(f"  {shown}: FAILED: {row['error']}\n{row['logs']}", flush=True)
      return
    print(
      f"  {shown}: {row['step_s']:.3f} s/step, efficiency {row['efficiency']:.1%}, link "
      f"{max(row['link_bytes_per_step']) / 1e6:.2f} MB/step, "
      f"TCP per step {row['retransmits_per_step']:.1f} retransmits, "
      f"{row['loss_probes_per_step']:.1f} loss probes, {row['timeouts_per_step']:.1f} timeouts, "
      f"{row['link_drops_per_step']:.1f} drops at the link; steal "
      f"{row['steal_share']:.0%}, CPU/rank {row['cpu_s_per_rank_step'] * 1e3:.0f} ms/step, peak "
      f"RSS/rank {row['peak_rss'] / 2**30:.2f} GiB ({seconds:.0f}s)"
      + (f"; steal over {args.max_steal:.0%}: run again" if again else ""),
      flush=True,
    )

  return _horovod_cluster.run_undisturbed(run_once, args, show)


def launch_config(cluster, config, spec_path, result_dir, plan, args, **env):
  """Runs a configuration's ranks on the cluster: (rank -> result, None) or (None, failure)."""
  env = dict(config_env(config, args.ranks_per_node, plan), **env)
  argv = worker_argv(spec_path, result_dir)
  return _horovod_cluster.launch_ranks(cluster, argv, env, result_dir, args.timeout)


def config_dir(pdir, config):
  """A configuration's result folder ("2d+topk@2.06" -> 2d_topk_at_2.06) in the profile's."""
  return os.path.join(pdir, config.replace("+", "_").replace("@", "_at_"))


def run_single(spec_path, result_dir, timeout):
  """The one-rank baseline: the same step in one process, no Horovod, no namespace."""
  os.makedirs(result_dir, exist_ok=True)
  argv = worker_argv(spec_path, result_dir)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHT_", "HOROVOD_"))}
  env.update(PYTHONPATH=_common.REPO, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
  with open(os.path.join(result_dir, "rank0.log"), "w") as log:
    proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
  path = os.path.join(result_dir, "rank0.json")
  if proc.returncode or not os.path.exists(path):
    with open(os.path.join(result_dir, "rank0.log")) as f:
      return None, {"error": f"exit {proc.returncode}", "logs": f.read()[-3000:]}
  with open(path) as f:
    return {0: json.load(f)}, None


def add_timeline(row, cluster, spec_path, pdir, plan, args):
  """Runs row's configuration once more with Horovod's timeline on (its warm-up, one timed step,
  the timeline's step) and adds that step (row["timeline_run"]) and its collective figures to the
  row; a failure is reported and leaves the row's timed figures as they are."""
  config = row["name"]
  result_dir = config_dir(pdir, config) + "_timeline"
  t = time.perf_counter()
  got, failure = launch_config(
    cluster, config, spec_path, result_dir, plan, args, HOROVOD_TIMELINE="DYNAMIC"
  )
  timeline = None if failure else got[0]["timeline"]
  error = failure["error"] if failure else timeline["collectives_error"]
  if error:
    row["timeline_error"] = error
    print(f"  {config} with Horovod's timeline: FAILED: {error}", flush=True)
    return
  row["timeline_run"] = timeline
  figures = overlap_figures(timeline, plan)
  row["overlap"].update({k: figures[k] for k in COLLECTIVE_FIGURES if k in figures})
  print(f"  {config} with Horovod's timeline ({time.perf_counter() - t:.0f}s)", flush=True)


def parse_args(argv):
  p = _common.argument_parser(__doc__)
  p.add_argument("--profiles", default="vgg16,resnet50", help="comma-separated: vgg16, resnet50")
  p.add_argument("--configs", default=",".join(CONFIG_NAMES), help=f"subset of {CONFIG_NAMES}")
  p.add_argument("--ranks-per-node", type=int, default=2)
  p.add_argument(
    "--rate", default="1gbit", help=f"tc tbf rate of the inter-node link, or {UNCAPPED}"
  )
  p.add_argument(
    "--scale-rate",
    default="1gbit",
    help=f"with --rate {UNCAPPED}: the rate the emulated compute is scaled to",
  )
  p.add_argument(
    "--seed-link",
    default="25gbit",
    help="the seed cluster's inter-node link, which sets the compute/link ratio (25gbit: the "
    "seed's VPC; 1gbit: the same GPUs on an ordinary 1 Gbit/s network)",
  )
  _horovod_cluster.add_steal_options(p)
  p.add_argument("--burst", default="512kb")
  p.add_argument("--latency", default="20ms")
  p.add_argument("--shrink", type=int, default=16, help="gradient sizes divided by this")
  p.add_argument(
    "--warmup",
    type=int,
    default=16,
    help="warm-up steps; fusion configurations first probe their sizes (3 sizes x 5 rounds, "
    "as many again for sizes that end close: 30 steps at most)",
  )
  p.add_argument(
    "--fusion-rounds",
    type=int,
    default=5,
    help="LIGHT_FUSION_PROBE_STEPS of the fusion configurations (LightCC's default, 5)",
  )
  p.add_argument("--steps", type=int, default=12, help="measured steps per run")
  p.add_argument(
    "--repeats",
    type=int,
    default=3,
    help="runs of each swept fusion configuration and of its fixed sizes, interleaved; their "
    "step times pool all their steps (on 2 shared cores one run moved by 1-2%% from the next, "
    "6%% with Horovod's timeline on: as much as the 0.97x target leaves)",
  )
  p.add_argument("--inter-op-threads", type=int, default=4)
  p.add_argument(
    "--clock",
    choices=("stream", "launch"),
    default="stream",
    help="emulated compute: spans back to back as kernels launched ahead on a GPU stream "
    "(stream), or each starting no earlier than the CPU launched it (launch)",
  )
  p.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
  p.add_argument(
    "--fixed-sweep",
    action=argparse.BooleanOptionalAction,
    default=True,
    help=f"also run {', '.join(SWEPT_CONFIGS)} (when selected) in fixed buckets of each fusion "
    "candidate size, for the fusion-against-best-fixed verdict",
  )
  p.add_argument(
    "--quick",
    action="store_true",
    help=f"VGG16 only, shrink 32, configs {','.join(QUICK_CONFIGS)}, 10 warm-up + 3 steps, "
    "fusion probed in 3 rounds, no fixed sweep (2-4 min)",
  )
  p.add_argument("--png", default=_report.chart_path("lightcc_scaling.png"))
  p.add_argument("--timeline-png", help="default: beside --png, named <its name>_timeline.png")
  _common.add_json(p)
  p.add_argument("--workdir", help="rank logs and results (default: a temporary folder)")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--spec", help=argparse.SUPPRESS)
  p.add_argument("--result-dir", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.quick:
    args.profiles, args.shrink, args.warmup, args.steps = "vgg16", 32, 10, 3
    args.fusion_rounds = 3
    args.fixed_sweep, args.repeats = False, 1
    if args.configs == ",".join(CONFIG_NAMES):
      args.configs = ",".join(QUICK_CONFIGS)
  if args.fusion_rounds < 2:
    p.error("--fusion-rounds must be at least 2 (the first round is not counted)")
  _common.require_positive(p, args, ["repeats", "steps"])
  _horovod_cluster.check_steal_options(p, args)
  args.profiles = [x for x in args.profiles.split(",") if x]
  args.configs = [x for x in args.configs.split(",") if x]
  bad = [x for x in args.profiles if x not in PROFILES] + [
    x for x in args.configs if x.partition("@")[0] not in CONFIG_NAMES
  ]
  if bad:
    p.error(f"unknown profile(s)/config(s) {bad}")
  args.timeline_png = args.timeline_png or os.path.splitext(args.png)[0] + "_timeline.png"
  return args


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    import _lightcc_scaling_worker  # pylint: disable=import-outside-toplevel

    return _lightcc_scaling_worker.worker(args)
  wall = time.perf_counter()
  tf, tf_ext, np, results = _horovod_cluster.start_driver(
    REQUIRED_MODULES, "lightcc_scaling.py", "bench-scaling"
  )
  _horovod_cluster.set_ranks_per_node(args.ranks_per_node)
  uncapped = args.rate == UNCAPPED
  link_bps = rate_bps(args.scale_rate if uncapped else args.rate)
  seed_link_bps = rate_bps(args.seed_link)
  workdir = args.workdir or tempfile.mkdtemp(prefix="lcc_scaling_")
  os.makedirs(workdir, exist_ok=True)

  exit_on_signals()
  cluster = _horovod_cluster.Cluster(None if uncapped else args.rate, args.burst, args.latency)
  atexit.register(cluster.close)
  profile_rows, disturbed = {}, []
  try:
    cluster.setup()
    print(f"cluster      :\n{cluster.describe()}", flush=True)
    for name in args.profiles:
      units, shapes = model_profile(name)
      plan = emulated_plan(
        name, units, shapes, args.shrink, link_bps, seed_link_bps, args.fusion_rounds
      )
      print(
        f"\n{name}: {plan['params']:,} parameters in {len(shapes)} tensors, {len(units)} units; "
        f"seed step {plan['seed_step_s']:.3f} s ({PROFILES[name]['source']}), seed link lower "
        f"bound {plan['seed_link_s']:.3f} s at {args.seed_link} -> compute/link "
        f"{plan['ratio']:.2f}; emulated: "
        f"1/{args.shrink} size, S = {plan['bytes'] / 1e6:.1f} MB, "
        f"{args.scale_rate + ' (link uncapped)' if uncapped else args.rate} -> compute "
        f"{plan['step_s']:.3f} s/step",
        flush=True,
      )
      spec = {
        "plan": plan,
        "warmup": args.warmup,
        "fusion_warmup": fusion_warmup(args.warmup, plan),
        "steps": args.steps,
        "inter_op_threads": args.inter_op_threads,
        "clock": args.clock,
        "world": 1,
      }
      pdir = os.path.join(workdir, name)
      os.makedirs(pdir, exist_ok=True)
      single_spec = os.path.join(pdir, "spec1.json")
      with open(single_spec, "w") as f:
        json.dump(spec, f)
      t = time.perf_counter()
      single, failure = run_single(single_spec, os.path.join(pdir, "single"), args.timeout)
      if failure:
        sys.exit(f"one-rank baseline failed: {failure['error']}\n{failure['logs']}")
      single_step = single[0]["elapsed_s"] / single[0]["steps"]
      single_cpu = single[0]["cpu_s"] / single[0]["steps"]
      single_steal = _horovod_cluster.steal_share(single[0]["counters"])
      print(
        f"  1 rank: {single_step:.3f} s/step, CPU {single_cpu * 1e3:.0f} ms/step, steal "
        f"{single_steal:.0%} ({time.perf_counter() - t:.0f}s)",
        flush=True,
      )
      spec["world"] = _horovod_cluster.WORLD
      spec_path = os.path.join(pdir, "spec.json")
      with open(spec_path, "w") as f:
        json.dump(spec, f)
      listed, order = run_order(args.configs, plan, args.fixed_sweep, args.repeats)
      runs = {config: [] for config in listed}
      for config in order:
        repeat, runs_of = len(runs[config]), order.count(config)
        result_dir = config_dir(pdir, config) + (f"_r{repeat + 1}" if runs_of > 1 else "")
        shown = f"{config} (run {repeat + 1}/{runs_of})" if runs_of > 1 else config
        row, runs_disturbed = run_undisturbed(
          cluster, config, spec_path, result_dir, plan, args, single_step, shown
        )
        runs[config].append(row)
        disturbed.extend(dict(r, profile=name) for r in runs_disturbed)
      rows = [pool_repeats(runs[config]) for config in listed]
      timeline_spec = os.path.join(pdir, "spec_timeline.json")
      with open(timeline_spec, "w") as f:
        json.dump(dict(spec, steps=1), f)
      for row in charted(rows):
        add_timeline(row, cluster, timeline_spec, pdir, plan, args)
      profile_rows[name] = (plan, single_step, rows)
  finally:
    cluster.close()
  if disturbed:
    print(
      f"disturbed     : {len(disturbed)} run(s) ran again, the host's steal over "
      f"--max-steal {args.max_steal:.0%}: "
      + ", ".join(
        f"{r['profile']} {r['name']} {r['step_s']:.3f} s ({r['steal_share']:.0%})"
        for r in disturbed
      )
    )
  results["disturbed_runs"] = disturbed
  results["verdicts"] = report(profile_rows, args)
  results["profiles"] = {
    name: {
      "plan": {k: v for k, v in plan.items() if k not in ("units", "shapes")},
      "single_step_s": single,
      "rows": rows,
    }
    for name, (plan, single, rows) in profile_rows.items()
  }
  results["setup"] = {
    "nodes": _horovod_cluster.NODES,
    "ranks_per_node": args.ranks_per_node,
    "rate": args.rate,
    "scale_rate": args.scale_rate if uncapped else args.rate,
    "seed_link": args.seed_link,
    "warmup": args.warmup,
    "steps": args.steps,
    "repeats": args.repeats,
    "clock": args.clock,
  }
  _report.write_chart(args.png, results, lambda p: draw_efficiency(profile_rows, args, p))
  first = next(iter(profile_rows.items()), None)
  if first:
    name, (plan, _, rows) = first
    shown = [r for r in charted(rows) if "timeline_run" in r]
    if shown:
      _report.write_chart(args.timeline_png, {}, lambda p: draw_timeline(shown, plan, p))
  return _report.finish(results, args.json, wall)


if __name__ == "__main__":
  sys.exit(main())

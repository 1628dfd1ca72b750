"""benchmarks/lightcc_scaling.py without root: --help works; the emulated compute splits the step by
multiply-adds (forward 1/3, backward 2/3), makes each gradient ready in backprop order after its
unit's backward sleep, takes the planned time and leaves the CPU idle meanwhile. The cluster run
itself needs root (make bench-scaling)."""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _emulated_compute  # noqa: E402
import _horovod_cluster  # noqa: E402
import _lightcc_scaling_configs  # noqa: E402
import _lightcc_scaling_report  # noqa: E402
import _lightcc_scaling_worker  # noqa: E402
import _rounds  # noqa: E402
import lightcc_cluster  # noqa: E402
import lightcc_scaling  # noqa: E402

# A small model: four units with weights, the third without multiply-adds (like batch norm).
UNITS = [
  {"layer": "conv_a", "macs": 100, "variables": [0, 1]},
  {"layer": "conv_b", "macs": 300, "variables": [2, 3]},
  {"layer": "norm", "macs": 0, "variables": [4, 5]},
  {"layer": "dense", "macs": 200, "variables": [6, 7]},
]
SHAPES = [[3, 3, 3, 8], [8], [3, 3, 8, 16], [16], [16], [16], [64, 10], [10]]


def _plan(shrink=1):
  # A rate that makes the planned step about 0.6 s: fast enough for a unit test, long enough to
  # tell sleeping from scheduling noise.
  params = sum(math.prod(s) for s in SHAPES)
  seed_ratio = lightcc_scaling.PROFILES["vgg16"]["step_s"] / (4 * params * 8 / 25e9)
  rate = seed_ratio * 4 * params * 8 / 0.6
  return lightcc_scaling.emulated_plan("vgg16", UNITS, SHAPES, shrink, rate, 25e9)


def test_help():
  proc = subprocess.run(
    [sys.executable, os.path.join(ROOT, "benchmarks", "lightcc_scaling.py"), "--help"],
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  assert "--quick" in proc.stdout and "--shrink" in proc.stdout


def test_plan_splits_the_step_by_multiply_adds():
  plan = _plan()
  assert math.isclose(plan["step_s"], 0.6, rel_tol=1e-9)
  total = sum(u["forward_s"] + u["backward_s"] for u in plan["units"])
  assert math.isclose(total, plan["step_s"], rel_tol=1e-9)
  for unit in plan["units"]:
    share = unit["macs"] / 600
    assert math.isclose(unit["forward_s"], plan["step_s"] * share / 3, abs_tol=1e-12)
    assert math.isclose(unit["backward_s"], 2 * unit["forward_s"], abs_tol=1e-12)
  assert plan["shapes"] == SHAPES
  small = _plan(shrink=4)
  assert small["shapes"] == [[math.ceil(math.prod(s) / 4)] for s in SHAPES]
  # The compute time follows the bytes: a quarter of the bytes, about a quarter of the time.
  assert small["step_s"] < 0.3 * plan["step_s"]


def test_gradients_are_ready_in_backprop_order_without_using_the_cpu():
  plan = _plan()
  variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
  rng = np.random.default_rng(0)
  values = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
  stored = [tf.Variable(v, trainable=False) for v in values]
  clock, marks = _emulated_compute.DeviceClock(), []
  step = _emulated_compute.build_step(tf, plan, variables, stored, clock, lambda t: t, marks)
  step()  # traces
  clock.spans.clear()
  marks.clear()
  wall, cpu = time.perf_counter(), time.process_time()
  step().numpy()
  wall, cpu = time.perf_counter() - wall, time.process_time() - cpu

  # The planned time, and the process mostly asleep meanwhile.
  assert plan["step_s"] <= wall < plan["step_s"] + 0.3, wall
  assert cpu < 0.5 * wall, (cpu, wall)
  # Forward in layer order, then backward from the last unit to the first, back to back (a unit
  # without multiply-adds takes no time and records no span).
  timed = [u for u, unit in enumerate(plan["units"]) if unit["forward_s"] > 0]
  spans = [(k, u) for k, u, _, _ in clock.spans]
  assert spans == [("forward", u) for u in timed] + [("backward", u) for u in reversed(timed)]
  ends = {u: e for k, u, _, e in clock.spans if k == "backward"}
  starts = {u: s for k, u, s, _ in clock.spans if k == "backward"}
  for later, earlier in zip(timed[1:], timed):
    assert starts[earlier] >= ends[later] - 1e-6
  # Each gradient is there after the backward of its unit (of the next timed unit for one
  # without time), before the backward of the previous timed unit ends.
  unit_of = {v: u for u, unit in enumerate(UNITS) for v in unit["variables"]}
  assert len(marks) == len(SHAPES)
  for var, t in marks:
    u = unit_of[var]
    after = min(x for x in timed if x >= u)
    assert t >= ends[after]
    before = [x for x in timed if x < u]
    if before:
      assert t < ends[before[-1]], (var, t, ends)
  # The gradients are the stored ones, unchanged: the update applied exactly them.
  for v, g in zip(variables, values):
    np.testing.assert_allclose(v.numpy(), -2e-6 * g, rtol=1e-5, atol=1e-12)


def test_units_without_time_share_the_next_timed_units_sleeps():
  plan = _plan()
  assert _emulated_compute.unit_groups(plan["units"]) == [[0], [1], [2, 3]]
  # A trailing unit without time keeps a group (and a backward pass-through) of its own.
  units = plan["units"] + [dict(plan["units"][2], forward_s=0.0, backward_s=0.0)]
  assert _emulated_compute.unit_groups(units) == [[0], [1], [2, 3], [4]]


def test_timed_steps_run_without_marks():
  plan = _plan()
  variables = [tf.Variable(tf.zeros(s)) for s in SHAPES]
  stored = [tf.Variable(tf.ones(s), trainable=False) for s in SHAPES]
  clock, marks = _emulated_compute.DeviceClock(), []
  step = _emulated_compute.build_step(tf, plan, variables, stored, clock, lambda t: t)
  marked = _emulated_compute.build_step(tf, plan, variables, stored, clock, lambda t: t, marks)
  step().numpy()
  assert marks == []
  marked().numpy()
  assert sorted(v for v, _ in marks) == list(range(len(SHAPES)))
  # Both steps applied the same stored gradients.
  np.testing.assert_allclose(variables[0].numpy(), -2e-6 * np.ones(SHAPES[0]), rtol=1e-5)


def test_stream_clock_runs_spans_back_to_back_whatever_their_launch():
  # A GPU runs kernels launched ahead back to back: a span launched late (the CPU busy) still
  # ends where the plan puts it; the "launch" clock instead adds the CPU's delay.
  for mode, expected_end in (("stream", 0.06), ("launch", 0.08)):
    clock = _emulated_compute.DeviceClock(mode, first_unit=0)
    start = time.perf_counter()
    clock.run("forward", 0, 0.02)
    time.sleep(0.02)  # the next span is launched 20 ms after the first one ended
    clock.run("forward", 1, 0.02)
    clock.run("backward", 1, 0.02)
    end = clock.spans[-1][3] - start
    assert expected_end <= end < expected_end + 0.015, (mode, end)
    assert time.perf_counter() - start >= expected_end
  # A step's first span waits for its launch in either mode.
  clock = _emulated_compute.DeviceClock("stream", first_unit=0)
  clock.run("forward", 0, 0.01)
  time.sleep(0.03)
  launched = time.perf_counter()
  clock.run("forward", 0, 0.01)
  assert clock.spans[-1][2] >= launched


def test_horovod_timeline_is_read_on_the_steps_clock(tmp_path):
  # Horovod's timeline format: metadata naming each tensor's "process", then B/E events in µs,
  # the file left open (no closing bracket) while recording.
  def meta(pid, args):
    return {"name": "process_name", "ph": "M", "pid": pid, "args": args}

  def span(pid, name, begin, end):
    return [{"ph": "B", "name": name, "ts": begin, "pid": pid}, {"ph": "E", "ts": end, "pid": pid}]

  events = [meta(0, {"start_time_since_epoch_in_micros": 1}), meta(1, {"name": "HorovodAllreduce"})]
  events += [meta(2, {"name": "grad_a"})] + span(1, "ALLREDUCE", 1_000_000, 1_000_500)
  events += span(2, "NEGOTIATE_ALLREDUCE", 1_100_000, 1_100_100)
  inner = span(2, "GLOO_ALLREDUCE", 1_100_300, 1_150_000)
  outer = span(2, "ALLREDUCE", 1_100_200, 1_150_100)
  events += [outer[0], *inner, outer[1]] + span(1, "ALLREDUCE", 1_200_000, 1_200_500)
  path = tmp_path / "timeline.json"
  path.write_text("[\n" + ",".join(json.dumps(e) for e in events) + ",")
  # The barrier before the step ended at 1.0005 s on Horovod's clock, at -0.001 s on the step's.
  got = _lightcc_scaling_worker.horovod_collectives(str(path), -0.001)
  assert [(t, a) for t, a, _, _ in got] == [
    ("grad_a", "NEGOTIATE_ALLREDUCE"),
    ("grad_a", "ALLREDUCE"),
  ]
  np.testing.assert_allclose([got[1][2], got[1][3]], [0.0987, 0.1486], atol=1e-9)
  # The backward pass ends halfway through the collective.
  overlap = _lightcc_scaling_report.collective_overlap(got, backward_end=0.12365)
  assert math.isclose(overlap["first_collective"], 0.0987, abs_tol=1e-9)
  assert math.isclose(overlap["collective_s_before_backward_end"], 0.5, abs_tol=1e-6)


def test_configs_exchange_in_buckets_scaled_like_the_gradients():
  plan = _plan(shrink=16)
  assert lightcc_scaling.config_env("2d+topk", 2, plan)["LIGHT_BUCKET_MB"] == "1.5625"
  assert lightcc_scaling.config_env("2d+onegroup", 2, plan)["LIGHT_BUCKET_MB"] == "0"
  fused = lightcc_scaling.config_env("2d+fusion", 2, plan)
  assert "LIGHT_BUCKET_MB" not in fused and fused["LIGHT_FUSION_PROBE_STEPS"] == "5"
  assert lightcc_scaling.config_env("horovod", 2, plan) == {}
  # Fusion probes each size in a graph of its own; "+switch" probes behind the switch, as before.
  assert fused["LIGHT_FUSION_RETRACE"] == "1"
  switch = lightcc_scaling.config_env("2d+topk+fusion+switch", 2, plan)
  retrace = lightcc_scaling.config_env("2d+topk+fusion", 2, plan)
  assert switch == dict(retrace, LIGHT_FUSION_RETRACE="0")
  # The fixed sweep: a fusion configuration again, in fixed buckets of each candidate size.
  sweep = _lightcc_scaling_configs.fixed_sweep("2d+topk+fusion", plan)
  assert sweep == [f"2d+topk@{mb:g}" for mb in plan["fusion_mb"]]
  fixed = lightcc_scaling.config_env(sweep[0], 2, plan)
  assert fixed["LIGHT_BUCKET_MB"] == f"{plan['fusion_mb'][0]:g}" and "LIGHT_FUSION" not in fixed
  assert fixed["LIGHT_TOPK_ALLREDUCE"] == "1" and fixed["LIGHT_2D_ALLREDUCE"] == "1"
  assert _lightcc_scaling_configs.label(sweep[0]) == f"2D+TOPK {plan['fusion_mb'][0]:g} MiB"
  assert _lightcc_scaling_configs.fixed_sweep("2d+topk", plan) == []


def test_fusion_warms_up_for_its_longest_probe_then_as_the_others():
  plan = dict(_plan(shrink=16), fusion_mb=[2.06, 8.25, 128], fusion_rounds=5)
  # 3 sizes x 5 rounds, as many again if all three end close, a step for each of the two
  # decisions to take effect and one per size whose time holds its graph's tracing (each size
  # has a graph of its own), then the others' 16 steps.
  assert lightcc_scaling.fusion_warmup(16, plan) == 3 * 5 * 2 + 2 + 3 + 16


def _row(name, step_s, steps=8, chosen=None, plan=None):
  """A summarized run as the report reads it."""
  return {
    "name": name,
    "env": lightcc_scaling.config_env(name, 2, plan) if plan else {},
    "steps": steps,
    "step_s": step_s,
    "images_per_s": 100 / step_s,
    "efficiency": 0.2 / step_s,
    "link_bytes_per_step": [1.0, 3.0],
    "cpu_s_per_rank_step": step_s / 4,
    "steal_share": 0.05,
    "retransmits_per_step": 2.0,
    "loss_probes_per_step": 1.5,
    "timeouts_per_step": 0.0,
    "link_drops_per_step": 0.0,
    "peak_rss": 2**30,
    "fusion": [{"chosen": chosen}] if chosen is not None else [],
    "overlap": {"first_reduced": 0.1, "backward_end": 0.2, "last_reduced": 0.3},
  }


def test_fusion_and_its_fixed_sizes_run_interleaved_and_pool_their_steps():
  plan = _plan(shrink=16)
  fixed = _lightcc_scaling_configs.fixed_sweep("2d+topk+fusion", plan)
  group = ["2d+topk+fusion", *fixed]
  listed, order = lightcc_scaling.run_order(["horovod", "2d+topk+fusion"], plan, True, 2)
  assert listed == ["horovod", *group]
  # Horovod runs once, then the group in two rounds, the second starting one later in the group.
  assert order == ["horovod", *group, *group[1:], group[0]]
  three_sizes = dict(plan, fusion_mb=[2.06, 8.25, 128])
  group = ["2d+topk+fusion", *_lightcc_scaling_configs.fixed_sweep("2d+topk+fusion", three_sizes)]
  _, five = lightcc_scaling.run_order(["2d+topk+fusion"], three_sizes, True, 5)
  rounds = [five[n : n + 4] for n in range(0, len(five), 4)]
  assert len(rounds) == 5 and all(sorted(r) == sorted(group) for r in rounds)
  assert [r[0] for r in rounds] == [*group, group[0]]  # each one first in turn
  assert lightcc_scaling.run_order(["horovod", "2d+topk+fusion"], plan, False, 2) == (
    ["horovod", "2d+topk+fusion"],
    ["horovod", "2d+topk+fusion"],
  )

  def run(step_s, steps, chosen=None):
    return _row("2d+topk+fusion", step_s, steps, chosen)

  failed = {"name": "2d+topk+fusion", "error": "exit 1"}
  pooled = lightcc_scaling.pool_repeats([run(0.4, 10, 0), failed, run(0.3, 30, 2)])
  assert math.isclose(pooled["step_s"], (0.4 * 10 + 0.3 * 30) / 40)  # over all steps, not runs
  assert pooled["steps"] == 40
  assert math.isclose(pooled["images_per_s"], 100 / pooled["step_s"])
  assert math.isclose(pooled["efficiency"], 0.2 / pooled["step_s"])
  assert [r.get("step_s") for r in pooled["repeats"]] == [0.4, None, 0.3]
  assert pooled["repeats"][1] == {"error": "exit 1"}
  assert [r["fusion"][0]["chosen"] for r in pooled["repeats"] if "fusion" in r] == [0, 2]
  one = run(0.4, 10)
  assert lightcc_scaling.pool_repeats([one]) is one
  assert lightcc_scaling.pool_repeats([failed, failed]) == failed


def test_report_judges_pooled_and_single_fusion_runs(capsys):
  plan = dict(_plan(shrink=16), fusion_mb=[2.06, 8.25, 128])  # VGG16's at 1/16
  small, middle, large = _lightcc_scaling_configs.fixed_sweep("2d+topk+fusion", plan)
  fused = lightcc_scaling.pool_repeats(
    [_row("2d+topk+fusion", 0.42, chosen=2), _row("2d+topk+fusion", 0.36, chosen=1)]
  )
  rows = [
    _row("horovod", 2.0, plan=plan),
    fused,
    _row("2d+topk+fp16+fusion", 0.37, chosen=0, plan=plan),  # not swept: one run, no verdict
    lightcc_scaling.pool_repeats([_row(small, 0.45, plan=plan), _row(small, 0.45, plan=plan)]),
    lightcc_scaling.pool_repeats([_row(middle, 0.36, plan=plan), _row(middle, 0.36, plan=plan)]),
    lightcc_scaling.pool_repeats([_row(large, 0.50, plan=plan), _row(large, 0.50, plan=plan)]),
  ]
  verdicts = lightcc_scaling.report({"vgg16": (plan, 0.3, rows)}, None)
  out = capsys.readouterr().out
  assert " 128/8.25" in out  # each run's choice
  assert "vgg16 2d+topk+fusion: 16 steps in 2 runs, s/step 0.420 / 0.360 (CPU/rank 105 / 90" in out
  fixed = [v for v in verdicts if "fixed bucket sizes" in v]
  assert len(fixed) == 1 and fixed[0].startswith("MISS")  # 0.36 / 0.39 = 0.92x
  assert (
    "0.923x the best of 3" in fixed[0] and "means of 16 steps in 2 interleaved rounds" in fixed[0]
  )
  # The fusion runs are 0.06 s apart: 0.923 is 0.7 standard errors below the target.
  assert "+-0.071 (1 s.e., runs paired by round): within 2 s.e. of the target" in fixed[0]


def test_report_says_when_horovod_did_not_run(capsys):
  plan = _plan(shrink=16)
  verdicts = lightcc_scaling.report({"resnet50": (plan, 0.2, [_row("2d+topk", 0.25)])}, None)
  capsys.readouterr()
  assert verdicts[0].endswith("2d+topk 80.0% (target >= 90%); Horovod not run")


def test_ratio_error_grows_with_the_runs_spread():
  ratio, error = _rounds.speed_ratio_with_error([0.5, 0.5], [0.4, 0.4])
  assert math.isclose(ratio, 0.8) and error == 0  # runs that repeat exactly: no doubt
  ratio, error = _rounds.speed_ratio_with_error([0.4, 0.6], [0.4, 0.4])
  # mean 0.5, sample variance 0.02 over 2 runs: relative error sqrt(0.02 / 2) / 0.5 = 0.2
  assert math.isclose(ratio, 0.8) and math.isclose(error, 0.8 * 0.2)
  _, error = _rounds.speed_ratio_with_error([0.5], [0.4, 0.4])
  assert math.isnan(error)  # one round: no spread to judge by


def test_ratio_error_pairs_the_runs_by_round():
  # The second round is 1.5x slower for both: the machine, not the configurations.
  ratio, error = _rounds.speed_ratio_with_error([0.4, 0.6], [0.32, 0.48])
  assert math.isclose(ratio, 0.8) and math.isclose(error, 0, abs_tol=1e-12)
  # The same runs, the reference's rounds swapped: now the spread is the configurations'.
  _, unpaired = _rounds.speed_ratio_with_error([0.4, 0.6], [0.48, 0.32])
  assert unpaired > 0.1
  # A round where either failed is left out of both means.
  ratio, error = _rounds.speed_ratio_with_error([0.4, None, 0.5], [0.32, 0.9, 0.4])
  assert math.isclose(ratio, 0.8) and math.isclose(error, 0, abs_tol=1e-12)
  assert all(map(math.isnan, _rounds.speed_ratio_with_error([None, 0.5], [0.4, None])))


def test_counters_outside_the_cluster_leave_the_missing_link_out():
  """The worker run by hand (docs/benchmarks.md, fusion's cost measured apart) has no lcc0."""
  cluster = _horovod_cluster
  counters = cluster.read_counters()
  assert counters["lo_tx_bytes"] >= 0 and "tcp_retrans_segs" in counters
  has_link = os.path.isdir(f"/sys/class/net/{cluster.IFACE}")
  assert (f"{cluster.IFACE}_tx_bytes" in counters) == has_link
  assert ("qdisc_drops" in counters) == has_link


def test_counters_tell_late_acks_and_stolen_cpu_from_losses():
  cluster = _horovod_cluster
  before = cluster.read_counters()
  time.sleep(0.05)
  after = cluster.read_counters()
  assert {"tcp_loss_probes", "tcp_timeouts"} <= after.keys()
  assert after["cpu_ticks"] > before["cpu_ticks"] >= before["cpu_steal_ticks"] >= 0


def test_summary_splits_retransmissions_and_reads_steal_per_run():
  cluster = _horovod_cluster
  timeline = {"begin": 0.0, "end": 1.0, "spans": [], "marks": [], "collectives": []}

  def rank(number, retrans, probes, drops, steal):
    counters = {
      f"{cluster.IFACE}_tx_bytes": 1000,
      "tcp_retrans_segs": retrans,
      "tcp_loss_probes": probes,
      "tcp_timeouts": 1,
      "qdisc_drops": drops,
      "cpu_ticks": 400,
      "cpu_steal_ticks": steal,
    }
    traffic = {"inter_bytes": 0}
    return dict(
      rank=number,
      steps=10,
      elapsed_s=2.0,
      warmup_s=1.0,
      cpu_s=0.5,
      fusion=[],
      timeline=timeline,
      peak_rss=1,
      counters=counters,
      traffic=traffic,
    )

  per_node = cluster.RANKS_PER_NODE
  results = {r: rank(r, 30, 20, 0, 40) for r in range(cluster.WORLD)}
  results[per_node] = rank(per_node, 10, 10, 5, 99)  # node 1's counters (its first rank)
  row = lightcc_scaling.summarize("2d", results, _plan(shrink=16), 0.1)
  assert row["retransmits_per_step"] == 4.0 and row["loss_probes_per_step"] == 3.0
  assert row["timeouts_per_step"] == 0.2 and row["link_drops_per_step"] == 0.5
  assert row["steal_share"] == 0.1  # the host's, read by rank 0


def test_a_run_the_host_stole_from_runs_again_a_bounded_number_of_times(monkeypatch, capsys):
  steals = iter([0.2, 0.1, 0.0])
  monkeypatch.setattr(lightcc_scaling, "launch_config", lambda *a: ({0: {}}, None))
  monkeypatch.setattr(
    lightcc_scaling, "summarize", lambda *a: dict(_row("2d", 0.3), steal_share=next(steals))
  )

  def run(**options):
    args = lightcc_scaling.parse_args(["--max-steal", "0.05", *options.get("argv", [])])
    return lightcc_scaling.run_undisturbed(None, "2d", "spec", "dir", {}, args, 0.1, "2d")

  row, disturbed = run()
  assert row["steal_share"] == 0.0 and [r["steal_share"] for r in disturbed] == [0.2, 0.1]
  assert capsys.readouterr().out.count("run again") == 2
  steals = iter([0.2, 0.1, 0.0])
  row, disturbed = run(argv=["--steal-retries", "1"])
  assert row["steal_share"] == 0.1 and len(disturbed) == 1  # kept: no retry left
  monkeypatch.setattr(
    lightcc_scaling, "launch_config", lambda *a: (None, {"error": "exit 1", "logs": "..."})
  )
  row, disturbed = run()
  assert row == {"name": "2d", "error": "exit 1", "logs": "..."} and disturbed == []
  with pytest.raises(SystemExit):
    lightcc_scaling.parse_args(["--max-steal", "2"])


def test_the_exchange_only_benchmark_reads_steal_and_runs_disturbed_runs_again(capsys):
  """bench-cluster (lightcc_cluster.py) shares the scaling benchmark's rule for disturbed runs."""
  cluster = _horovod_cluster
  counters = {
    f"{cluster.IFACE}_tx_bytes": 100,
    f"{cluster.IFACE}_rx_bytes": 100,
    "lo_tx_bytes": 10,
    "cpu_ticks": 200,
    "cpu_steal_ticks": 30,
  }
  rank = dict(
    counters=counters,
    traffic={"inter_bytes": 0, "intra_bytes": 0},
    elapsed_s=2.0,
    warmup_s=1.0,
    light_config="",
    fusion=[],
  )
  args = lightcc_cluster.parse_args(["--steps", "4", "--steal-retries", "1"])
  args.total_bytes = 1000
  row = lightcc_cluster.summarize(
    "2d", {"LIGHT_2D_ALLREDUCE": "1"}, dict.fromkeys(range(4), rank), args
  )
  assert row["steal_share"] == 0.15 and row["step_s"] == 0.5
  runs = iter([row, dict(row, steal_share=0.0)])
  shown = []
  kept, disturbed = cluster.run_undisturbed(lambda: next(runs), args, lambda *a: shown.append(a))
  assert kept["steal_share"] == 0.0 and disturbed == [row]
  assert [again for _, again, _ in shown] == [True, False]
  lightcc_cluster.show_run(row, True, 3.0, args)
  assert "steal 15%" in capsys.readouterr().out
  runs = iter([dict(row, steal_share=0.1), dict(row, steal_share=0.3)])
  kept, disturbed = cluster.run_undisturbed(lambda: next(runs), args, lambda *a: None)
  # --steal-retries 1, both disturbed: the one with less steal is kept, whichever came first.
  assert kept["steal_share"] == 0.1 and [r["steal_share"] for r in disturbed] == [0.3]
  failed = {"name": "2d", "error": "rank 1 exited with 1", "logs": ""}
  kept, disturbed = cluster.run_undisturbed(lambda: failed, args, lambda *a: None)
  assert kept is failed and disturbed == []  # a failure is reported, never run again
  with pytest.raises(SystemExit):
    lightcc_cluster.parse_args(["--max-steal", "-0.1"])

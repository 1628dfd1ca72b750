"""What lightcc_scaling.py reports: a run's row from its ranks' results, the exchange's overlap
with the backward pass, the table, the verdicts and the two charts."""

import math

import _horovod_cluster
import _report
from _emulated_compute import BATCH
from _lightcc_scaling_configs import FIXED_TARGET, FUSION_TARGET, TARGETS, config_env, label
from _rounds import speed_ratio_with_error


def summarize(name, results, plan, single_step_s):
  world = _horovod_cluster.WORLD
  r0 = results[0]
  step_s = r0["elapsed_s"] / r0["steps"]
  link = [0.0] * _horovod_cluster.NODES
  per_node = ("tcp_retrans_segs", "tcp_loss_probes", "tcp_timeouts", "qdisc_drops")
  node_sums = dict.fromkeys(per_node, 0)  # both nodes' counters added
  for r in results.values():
    node = r["rank"] // _horovod_cluster.RANKS_PER_NODE
    if r["rank"] % _horovod_cluster.RANKS_PER_NODE == 0:  # counters are per namespace
      link[node] = r["counters"][f"{_horovod_cluster.IFACE}_tx_bytes"] / r["steps"]
      for key in per_node:
        node_sums[key] += r["counters"].get(key, 0)
  return {
    "name": name,
    "env": config_env(name, _horovod_cluster.RANKS_PER_NODE, plan),
    "steps": r0["steps"],
    "step_s": step_s,
    "images_per_s": BATCH * world / step_s,
    "efficiency": single_step_s / step_s,
    "link_bytes_per_step": link,
    # TCP segments sent again, both nodes; tail loss probes (an ACK was late) and timeouts; and
    # the packets the tbf dropped (its queue, --latency, overflowed).
    "retransmits_per_step": node_sums["tcp_retrans_segs"] / r0["steps"],
    "loss_probes_per_step": node_sums["tcp_loss_probes"] / r0["steps"],
    "timeouts_per_step": node_sums["tcp_timeouts"] / r0["steps"],
    "link_drops_per_step": node_sums["qdisc_drops"] / r0["steps"],
    "steal_share": _horovod_cluster.steal_share(r0["counters"]),
    "analytic_inter_bytes_all_ranks": sum(r["traffic"]["inter_bytes"] for r in results.values())
    / r0["steps"],
    "fusion": r0["fusion"],
    "timeline": r0["timeline"],
    "overlap": overlap_figures(r0["timeline"], plan),
    "peak_rss": max(r["peak_rss"] or 0 for r in results.values()),
    # The CPU time of a rank's process per timed step (all its threads), mean over ranks.
    "cpu_s_per_rank_step": sum(r["cpu_s"] for r in results.values()) / (len(results) * r0["steps"]),
    "warmup_s": r0["warmup_s"],
  }


def charted(rows):
  """The configurations the timeline shows: Horovod and the most efficient LightCC one."""
  ok = [r for r in rows if "error" not in r]
  light = [r for r in ok if r["name"] != "horovod"]
  return [r for r in ok if r["name"] == "horovod"] + (
    [max(light, key=lambda r: r["efficiency"])] if light else []
  )


# From Horovod's timeline (overlap_figures): only the charted configurations have them.
COLLECTIVE_FIGURES = ("first_collective", "collective_s_before_backward_end")


def overlap_figures(timeline, plan):
  """When the backward pass ended, and when the first and last reduced gradients were there
  (seconds from the step's start), and how much of the exchange ran while backward did."""
  backward = [(s, e) for k, _, s, e in timeline["spans"] if k == "backward"]
  marks = sorted(t for _, t in timeline["marks"])
  if not backward or not marks:
    return {}
  backward_start = min(s for s, _ in backward)
  backward_end = max(e for _, e in backward)
  return {
    "backward_start": backward_start,
    "backward_end": backward_end,
    "first_reduced": marks[0],
    "last_reduced": marks[-1],
    "reduced_before_backward_end": sum(t < backward_end for t in marks) / len(marks),
    **collective_overlap(timeline.get("collectives") or [], backward_end),
    "step_end": timeline["end"] - timeline["begin"],
  }


def collective_overlap(collectives, backward_end):
  """From Horovod's timeline: when the first collective (not its negotiation) started, and the
  share of the collectives' time that ran before the backward pass ended."""
  work = [(s, e) for _, activity, s, e in collectives if not activity.startswith("NEGOTIATE")]
  if not work:
    return {}
  total = sum(e - s for s, e in work)
  before = sum(max(0.0, min(e, backward_end) - s) for s, e in work)
  return {
    "first_collective": min(s for s, _ in work),
    "collective_s_before_backward_end": before / total if total > 0 else 0.0,
  }


def report(profile_rows, args):
  print(
    f"\n{'profile':<9} {'config':<21} {'step s':>7} {'img/s':>7} {'eff':>6} {'link MB/step':>13} "
    f"{'1st red.':>8} {'bwd end':>8} {'last red.':>9} {'1st coll.':>9} {'coll<bwd':>8} "
    f"{'fusion MiB':>10}"
  )
  for name, (plan, single, rows) in profile_rows.items():
    print(
      f"{name:<9} {'1 rank (no Horovod)':<21} {single:7.3f} {BATCH / single:7.1f} {1:6.0%} "
      f"{'':>13} (planned compute {plan['step_s']:.3f} s)"
    )
    for r in rows:
      if "error" in r:
        print(f"{name:<9} {r['name']:<21} FAILED: {r['error']}")
        continue
      o = r["overlap"]
      chosen = "/".join(
        f"{plan['fusion_mb'][run['fusion'][0]['chosen']]:g}"
        for run in r.get("repeats", [r])
        if run.get("fusion")
      )
      print(
        f"{name:<9} {r['name']:<21} {r['step_s']:7.3f} {r['images_per_s']:7.1f} "
        f"{r['efficiency']:6.1%} {max(r['link_bytes_per_step']) / 1e6:13.2f} "
        f"{o['first_reduced']:8.3f} {o['backward_end']:8.3f} {o['last_reduced']:9.3f} "
        f"{_optional(o.get('first_collective'), '9.3f')} "
        f"{_optional(o.get('collective_s_before_backward_end'), '8.0%')} {chosen:>10}"
      )
  print("  1st red. / last red.: s from the step's start when rank 0 had its first / last reduced")
  print("  gradient; bwd end: when its emulated backward pass ended; 1st coll.: when its first")
  print("  collective started; coll<bwd: the share of the collectives' time before the backward")
  print("  pass ended (both from Horovod's timeline, which slows steps: on one more run of")
  print("  Horovod and of the best LightCC configuration only).")
  for name, (_, _, rows) in profile_rows.items():
    for r in rows:
      if "repeats" in r:
        each = _each_run(r["repeats"], "step_s", ".3f")
        cpu = _each_run(r["repeats"], "cpu_s_per_rank_step", ".0f", scale=1e3)
        steal = _each_run(r["repeats"], "steal_share", ".0%")
        print(
          f"  {name} {r['name']}: {r['steps']} steps in {len(r['repeats'])} runs, s/step {each} "
          f"(CPU/rank {cpu} ms/step; steal {steal})"
        )
  verdicts = []
  for name, (_, _, rows) in profile_rows.items():
    ok = {r["name"]: r for r in rows if "error" not in r}
    if not ok:
      continue
    hvd_eff = f"{ok['horovod']['efficiency']:.1%}" if "horovod" in ok else "not run"
    target = TARGETS[name]
    light = [r for r in ok.values() if r["name"] != "horovod"]
    if light:
      best = max(light, key=lambda r: r["efficiency"])
      verdicts.append(
        f"{_report.verdict(best['efficiency'] >= target)}: {name} LightCC's best configuration "
        f"{best['name']} {best['efficiency']:.1%} (target >= {target:.0%}); Horovod {hvd_eff}"
      )
    fused = [r for r in ok.values() if r["fusion"]]
    if fused and "horovod" in ok:
      x = max(r["images_per_s"] for r in fused) / ok["horovod"]["images_per_s"]
      verdicts.append(
        f"{_report.verdict(x >= FUSION_TARGET)}: {name} best fusion config = {x:.2f}x Horovod "
        f"(target >= {FUSION_TARGET}x)"
      )
    for r in fused:  # against the same configuration in fixed buckets (LIGHT_BUCKET_MB)
      base = r["name"].replace("+fusion", "")
      fixed = [x for n, x in ok.items() if n.partition("@")[0] == base and base != "fusion"]
      if fixed:
        best = max(fixed, key=lambda x: x["images_per_s"])
        x = r["images_per_s"] / best["images_per_s"]
        pooled = ""
        if "repeats" in r and "repeats" in best:
          paired, error = speed_ratio_with_error(
            *([run.get("step_s") for run in row["repeats"]] for row in (r, best))
          )
          x = x if math.isnan(paired) else paired  # no round where both ran: the pooled ratio
          pooled = (
            f", means of {r['steps']} steps in {len(r['repeats'])} interleaved rounds; "
            f"+-{error:.3f} (1 s.e., runs paired by round)"
          )
          if abs(x - FIXED_TARGET) < 2 * error:
            pooled += ": within 2 s.e. of the target, so the runs cannot tell"
        verdicts.append(
          f"{_report.verdict(x >= FIXED_TARGET)}: {name} {r['name']} = {x:.3f}x the best of "
          f"{len(fixed)} fixed bucket sizes, {best['env'].get('LIGHT_BUCKET_MB')} MiB "
          f"({best['name']}; target >= {FIXED_TARGET}x{pooled})"
        )
  print("\n" + "\n".join(verdicts))
  return verdicts


def _each_run(repeats, key, spec, scale=1):
  """One figure of each of a configuration's runs, " / "-joined; "failed" for a failed run."""
  return " / ".join(
    format(run[key] * scale, spec) if "error" not in run else "failed" for run in repeats
  )


def _optional(value, spec):
  """value formatted, or blanks of the same width when it was not measured."""
  width = int(spec.rstrip("f%").partition(".")[0])
  return " " * width if value is None else format(value, spec)


def draw_efficiency(profile_rows, args, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(profile_rows), figsize=(6.5 * len(profile_rows), 4.8))
  axes = [axes] if len(profile_rows) == 1 else list(axes)
  for ax, (name, (plan, _, rows)) in zip(axes, profile_rows.items()):
    ok = [r for r in rows if "error" not in r]
    x = range(len(ok))
    colors = ["tab:gray" if r["name"] == "horovod" else "tab:blue" for r in ok]
    bars = ax.bar(x, [100 * r["efficiency"] for r in ok], color=colors)
    for b, r in zip(bars, ok):
      ax.annotate(
        f"{r['efficiency']:.0%}",
        (b.get_x() + b.get_width() / 2, b.get_height()),
        ha="center",
        va="bottom",
        fontsize=8,
      )
    ax.axhline(100 * TARGETS[name], color="red", ls="--", label=f"target {TARGETS[name]:.0%}")
    ax.set_xticks(list(x), [label(r["name"]) for r in ok], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("scaling efficiency %")
    ax.set_title(
      f"{name}: 1/{plan['shrink']} size, compute {plan['step_s']:.2f} s/step", fontsize=10
    )
    ax.legend(fontsize=8)
  fig.suptitle(
    f"Scaling efficiency, {_horovod_cluster.NODES} nodes x {_horovod_cluster.RANKS_PER_NODE} "
    f"ranks, link {args.rate}, seed link {args.seed_link}, emulated GPU compute",
    fontsize=11,
  )
  _report.save_figure(fig, plt, path, dpi=100)


def draw_timeline(rows, plan, path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(len(rows), 1, figsize=(11, 3.2 * len(rows)), squeeze=False)
  unit_of = {v: n for n, u in enumerate(plan["units"]) for v in u["variables"]}
  for ax, r in zip(axes[:, 0], rows):
    tl = r["timeline_run"]
    for kind, _unit, s, e in tl["spans"]:
      y = 1 if kind == "forward" else 0
      ax.barh(
        y,
        e - s,
        left=s,
        height=0.8,
        color="tab:green" if y else "tab:orange",
        edgecolor="k",
        linewidth=0.3,
      )
    ready = {}
    for kind, unit, _, e in tl["spans"]:
      if kind == "backward":
        ready[unit] = e
    marks = sorted(tl["marks"], key=lambda m: -unit_of[m[0]])
    for row, (var, t) in enumerate(marks):
      unit = unit_of[var]
      start = ready.get(unit, min((e for u, e in ready.items() if u > unit), default=0.0))
      y = -1 - row * 4.0 / max(1, len(marks))
      ax.plot([start, t], [y, y], color="tab:blue", lw=0.8)
      ax.plot([t], [y], "|", color="tab:red", ms=3)
    work = [c for c in tl.get("collectives") or [] if not c[1].startswith("NEGOTIATE")]
    for _, _, s, e in work:
      ax.barh(-6, e - s, left=s, height=0.8, color="tab:gray", edgecolor="k", linewidth=0.3)
    ax.set_yticks(
      [1, 0, -3, -6],
      ["forward", "backward", "gradients:\nready→reduced", "collectives\n(Horovod timeline)"],
    )
    ax.set_xlim(0, tl["end"] - tl["begin"])
    ax.set_xlabel("s from the step's start (rank 0)")
    ax.set_title(
      f"{label(r['name'])}: step {tl['end'] - tl['begin']:.3f} s with Horovod's timeline on "
      f"({r['step_s']:.3f} s timed without)",
      fontsize=10,
    )
  fig.suptitle(f"One step of {plan['profile']} (backprop order top to bottom)", fontsize=11)
  _report.save_figure(fig, plt, path, dpi=100)

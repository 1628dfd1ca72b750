"""What harp_transport.py reports: a profile's table (throughput and CPU per byte by size, the
ratios), the verdicts of the targets, why a miss no transport could avoid is one, and the chart."""

import _report
from _netns import rate_bps
from _report import size_label as human

MIB = 1024 * 1024
TARGETS = {"cloud": 3.0, "aggregate": 1.2}
CPU_TARGET, LATENCY_TARGET = 1.1, 1.2
BIG = MIB  # throughput targets apply to messages of at least this size


def report_profile(profile, results, names):
  print()
  print(f"== profile {profile} ==")
  header = f"{'size':>8s}"
  for n in names:
    header += f" {n + ' Gbit/s':>17s} {n + ' ns/B':>15s}"
  if len(names) == 2:
    header += f" {'tput ratio':>10s} {'CPU ratio':>9s}"
  print(header)
  ok_names = [n for n in names if results.get(n, {}).get("ok")]
  sizes = sorted({s for n in ok_names for s in results[n]["data"]["sizes"]})
  for size in sizes:
    line = f"{human(size):>8s}"
    for n in names:
      data = results.get(n, {}).get("data")
      if data and size in data["sizes"]:
        d = data["sizes"][size]
        line += f" {d['gbps']:17.3f} {d['cpu_ns_per_byte']:15.3f}"
      else:
        line += f" {'-':>17s} {'-':>15s}"
    if len(names) == 2 and len(ok_names) == 2:
      a, b = (results[n]["data"]["sizes"][size] for n in names)
      line += f" {a['gbps'] / b['gbps']:10.2f} {a['cpu_ns_per_byte'] / b['cpu_ns_per_byte']:9.2f}"
    print(line)
  for n in names:
    r = results.get(n, {})
    if r.get("ok"):
      figures = sorted(r["data"]["sizes"].items())
      print(
        f"{n:>8s}: CPU in the driving threads (as NCCL's proxy; the rest in the plugin's): "
        + ", ".join(
          f"{human(s)} {d['driver_cpu_ns_per_byte'] / d['cpu_ns_per_byte']:.0%}" for s, d in figures
        )
      )
      print(
        f"{n:>8s}: threads put to sleep (woken later) per MiB moved, both sides: "
        + ", ".join(f"{human(s)} {d['sleeps_per_mib']:.2f}" for s, d in figures)
      )
      lat = r["data"]["latency_us"]
      print(
        f"{n:>8s}: 8-byte latency {lat['median']:.1f} us median, {lat['p99']:.1f} us p99 "
        f"(half round trip, {lat['iters']} ping-pongs); {r['data']['verified_bytes']:,} bytes "
        f"verified"
        + (
          f"; per-flow classes used per round: {r['data']['flow_classes_used']}"
          if "flow_classes_used" in r["data"]
          else ""
        )
      )
    else:
      print(f"{n:>8s}: FAILED: {r.get('error')}")


def verdicts(profile, results, names):
  """The targets of this profile: a list of (name, ratio or None, target, met)."""
  if len(names) != 2 or not all(results.get(n, {}).get("ok") for n in names):
    return []
  a, b = (results[n]["data"] for n in names)
  big = [s for s in a["sizes"] if s >= BIG and s in b["sizes"]]
  out = []
  if big:
    worst = min(a["sizes"][s]["gbps"] / b["sizes"][s]["gbps"] for s in big)
    out.append((f"{profile}: throughput, messages >= 1 MiB (worst size)", worst, TARGETS[profile]))
    cpu = max(a["sizes"][s]["cpu_ns_per_byte"] / b["sizes"][s]["cpu_ns_per_byte"] for s in big)
    out.append((f"{profile}: CPU per byte, messages >= 1 MiB (worst size)", cpu, CPU_TARGET))
  lat = a["latency_us"]["median"] / b["latency_us"]["median"]
  out.append((f"{profile}: 8-byte latency (median)", lat, LATENCY_TARGET))
  return out


def unreachable_throughput(profile, baseline, target, args):
  """Why no transport could meet `target` on this aggregate cap, or None: the baseline already
  moves more than cap / target."""
  if profile != "aggregate" or args.aggregate_rate == "none":
    return None
  cap = rate_bps(args.aggregate_rate) / 1e9
  moved = min(d["gbps"] for size, d in baseline["sizes"].items() if size >= BIG)
  if moved * target <= cap:
    return None
  return (
    f"no transport can: the baseline moves {moved:.2f} of the {cap:g} Gbit/s cap. A cap that one "
    f"flow cannot fill shows the difference, e.g. --aggregate-rate 100gbit --channels 2 "
    f"(docs/benchmarks.md, HARP at 100 Gbit/s)."
  )


def draw_chart(path, all_results, names, args):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [3, 3, 2]})
  bars = []
  styles = {0: "-", 1: "--"}
  for p_index, (profile, results) in enumerate(all_results.items()):
    for n_index, n in enumerate(names):
      r = results.get(n, {})
      if not r.get("ok"):
        continue
      sizes = sorted(r["data"]["sizes"])
      x = [s / MIB for s in sizes]
      label = f"{n} ({profile})"
      color = f"C{n_index}"
      for ax, key in zip(axes, ("gbps", "cpu_ns_per_byte")):
        ax.plot(
          x,
          [r["data"]["sizes"][s][key] for s in sizes],
          styles[p_index % 2],
          marker="o",
          color=color,
          label=label,
        )
      # The driving threads' part of the CPU, where the plugin's own threads took a share.
      figures = [r["data"]["sizes"][s] for s in sizes]
      if any(f["driver_cpu_ns_per_byte"] < 0.98 * f["cpu_ns_per_byte"] for f in figures):
        axes[1].plot(
          x,
          [f["driver_cpu_ns_per_byte"] for f in figures],
          ":",
          marker=".",
          color=color,
          label=f"{label}: driving threads only",
        )
      bars.append((f"{n}\n{profile}", r["data"]["latency_us"]["median"], color))
  all_sizes = sorted(args.sizes)
  for ax, title in zip(axes, ("throughput (Gbit/s)", "CPU time per byte (ns, both processes)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks([s / MIB for s in all_sizes], [human(s) for s in all_sizes])
    ax.set_xlabel("message size")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
  axes[2].bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
  axes[2].set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
  axes[2].set_ylim(bottom=0)
  axes[2].set_title("8-byte latency, median half round trip (us)")
  axes[2].grid(True, axis="y", alpha=0.3)
  fig.suptitle(
    f"HARP vs NCCL-default-socket stand-in over veth, {args.channels} channel(s): aggregate "
    + ("uncapped" if args.aggregate_rate == "none" else args.aggregate_rate)
    + (f", cloud = aggregate + {args.flow_rate} per flow" if "cloud" in all_results else "")
  )
  _report.save_figure(fig, plt, path, dpi=110)

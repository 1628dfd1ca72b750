"""What harp_nccl_e2e.py reports: the table of time and bandwidths per size for each transport
with their ratio, the facts its NCCL logs show, and the chart (of this run, or redrawn from the
--json files of earlier runs)."""

import json

import _report
from _harp_nccl_launch import NETWORKS
from _report import size_label as human


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
  _report.save_figure(fig, plt, path, dpi=110)


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

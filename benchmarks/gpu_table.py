"""The GPU table core against HierarchicalKV, on one GPU, in one run.

On a GPU machine (run by tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh; Python's
standard library only, no TensorFlow):

  python3 benchmarks/gpu_table.py --run --bin build/gpu --out build/gpu/out

runs build/gpu/gpu_table_bench (find, find-or-insert and the fused Adam update at dims 8, 32, 64
and 128, load factors 0.5 and 0.9, batches of 1 Mi keys, hit rate 0.6) and, when
build/gpu/hkv_benchmark exists, HierarchicalKV's own benchmark at the same capacity, dims and load
factors; prints keys/s side by side, the ratios and the fraction of the device-to-device copy
bandwidth, against the targets; writes gpu_table.json. Anywhere with matplotlib:

  python benchmarks/gpu_table.py --chart build/gpu/out/gpu_table.json --png docs/img/gpu_table.png

draws the chart. Targets: find >= 1.0x HKV's find at every dim; find at dim >= 64 >= 50 % of the
copy bandwidth (key and row bytes); find-or-insert >= 1.0x HKV's insert_or_assign.
"""

import argparse
import json
import os
import subprocess
import sys

DIMS = (8, 32, 64, 128)
LOAD_FACTORS = (0.5, 0.9)
KEYS_PER_HKV_UNIT = 1024**3  # HKV prints billions of keys per second as keys / s / 2^30


def run_ours(binary, dims, load_factors, capacity_log2):
  command = [
    binary,
    "--dims",
    ",".join(map(str, dims)),
    "--load-factors",
    ",".join(map(str, load_factors)),
    "--capacity-log2",
    str(capacity_log2),
  ]
  print("$", " ".join(command), flush=True)
  text = subprocess.run(command, check=True, capture_output=True, text=True).stdout
  device, rows = {}, []
  for line in text.splitlines():
    record = json.loads(line)
    if "device" in record:
      device = record
    else:
      rows.append(record)
  return device, rows


def parse_hkv(text, dim):
  """Rows of HKV's table: | lambda | insert_or_assign | find | find_or_insert |."""
  rows = []
  for line in text.splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) != 4:
      continue
    try:
      values = [float(cell) for cell in cells]
    except ValueError:
      continue
    load_factor = values[0]
    for op, value in zip(("insert_or_assign", "find", "find_or_insert"), values[1:]):
      rows.append(
        {"op": op, "dim": dim, "load_factor": load_factor, "keys_per_s": value * KEYS_PER_HKV_UNIT}
      )
  return rows


def run_hkv(binary, dims, load_factors, capacity_log2):
  rows = []
  for dim in dims:
    command = [binary, str(dim), str(capacity_log2), ",".join(map(str, load_factors))]
    print("$", " ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
      print(f"HKV benchmark failed at dim {dim}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
      continue
    rows += parse_hkv(result.stdout, dim)
  return rows


def find(rows, op, dim, load_factor):
  for row in rows:
    if row["op"] == op and row["dim"] == dim and abs(row["load_factor"] - load_factor) < 1e-3:
      return row
  return None


def report(results):
  """Prints the comparison and the targets; returns whether every target measured was met."""
  ours, hkv = results["ours"], results["hkv"]
  print(f"device: {results['device'].get('device')}")
  print(f"device-to-device copy: {results['device'].get('copy_bytes_per_s', 0) / 1e9:.0f} GB/s")
  print(
    f"{'op':<15} {'dim':>4} {'load':>5} {'tf_ext Gkeys/s':>15} {'HKV Gkeys/s':>12} "
    f"{'ratio':>6} {'of copy bw':>10}"
  )
  met = True
  anchors = {"find": "find", "find_or_insert": "insert_or_assign", "adam": None}
  for row in ours:
    anchor_op = anchors[row["op"]]
    anchor = find(hkv, anchor_op, row["dim"], row["load_factor"]) if anchor_op else None
    ratio = row["keys_per_s"] / anchor["keys_per_s"] if anchor else None
    verdict = ""
    if ratio is not None and row["op"] in ("find", "find_or_insert"):
      verdict = "target >= 1.0x: " + ("met" if ratio >= 1.0 else "MISSED")
      met &= ratio >= 1.0
    if row["op"] == "find" and row["dim"] >= 64:
      ok = row["bandwidth_fraction"] >= 0.5
      verdict += ("; " if verdict else "") + "bw >= 50%: " + ("met" if ok else "MISSED")
      met &= ok
    print(
      f"{row['op']:<15} {row['dim']:>4} {row['load_factor']:>5.2f} "
      f"{row['keys_per_s'] / 1e9:>15.3f} "
      f"{(anchor['keys_per_s'] / 1e9 if anchor else float('nan')):>12.3f} "
      f"{(ratio if ratio else float('nan')):>6.2f} {row['bandwidth_fraction']:>10.1%}  {verdict}"
    )
  if not hkv:
    print("HierarchicalKV: not run (build it: HKV_DIR=<checkout> make gpu-checks)")
  return met


def chart(results, png):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for axis, load_factor in zip(axes, LOAD_FACTORS):
    width = 0.2
    series = [
      ("tf_ext find", results["ours"], "find"),
      ("HKV find", results["hkv"], "find"),
      ("tf_ext find_or_insert", results["ours"], "find_or_insert"),
      ("HKV insert_or_assign", results["hkv"], "insert_or_assign"),
    ]
    for k, (label, rows, op) in enumerate(series):
      values = []
      for dim in DIMS:
        row = find(rows, op, dim, load_factor)
        values.append(row["keys_per_s"] / 1e9 if row else 0)
      axis.bar([i + (k - 1.5) * width for i in range(len(DIMS))], values, width, label=label)
    axis.set_xticks(range(len(DIMS)), [f"dim {d}" for d in DIMS])
    axis.set_title(f"load factor {load_factor}")
    axis.set_ylabel("billion keys / s")
  axes[0].legend(fontsize=8)
  figure.suptitle(f"GPU table vs HierarchicalKV on {results['device'].get('device', '?')}")
  figure.tight_layout()
  figure.savefig(png, dpi=110)
  print(f"wrote {png}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run", action="store_true", help="measure (on a GPU machine)")
  parser.add_argument("--bin", default="build/gpu", help="where build_gpu_checks.sh put binaries")
  parser.add_argument("--out", default="build/gpu/out")
  parser.add_argument("--capacity-log2", type=int, default=25)
  parser.add_argument("--chart", metavar="RESULTS_JSON", help="draw the chart of a run")
  parser.add_argument("--png", default="gpu_table.png")
  args = parser.parse_args(argv)
  if args.chart:
    with open(args.chart) as f:
      results = json.load(f)
    report(results)
    chart(results, args.png)
    return 0
  if not args.run:
    parser.error("give --run (on a GPU machine) or --chart RESULTS_JSON")
  device, ours = run_ours(
    os.path.join(args.bin, "gpu_table_bench"), DIMS, LOAD_FACTORS, args.capacity_log2
  )
  hkv_binary = os.path.join(args.bin, "hkv_benchmark")
  hkv = (
    run_hkv(hkv_binary, DIMS, LOAD_FACTORS, args.capacity_log2)
    if os.path.exists(hkv_binary)
    else []
  )
  results = {"device": device, "capacity_log2": args.capacity_log2, "ours": ours, "hkv": hkv}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "gpu_table.json"), "w") as f:
    json.dump(results, f, indent=1)
  met = report(results)
  print("targets:", "all met" if met and hkv else ("MISSED" if not met else "HKV not measured"))
  return 0


if __name__ == "__main__":
  sys.exit(main())

#!/usr/bin/env python3
"""Runs a benchmark script several times, each in a fresh process, and reports the median and
spread of every ratio it prints ("tf_ext / <anchor> : 0.85x" lines).

One run's ratio moves with the process (where the table's memory and the hot ids land, the other
tenants of a shared VM), by more than a change under test often does; a headline figure is the
median of several runs, quoted with its range. The first run's report is printed whole, the
others' ratio lines only.

  python benchmarks/repeat.py --runs 5 lookup.py --no-tfra
  make bench                       # lookup.py 5 times (BENCH_RUNS=N to change)
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# "  tf_ext / dense gather                 :   0.85x  [0.85x]  (0.85x CPU)   target >= 0.6"
RATIO = re.compile(r"^\s*(tf_ext\s*/\s*[^:]+?)\s*:\s*([0-9]+(?:\.[0-9]+)?)x")


def ratios_of(output):
  """{name: value} of the ratio lines in a run's output, in the order printed."""
  found = {}
  for line in output.splitlines():
    match = RATIO.match(line)
    if match:
      found.setdefault(match.group(1), float(match.group(2)))
  return found


def summary(runs):
  """Lines giving each ratio's median and range over the runs that printed it."""
  names = []
  for run in runs:
    names += [name for name in run if name not in names]
  lines = []
  for name in names:
    values = [run[name] for run in runs if name in run]
    lines.append(
      f"  {name:<36}: median {statistics.median(values):.2f}x, range "
      f"{min(values):.2f}x..{max(values):.2f}x over {len(values)} runs "
      f"({', '.join(f'{v:.2f}' for v in values)})"
    )
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", type=int, default=5, help="fresh processes (at least 1)")
  parser.add_argument("script", help="a script under benchmarks/, e.g. lookup.py")
  parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
  args = parser.parse_args(argv)
  if args.runs < 1:
    parser.error(f"--runs must be at least 1, got {args.runs}")
  script = os.path.join(HERE, args.script)
  if not os.path.isfile(script):
    parser.error(f"no benchmark script {script}")
  runs = []
  for number in range(1, args.runs + 1):
    print(f"[repeat] run {number}/{args.runs}: {args.script} {' '.join(args.args)}", flush=True)
    proc = subprocess.run(
      [sys.executable, script, *args.args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
      sys.stdout.write(proc.stdout)
      sys.stderr.write(proc.stderr)
      print(f"[repeat] run {number} failed (exit {proc.returncode})", file=sys.stderr)
      return proc.returncode
    found = ratios_of(proc.stdout)
    if number == 1:
      sys.stdout.write(proc.stdout)
      if not found:
        print(f"[repeat] {args.script} printed no 'tf_ext / ...: N.NNx' ratio", file=sys.stderr)
        return 1
    else:
      for name, value in found.items():
        print(f"  {name:<36}: {value:.2f}x")
    runs.append(found)
  print(f"\nratios over {args.runs} runs (each a fresh process):")
  print("\n".join(summary(runs)))
  return 0


if __name__ == "__main__":
  sys.exit(main())

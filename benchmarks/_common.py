"""What the benchmark scripts share: progress logging, memory readings, the machine report and
the PASS/MISS verdict. Imported as `_common` (the scripts run from this folder)."""

import json
import os
import platform
import shlex
import sys
import time


def log(msg):
  print(msg, file=sys.stderr, flush=True)


def rss_bytes():
  """Resident set size of this process (Linux), or None."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return None


def mib(n):
  return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


# The CPU features the benchmarks report (bf16/AMX matter to TensorFlow's CPU kernels).
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")


def cpu_model_and_flags(wanted_flags=CPU_FLAGS):
  """The CPU's model name and which of `wanted_flags` /proc/cpuinfo lists."""
  model, flags = platform.processor() or "unknown", []
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          model = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
          present = set(line.split(":", 1)[1].split())
          flags = [flag for flag in wanted_flags if flag in present]
          break
  except OSError:
    pass
  return model, flags


def verdict(ok):
  return "PASS" if ok else "MISS"


def int_list(text):
  return [int(x) for x in text.split(",") if x.strip()]


def finish(results, json_path, wall_start):
  """Prints the total time and the command line, writes `results` to json_path if given; 0."""
  command = shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
  results["command"] = command
  results["total_s"] = time.perf_counter() - wall_start
  print()
  print(f"total time   : {results['total_s']:.1f}s")
  if json_path:
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
      json.dump(results, f, indent=2)
    print(f"json         : {json_path}")
  print(f"command      : {command}")
  return 0

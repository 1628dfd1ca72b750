"""What the benchmarks report around their figures: the machine (CPU model, CPU features, the
versions), the PASS/MISS verdicts, sizes in words, the charts and the results' JSON. Imported as
`_report` (the scripts run from this folder)."""

import json
import os
import platform
import shlex
import sys
import time

from _common import REPO

# The CPU features the benchmarks report (bf16/AMX matter to TensorFlow's CPU kernels).
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
# Those of the transport benchmarks (harp_transport.py, harp_nccl_e2e.py): copies, checksums and
# the clock that times them.
TRANSPORT_CPU_FLAGS = (
  "sse4_2",
  "avx",
  "avx2",
  "avx512f",
  "pclmulqdq",
  "aes",
  "erms",
  "fsrm",
  "constant_tsc",
)


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


def cpus_available():
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def cpu_report(wanted_flags=CPU_FLAGS, system=True, features=True):
  """Prints the machine (CPU model, CPUs available and, with `system`, the OS) and, with
  `features`, which of `wanted_flags` the CPU has; returns the results' "machine" entry."""
  model, flags = cpu_model_and_flags(wanted_flags)
  cpus = cpus_available()
  where = f", {platform.system()} {platform.release()}" if system else ""
  print(f"machine      : {model}, {cpus} CPUs available{where}")
  if features:
    print(f"CPU features : {' '.join(flags) or 'unknown'} (of {', '.join(wanted_flags)})")
  return {"cpu": model, "cpus": cpus, "cpu_flags": flags}


def machine_report(tf, tf_ext, np, cpu_features=True):
  """Prints the machine (CPU model, CPUs available, OS), its CPU features unless not
  `cpu_features`, and the versions of Python, TensorFlow, tf_ext (with its folder) and numpy;
  returns the results' "machine" entry."""
  machine = cpu_report(CPU_FLAGS, features=cpu_features)
  print(
    f"versions     : Python {platform.python_version()}, TensorFlow {tf.__version__}, "
    f"tf_ext {tf_ext.__version__} ({os.path.dirname(tf_ext.__file__)}), numpy {np.__version__}"
  )
  return machine


def versions(tf, tf_ext, np, **more):
  """The results' "versions" entry; `more` (e.g. tfra=...) comes before numpy."""
  return {
    "python": platform.python_version(),
    "tensorflow": tf.__version__,
    "tf_ext": tf_ext.__version__,
    **more,
    "numpy": np.__version__,
  }


def verdict(ok):
  return "PASS" if ok else "MISS"


def size_label(size):
  """A byte count as the tables show it: "8 B", "64 KiB", "4 MiB"."""
  if size >= 1 << 20:
    return f"{size >> 20} MiB"
  return f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B"


# ---- charts -----------------------------------------------------------------------------------

# Charts go under the build folder unless a path is given: the committed ones (benchmarks/*.png,
# shown by the docs) change only when a run names them (--png benchmarks/NAME.png).
CHART_DIR = os.path.join(REPO, "build", "charts")


def chart_path(name):
  """Where a run's chart `name` goes by default: build/charts/, never a committed chart."""
  return os.path.join(CHART_DIR, name)


def save_figure(fig, plt, path, **savefig_options):
  """Lays `fig` out, writes it to `path` (making its folder) and closes it."""
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, **savefig_options)
  plt.close(fig)


def write_chart(path, results, draw):
  """draw(path) writes the chart, reported in `results`; without matplotlib, says so instead."""
  try:
    draw(path)
    print(f"chart        : {path}")
    results["png"] = path
  except ImportError as error:
    print(f"chart        : not written ({error}; pip install matplotlib)")


# ---- the results ------------------------------------------------------------------------------


def write_json(path, results, **dump_options):
  """Writes `results` to `path` (making its folder); json.dump's options, indent 2 unless set."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(results, f, **{"indent": 2, **dump_options})


def finish(results, json_path, wall_start):
  """Prints the total time and the command line, writes `results` to json_path if given; 0."""
  command = shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
  results["command"] = command
  results["total_s"] = time.perf_counter() - wall_start
  print()
  print(f"total time   : {results['total_s']:.1f}s")
  if json_path:
    write_json(json_path, results)
    print(f"json         : {json_path}")
  print(f"command      : {command}")
  return 0

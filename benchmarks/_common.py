"""What the benchmark scripts share: the checkout on sys.path, the argument parser's frame, the
optional TFRA import, progress logging, memory readings, the machine report and the PASS/MISS
verdict. Imported as `_common` (the scripts run from this folder)."""

import argparse
import ctypes
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# The checkout this folder belongs to (or a copy's folder that links its tf_ext beside it).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def use_checkout(measures_peak_rss=False):
  """Call before importing TensorFlow: keeps its C++ log to warnings (unless
  TF_CPP_MIN_LOG_LEVEL is set) and puts REPO first on sys.path when it holds tf_ext, so that a
  script run from a checkout imports that checkout's tf_ext without PYTHONPATH.

  With `measures_peak_rss`, turns oneDNN off (unless TF_ENABLE_ONEDNN_OPTS is set): its CPU
  allocator keeps large freed tensors in a pool it never gives back, so a path's peak RSS would
  hide in what an earlier path freed; without it (the table ops use none of oneDNN), freed
  tensors go back to the system."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  if measures_peak_rss:
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  if os.path.isfile(os.path.join(REPO, "tf_ext", "__init__.py")) and REPO not in sys.path:
    sys.path.insert(0, REPO)


def argument_parser(doc):
  """An ArgumentParser described by the first paragraph of `doc` (the script's docstring), with
  the defaults shown in --help."""
  return argparse.ArgumentParser(
    description=doc.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
  )


def add_intra_op_threads(p):
  p.add_argument(
    "--intra-op-threads",
    type=int,
    default=0,
    help="tf.config intra-op threads; 0 keeps TensorFlow's default (one per CPU)",
  )


def add_json(p):
  p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")


def require_positive(p, args, names):
  """Exits through p.error unless each option of `names` (argparse dests) is >= 1."""
  for name in names:
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be >= 1")


def import_tfra(skip, when_missing):
  """TFRA for a baseline: (its dynamic_embedding module, its version, a status line), the first
  two None when `skip` (--no-tfra) or when it cannot be imported; then the status says why,
  followed by `when_missing` (what the script does without it)."""
  if skip:
    return None, None, "skipped (--no-tfra)"
  try:
    import tensorflow_recommenders_addons as tfra  # pylint: disable=import-outside-toplevel
    import tensorflow_recommenders_addons.dynamic_embedding as de  # pylint: disable=import-outside-toplevel
  except Exception as error:  # ImportError, or a TFRA op library that fails to load
    return None, None, f"not installed ({type(error).__name__}: {error}); {when_missing}"
  version = getattr(tfra, "__version__", "unknown")
  return de, version, f"tensorflow-recommenders-addons {version}"


def log(msg):
  print(msg, file=sys.stderr, flush=True)


def rss_bytes():
  """Resident set size of this process (Linux), or None."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return None


def reset_peak_rss():
  """Resets the process's RSS high-water mark (Linux >= 4.0); whether it could."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def release_free_memory():
  """Gives the allocator's free memory back to the system (glibc), so that a path's peak RSS
  counts its own allocations, not memory it reuses from what an earlier path freed."""
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def peak_rss_bytes():
  """VmHWM, the RSS high-water mark since the process started or the last reset, or None."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


class PeakRssAdded:
  """`with PeakRssAdded() as peak:` the RSS high-water mark the block added over the RSS before
  it, in `peak.bytes` afterwards (None where Linux's counters cannot be read or reset). Free heap
  memory is given back first, so that memory an earlier path freed does not hide a peak."""

  def __enter__(self):
    release_free_memory()
    self._before = rss_bytes()
    self._reset = reset_peak_rss()
    self.bytes = None
    return self

  def __exit__(self, *exc_info):
    peak = peak_rss_bytes() if self._reset else None
    if peak is not None and self._before is not None:
      self.bytes = peak - self._before
    return False


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


def cpus_available():
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine_report(tf, tf_ext, np, cpu_features=True):
  """Prints the machine (CPU model, CPUs available, OS), its CPU features unless not
  `cpu_features`, and the versions of Python, TensorFlow, tf_ext (with its folder) and numpy;
  returns the results' "machine" entry."""
  model, flags = cpu_model_and_flags()
  cpus = cpus_available()
  print(f"machine      : {model}, {cpus} CPUs available, {platform.system()} {platform.release()}")
  if cpu_features:
    print(f"CPU features : {' '.join(flags) or 'unknown'} (of {', '.join(CPU_FLAGS)})")
  print(
    f"versions     : Python {platform.python_version()}, TensorFlow {tf.__version__}, "
    f"tf_ext {tf_ext.__version__} ({os.path.dirname(tf_ext.__file__)}), numpy {np.__version__}"
  )
  return {"cpu": model, "cpus": cpus, "cpu_flags": flags}


def versions(tf, tf_ext, np, **more):
  """The results' "versions" entry; `more` (e.g. tfra=...) comes before numpy."""
  return {
    "python": platform.python_version(),
    "tensorflow": tf.__version__,
    "tf_ext": tf_ext.__version__,
    **more,
    "numpy": np.__version__,
  }


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


def verdict(ok):
  return "PASS" if ok else "MISS"


def rotated(names, round_index):
  """`names` starting at position round_index (mod len): the order of an interleaved round, so
  that no variant always runs first (or right after a given other one)."""
  shift = round_index % len(names)
  return names[shift:] + names[:shift]


def int_list(text):
  return [int(x) for x in text.split(",") if x.strip()]


def run_workers(script, args, workers, extra_argv, prefix):
  """Runs `script --worker W --dir DIR --keys K --dim D *extra_argv` for each W in `workers`,
  each in a fresh process (so that each measures its own peak RSS), in args.dir or a temporary
  folder removed afterwards; returns {W: the JSON object its last output line holds}."""
  own_dir = args.dir is None
  args.dir = args.dir or tempfile.mkdtemp(prefix=prefix)
  measured = {}
  try:
    for worker in workers:
      command = [sys.executable, os.path.abspath(script), "--worker", worker, "--dir", args.dir]
      command += ["--keys", str(args.keys), "--dim", str(args.dim), *extra_argv]
      log(f"[{worker}] {args.keys:,} rows, dim {args.dim}")
      out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
      measured[worker] = json.loads(out.strip().splitlines()[-1])
  finally:
    if own_dir:
      shutil.rmtree(args.dir, ignore_errors=True)
  return measured


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


# ---- lookup stalls (eviction.py, bulk_insert.py) ----------------------------------------------


class LookupLoop:
  """Back-to-back lookups in another thread, each recorded as (start, latency)."""

  def __init__(self, lookup, batches):
    self._lookup, self._batches = lookup, batches
    self._stop = threading.Event()
    self.records = []
    self._thread = threading.Thread(target=self._run, name="lookups", daemon=True)

  def _run(self):
    while not self._stop.is_set():
      for ids in self._batches:
        begin = time.perf_counter()
        self._lookup(ids)
        self.records.append((begin, time.perf_counter() - begin))

  def __enter__(self):
    self._thread.start()
    time.sleep(0.2)  # running before the first window
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()

  def window(self):
    """Times a window: `with loop.window() as w: ...`; w.latencies() after it."""
    return _Window(self)


class _Window:
  def __init__(self, loop):
    self._loop = loop

  def __enter__(self):
    self.begin = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.end = time.perf_counter()
    time.sleep(0.2)  # a gap, so that a lookup seldom overlaps two windows

  def latencies(self):
    """Latencies of the lookups that ran, at least partly, within the window."""
    return [
      lat for start, lat in self._loop.records if start < self.end and start + lat > self.begin
    ]


def summarize_windows(windows, target_ms):
  """Latency figures (ms) of a kind of window over the repeats; lookups over target_ms counted."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  every = [lat for w in windows for lat in w]
  longest = [max(w) * 1e3 for w in windows if w]
  p99 = float(np.percentile(np.asarray(every), 99)) * 1e3 if every else float("nan")
  return {
    "lookups": len(every),
    "median_ms": statistics.median(every) * 1e3 if every else float("nan"),
    "p99_ms": p99,
    "longest_ms": max(longest) if longest else float("nan"),
    "longest_per_window_ms": longest,
    "median_longest_ms": statistics.median(longest) if longest else float("nan"),
    "over_target": sum(lat * 1e3 > target_ms for lat in every),
  }


def busy_one_core(seconds):
  """A control window's work: one core busy for `seconds`, no table work (numpy's sort runs
  without the GIL, as a table op does)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  data = np.random.default_rng(1).random(1 << 20)
  end = time.perf_counter() + seconds
  while time.perf_counter() < end:
    np.sort(data)

"""What every benchmark script needs first: the checkout on sys.path, the argument parser's frame,
the optional TFRA import, progress logging, memory readings and the per-worker processes.
Imported as `_common` (the scripts run from this folder). Its neighbours: `_report` (the machine,
verdicts, charts, JSON), `_rounds` (interleaved rounds), `_lookup_stalls`, `_netns` and
`_horovod_cluster` (the emulated networks)."""

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

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


# ---- the command line -------------------------------------------------------------------------


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


def int_list(text):
  return [int(x) for x in text.split(",") if x.strip()]


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


# ---- memory -----------------------------------------------------------------------------------


def rss_bytes():
  """Resident set size of this process (Linux), or None."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return None


def process_rss(pid):
  """VmRSS of process `pid` (Linux), or None once it is gone."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError):
    pass
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


# ---- one process per worker -------------------------------------------------------------------


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

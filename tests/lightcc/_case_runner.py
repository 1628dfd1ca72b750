"""Rank program of a shared run (tests/lightcc/_launch.py's SharedRun): runs the cases of the plan
in $LIGHTCC_CASES one after another in this process, as if each had a process of its own.

Each case runs a worker's main(**config) (a _worker_*.py module, which calls hvd.init with the
case's settings) or, in one-process runs, `code` after `import tf_ext.lightcc as hvd`. Its
stdout and stderr (file descriptors 1 and 2: TensorFlow's and Horovod's own logs too) go to
case<index>.rank<rank>.{stdout,stderr}; its outcome (an exit status, as the process of its own
would have had: sys.exit's, or 1 and the traceback on stderr for an exception) to
case<index>.rank<rank>.json, written once the case is over.

Between cases: a rank whose case passed waits for the others to finish it (files, not a
collective: a rank whose case failed must not wait in a collective for ranks still inside
theirs); a rank whose case failed does not wait, so that peers left waiting for it in a
collective get Horovod's shutdown error instead of hanging. Then Horovod shuts down (horovodrun
runs: the next case's hvd.init starts it again, with that case's settings, once rank 0 has
emptied the launcher's rendezvous store (tests/lightcc/_horovodrun.py); one-process runs keep
it, as Horovod without a launcher cannot start again), and what a case leaves behind in the
process is reset: the environment, Keras's session, TensorFlow's default graph, global seed and
kernel caches, LightCC's per-graph state (traffic counters, TOPK residuals, fusion policies),
tf_ext's table registries and graph passes.

A case that disables eager execution (TF1 programs) must be the last of its run.
"""

import ctypes
import gc
import json
import os
import sys
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ["TF_EXT_ROOT"])
sys.path.insert(0, HERE)
import tensorflow as tf  # noqa: E402

import tf_ext  # noqa: E402
import tf_ext.lightcc as hvd  # noqa: E402
from tf_ext.dynamic_embedding import get_or_create, live_tables  # noqa: E402
from tf_ext.lightcc import config as lightcc_config  # noqa: E402
from tf_ext.lightcc import state as lightcc_state  # noqa: E402

# The slowest rank may end a case this long after the first without being stuck.
PEERS_GRACE_SECONDS = 120
_libc = ctypes.CDLL(None)


def _exit_status(code):
  """The exit status of a process that raised SystemExit(code)."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def _write_atomically(path, text):
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)


class _Redirected:
  """File descriptors 1 and 2 (and sys.stdout/err, which write to them) into two files."""

  def __init__(self, stdout_path, stderr_path):
    self.paths = stdout_path, stderr_path

  def _flush(self):
    sys.stdout.flush()
    sys.stderr.flush()
    _libc.fflush(None)

  def __enter__(self):
    self._flush()
    self.saved = [os.dup(1), os.dup(2)]
    for fd, path in zip((1, 2), self.paths):
      target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
      os.dup2(target, fd)
      os.close(target)

  def __exit__(self, *exc):
    self._flush()
    for fd, saved in zip((1, 2), self.saved):
      os.dup2(saved, fd)
      os.close(saved)


def run_case(case):
  """Runs one case here; returns its exit status."""
  os.environ.update(case["env"])
  try:
    if case["worker"]:
      __import__(case["worker"]).main(**case["config"])
    else:
      code = compile(f"import tf_ext.lightcc as hvd\n{case['code']}", "<string>", "exec")
      exec(code, {"__name__": "__main__"})  # as `python -c` runs it
  except SystemExit as exit_:
    return _exit_status(exit_.code)
  except BaseException:  # noqa: BLE001 (as the interpreter reports an uncaught exception)
    traceback.print_exc()
    return 1
  return 0


def reset(base_env, graph_passes):
  """What one case may leave in this process, back as a fresh process has it."""
  os.environ.clear()
  os.environ.update(base_env)
  tf.keras.backend.clear_session()
  if tf.executing_eagerly():  # (TF1 programs: the last case of a run)
    tf.compat.v1.reset_default_graph()
    tf.random.set_seed(None)  # no global seed, and the kernel caches (op seeds' streams) cleared
  lightcc_state._graph_states.clear()
  lightcc_state.process.config = lightcc_config.LightConfig()
  lightcc_state.process.topology = None
  lightcc_state.process.init_call = ((), {})
  with get_or_create._registry_lock:
    get_or_create._registry.clear()
  live_tables._eager_tables.clear()
  live_tables._graph_tables.clear()
  if tf_ext.graph_optimizations.enabled() != graph_passes:
    tf_ext.graph_optimizations.enable(**graph_passes)
  gc.collect()


def wait_for_peers(paths):
  """Waits for the files the other ranks write (at most PEERS_GRACE_SECONDS)."""
  deadline = time.time() + PEERS_GRACE_SECONDS
  while not all(os.path.exists(p) for p in paths):
    if time.time() > deadline:
      missing = [p for p in paths if not os.path.exists(p)]
      print(
        f"shared run: still no {missing} after {PEERS_GRACE_SECONDS} s; going on (the peers' "
        "collectives then fail)",
        flush=True,
      )
      return
    time.sleep(0.05)


def reset_rendezvous(prefix, rank, ranks):
  """Once every rank has shut Horovod down, rank 0 empties the launcher's rendezvous store
  (tests/lightcc/_horovodrun.py), and the others wait for it: the next initialization starts
  from an empty store, as in a fresh horovodrun."""
  _write_atomically(f"{prefix}.rank{rank}.down", "")
  wait_for_peers([f"{prefix}.rank{r}.down" for r in range(ranks)])
  if rank == 0:
    address = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    request = urllib.request.Request(f"http://{address}:{port}/lightcc_reset/all", method="DELETE")
    urllib.request.urlopen(request, timeout=30).close()
    _write_atomically(f"{prefix}.reset", "")
  else:
    wait_for_peers([f"{prefix}.reset"])


def main():
  with open(os.environ["LIGHTCC_CASES"]) as f:
    plan = json.load(f)
  directory, ranks = plan["directory"], plan["ranks"]
  rank = int(os.environ.get("HOROVOD_RANK", "0"))
  base_env = dict(os.environ)
  graph_passes = tf_ext.graph_optimizations.enabled()
  for index, case in enumerate(plan["cases"]):
    path = os.path.join(directory, f"case{index:03d}.rank{rank}")
    start = time.time()
    with _Redirected(path + ".stdout", path + ".stderr"):
      returncode = run_case(case)
    seconds = time.time() - start
    _write_atomically(
      path + ".json",
      json.dumps(
        {"case": case["name"], "rank": rank, "returncode": returncode, "seconds": seconds}
      ),
    )
    print(
      f"shared run: rank {rank}: case {case['name']} exit {returncode} in {seconds:.1f} s",
      flush=True,
    )
    if ranks is not None:
      if returncode == 0:  # (a failed rank shuts down at once: peers waiting on it then fail)
        wait_for_peers(
          [os.path.join(directory, f"case{index:03d}.rank{r}.json") for r in range(ranks)]
        )
      if hvd.is_initialized():
        hvd.shutdown()
      if index + 1 < len(plan["cases"]):
        reset_rendezvous(os.path.join(directory, f"case{index:03d}"), rank, ranks)
    if index + 1 < len(plan["cases"]):
      reset(base_env, graph_passes)


if __name__ == "__main__":
  main()

"""The fuzzer's side of _op_worker.py: one child process at a time runs the calls, and a call that
kills it (a signal), hangs or overruns the memory bound is reported as such, with the end of the
child's log; the next call gets a fresh child."""

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_op_worker.py")
# Seconds one call may take before it counts as a hang (a Session start included, on a loaded
# 2-core machine); and for the child to import TensorFlow and load the library.
CALL_TIMEOUT_S = float(os.environ.get("FUZZ_OPS_CALL_TIMEOUT_S", "60"))
START_TIMEOUT_S = 300.0
# The child's address space beyond what it holds after loading (see _op_worker.py).
MEMORY_BOUND_MB = int(os.environ.get("FUZZ_OPS_MEMORY_BOUND_MB", "4096"))


class Outcome:
  """What one call came to: a result, a clean error, or a failure (crash, hang)."""

  def __init__(self, kind, detail="", log=""):
    self.kind = kind  # result, tf_error, rejected | signal, exit, hang
    self.detail = detail
    self.log = log

  @property
  def clean(self):
    return self.kind in ("result", "tf_error", "rejected")

  def __repr__(self):
    text = f"{self.kind}: {self.detail}"
    return text + (f"\n--- the child's log ends with:\n{self.log}" if self.log else "")


class Worker:
  def __init__(self):
    self.scratch = tempfile.TemporaryDirectory(prefix="fuzz_ops_")
    self.log = open(os.path.join(self.scratch.name, "worker.log"), "w+b")
    env = dict(
      os.environ,
      # The child imports tf_ext as this process does (a checkout, or Bazel's runfiles).
      PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
      TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
      FUZZ_OPS_MEMORY_BOUND_MB=str(MEMORY_BOUND_MB),
      # Few malloc arenas: each thread's would reserve address space under the cap.
      MALLOC_ARENA_MAX="2",
    )
    self.proc = subprocess.Popen(
      [sys.executable, WORKER],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self.log,
      cwd=self.scratch.name,  # relative paths the fuzzer writes (snapshots) land here
      env=env,
    )
    self.buffer = b""
    self.call_log_start = 0
    ready = self._read_line(START_TIMEOUT_S)
    if ready is None or "ready" not in json.loads(ready):
      raise RuntimeError(f"the fuzz worker did not start: {self._failure(START_TIMEOUT_S)!r}")

  def _read_line(self, timeout):
    deadline = time.monotonic() + timeout
    fd = self.proc.stdout.fileno()
    with selectors.DefaultSelector() as selector:
      selector.register(fd, selectors.EVENT_READ)
      while b"\n" not in self.buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not selector.select(left):
          return None
        chunk = os.read(fd, 65536)
        if not chunk:
          return None
        self.buffer += chunk
    line, self.buffer = self.buffer.split(b"\n", 1)
    return line

  def _log_tail(self, lines=25):
    """The end of what the child logged during the last call."""
    self.log.flush()
    self.log.seek(self.call_log_start)
    text = self.log.read().decode("utf-8", "replace").splitlines()
    return "\n".join(line for line in text[-lines:] if "Unable to register" not in line)

  def _failure(self, timeout):
    """The Outcome of a child that did not answer within `timeout`."""
    try:
      code = self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
      return Outcome("hang", f"no answer within {timeout:.0f} s", self._log_tail())
    if code < 0:
      return Outcome("signal", signal.Signals(-code).name, self._log_tail())
    return Outcome("exit", f"exit status {code}", self._log_tail())

  def call(self, call):
    self.log.seek(0, os.SEEK_END)
    self.call_log_start = self.log.tell()
    self.proc.stdin.write((json.dumps(call) + "\n").encode())
    self.proc.stdin.flush()
    line = self._read_line(CALL_TIMEOUT_S)
    if line is None:
      return self._failure(CALL_TIMEOUT_S)
    answer = json.loads(line)
    return Outcome(answer["outcome"], answer.get("detail", ""))

  @property
  def alive(self):
    return self.proc.poll() is None

  def close(self):
    if self.alive:
      self.proc.stdin.close()
      try:
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self.log.close()
    self.scratch.cleanup()


class Workers:
  """Runs calls in a live worker, replacing it after a call that took it down."""

  def __init__(self):
    self.worker = None
    self.started = 0

  def call(self, call):
    if self.worker is None or not self.worker.alive:
      if self.worker is not None:
        self.worker.close()
      self.worker = Worker()
      self.started += 1
    outcome = self.worker.call(call)
    if not outcome.clean and self.worker.alive:  # a hang: never reuse that child
      self.worker.proc.kill()
      self.worker.proc.wait()
    return outcome

  def close(self):
    if self.worker is not None:
      self.worker.close()

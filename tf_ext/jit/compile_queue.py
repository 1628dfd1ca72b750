"""The background compile queue of a tf_ext.jit function.

Jobs (compilations, the probe of a signature) are callables run one at a time, in order (a job
may go first), by one daemon thread started at the first job; a call of the function never waits
for them. Without asynchronous compilation (TF_EXT_JIT_ASYNC=0) there is no thread: the calling
thread runs the queued jobs (`run_queued`).

The owner's interface:
  push(job, first)   queue a job (nothing once closed)
  busy               whether a job is queued or running
  run_queued()       run the queued jobs in the calling thread
  wait(timeout)      block until no job is queued or running
  paused()           a context in which no job starts (the running one finishes)
  close()            drop the queued jobs and stop the thread after the running one

The queue's condition variable uses the owner's lock: the owner queues a job and updates what the
job is for (its executable cache) in one step, and reads `busy` under that lock.
"""

import collections
import contextlib
import threading
import time


class CompileQueue:
  """See the module doc. `lock`: the owner's (a threading.RLock); `thread_name`: the worker's
  name; `threaded`: whether jobs run in the worker thread (else only in run_queued)."""

  def __init__(self, lock, thread_name, threaded):
    self._cond = threading.Condition(lock)
    self._thread_name = thread_name
    self._threaded = threaded
    self._jobs = collections.deque()
    self._pending = 0  # jobs queued or running
    self._resume = threading.Event()  # cleared while paused
    self._resume.set()
    self._closed = False
    self._thread = None

  @property
  def busy(self):
    return self._pending > 0

  @property
  def closed(self):
    return self._closed

  def push(self, job, first=False):
    """Queues `job` (a callable), ahead of the others if `first`."""
    with self._cond:
      if self._closed:
        return
      if first:
        self._jobs.appendleft(job)
      else:
        self._jobs.append(job)
      self._pending += 1
      if self._threaded and self._thread is None:
        self._thread = threading.Thread(target=self._work, name=self._thread_name, daemon=True)
        self._thread.start()
      self._cond.notify_all()

  def run_queued(self):
    """Runs the queued jobs in the calling thread; returns whether there were any."""
    ran = False
    while True:
      with self._cond:
        if not self._jobs:
          return ran
        job = self._jobs.popleft()
      self._run(job)
      ran = True

  def wait(self, timeout=None):
    """Blocks until no job is queued or running; False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._cond:
      while self._pending:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          return False
        self._cond.wait(left)
    return True

  @contextlib.contextmanager
  def paused(self):
    self._resume.clear()
    try:
      yield
    finally:
      self._resume.set()

  def close(self):
    with self._cond:
      self._closed = True
      self._jobs.clear()
      self._pending = 0
      self._cond.notify_all()
    self._resume.set()
    if self._thread is not None:
      self._thread.join()

  def _work(self):
    while True:
      with self._cond:
        while not self._jobs and not self._closed:
          self._cond.wait()
        if self._closed:
          return
      self._resume.wait()
      with self._cond:
        if self._closed or not self._jobs:
          continue
        job = self._jobs.popleft()
      self._run(job)

  def _run(self, job):
    try:
      job()
    finally:
      with self._cond:
        self._pending = max(0, self._pending - 1)
        self._cond.notify_all()

"""Launches LightCC test programs on real ranks: horovodrun --gloo -np 4 -H localhost:4.

Starting TensorFlow in every rank is most of a small case's time, so the cases of a test file
share their ranks: `SharedRun` starts one horovodrun for a list of `Case`s, whose ranks run the
cases one after another in the same processes (tests/lightcc/_case_runner.py: LightCC shut down
and initialized again with each case's settings, the process's other state reset between them),
and each test reads its own case's `CaseResult`, which holds what a horovodrun of its own gave
(returncode, each rank's stdout and stderr prefixed as horovodrun prefixes them).
`one_process_results` does the same for programs of one process (what `init_in_subprocess` runs).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TAIL = 4000  # characters of output a failure shows, per stream


def _launcher():
  bin_dir = os.path.dirname(sys.executable)
  launcher = shutil.which("horovodrun", path=bin_dir + os.pathsep + os.environ["PATH"])
  assert launcher, "horovodrun not found next to the test's python (make setup installs Horovod)"
  return launcher


def _run_env(**env):
  bin_dir = os.path.dirname(sys.executable)
  return dict(
    os.environ,
    TF_EXT_ROOT=ROOT,
    TF_CPP_MIN_LOG_LEVEL="3",
    PATH=bin_dir + os.pathsep + os.environ["PATH"],
    **{k: str(v) for k, v in env.items()},
  )


def _horovodrun_argv(ranks):
  return [_launcher(), "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}", sys.executable]


def horovodrun(worker, ranks=4, timeout=600, **env):
  """One program on `ranks` ranks of its own (the worker run as a script: its settings in env)."""
  return subprocess.run(
    _horovodrun_argv(ranks) + [os.path.join(HERE, worker)],
    env=_run_env(**env),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def assert_ok(proc):
  assert proc.returncode == 0, proc.stdout[-TAIL:] + proc.stderr[-TAIL:]


def init_in_subprocess(env, code="hvd.init()"):
  """Runs `code` after `import tf_ext.lightcc as hvd` in a fresh single process."""
  run_env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", **env)
  return subprocess.run(
    [sys.executable, "-c", f"import tf_ext.lightcc as hvd\n{code}"],
    env=run_env,
    capture_output=True,
    text=True,
    timeout=120,
  )


class Case:
  """One case of a shared run: `worker`'s main(**config) (a _worker_*.py module), or `code` run
  after `import tf_ext.lightcc as hvd` (one-process runs). `env`: environment variables set for
  this case only. `tests`: names of the test functions that read it (a run skips the cases of
  tests pytest did not select; None: always run). `timeout`: seconds this case may take."""

  def __init__(
    self, name, worker=None, config=None, *, code=None, env=None, tests=None, timeout=300
  ):
    assert (worker is None) != (code is None), "a case runs a worker or code"
    self.name, self.worker, self.code = name, worker, code
    self.config = dict(config or {})
    self.env = {k: str(v) for k, v in (env or {}).items()}
    self.tests = (tests,) if isinstance(tests, str) else tests
    self.timeout = timeout

  def plan(self):
    worker = self.worker[: -len(".py")] if self.worker and self.worker.endswith(".py") else None
    return {
      "name": self.name,
      "worker": worker,
      "config": self.config,
      "code": self.code,
      "env": self.env,
    }

  def __repr__(self):
    what = f"{self.worker} {self.config}" if self.worker else "code"
    return f"case {self.name!r} ({what}{' env ' + str(self.env) if self.env else ''})"


class CaseResult:
  """What a run of one case gave: as subprocess.run's result of a horovodrun of its own."""

  def __init__(self, returncode, stdout, stderr):
    self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def selected_tests(request):
  """Names of the test functions of `request`'s module that pytest selected."""
  return {
    getattr(item, "originalname", item.name)
    for item in request.session.items
    if getattr(item, "module", None) is request.module
  }


def selected(cases, request):
  """The cases that a test pytest selected in `request`'s module reads (or that every run runs)."""
  names = selected_tests(request)
  return [c for c in cases if c.tests is None or names & set(c.tests)]


class SharedRun:
  """One horovodrun (or one process, ranks=None) that runs `cases` in order, each rank all of
  them in one process. Started by the first result() call; stop() ends it.

  result(name) waits for that case's outcome on every rank. A case may take its own timeout,
  counted from the end of the case before it (the first also gets `startup` seconds); past it,
  the run is killed. A case that did not report on every rank (the run timed out, crashed or
  ended) fails with what its ranks printed so far and the launcher's output.

  `after`: what must be over before this run starts (another SharedRun, whose cases it reads,
  or a callable, e.g. a program of its own whose files this run reads).
  """

  def __init__(self, cases, ranks=4, directory=None, startup=180, label=None, after=()):
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), f"cases named twice: {names}"
    self.cases, self.ranks, self.startup = list(cases), ranks, startup
    self.label = label or ", ".join(names)
    self._given_directory = directory
    self.directory = None
    self._proc = None
    self._stopped_why = None
    self._deadline = None  # of the next case not yet reported
    self._after = list(after)

  # -- the run -------------------------------------------------------------------------------
  def _start(self):
    if self._proc is not None or not self.cases:
      return
    for before in self._after:
      before.finish() if isinstance(before, SharedRun) else before()
    self.directory = str(self._given_directory or tempfile.mkdtemp(prefix="lightcc_shared_"))
    os.makedirs(self.directory, exist_ok=True)
    plan_path = os.path.join(self.directory, "plan.json")
    with open(plan_path, "w") as f:
      json.dump(
        {
          "directory": self.directory,
          "ranks": self.ranks,
          "cases": [c.plan() for c in self.cases],
        },
        f,
      )
    runner = os.path.join(HERE, "_case_runner.py")
    if self.ranks is None:  # one process, no launcher (as init_in_subprocess)
      argv = [sys.executable, runner]
      env = dict(os.environ, PYTHONPATH=ROOT, TF_EXT_ROOT=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    else:
      # Horovod's launcher, whose rendezvous server the ranks reset between cases.
      argv = _horovodrun_argv(self.ranks) + [runner]
      argv[0:1] = [sys.executable, os.path.join(HERE, "_horovodrun.py")]
      env = _run_env()
    env["LIGHTCC_CASES"] = plan_path
    self._out = open(os.path.join(self.directory, "launcher.stdout"), "w")
    self._err = open(os.path.join(self.directory, "launcher.stderr"), "w")
    self._started = time.time()
    self._deadline = self._started + self.startup + self.cases[0].timeout
    self._next = 0  # the first case not yet seen reported on every rank
    self._proc = subprocess.Popen(
      argv, env=env, stdout=self._out, stderr=self._err, text=True, start_new_session=True
    )

  def stop(self, why=None):
    """Ends the run (its whole process group) if it still runs."""
    if self._proc is None or self._proc.poll() is not None:
      return
    self._stopped_why = self._stopped_why or why or "stopped"
    try:
      os.killpg(self._proc.pid, signal.SIGTERM)
      self._proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
      pass
    try:
      os.killpg(self._proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self._proc.wait()

  def finish(self):
    """Waits for every case and for the run to end (at most a minute after its last case)."""
    for case in self.cases:
      self.result(case.name)
    if self._proc is not None:
      try:
        self._proc.wait(60)
      except subprocess.TimeoutExpired:
        self.stop("it did not end within a minute of its last case")

  def close(self):
    if self._proc is not None and all(self._reported(i) for i in range(len(self.cases))):
      try:  # (its ranks shut down and exit)
        self._proc.wait(60)
      except subprocess.TimeoutExpired:
        pass
    self.stop("the tests that read it are over")
    for stream in (getattr(self, "_out", None), getattr(self, "_err", None)):
      if stream:
        stream.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # -- results -------------------------------------------------------------------------------
  def _ranks(self):
    return range(self.ranks or 1)

  def _path(self, index, rank, kind):
    return os.path.join(self.directory, f"case{index:03d}.rank{rank}.{kind}")

  def _reported(self, index):
    return all(os.path.exists(self._path(index, r, "json")) for r in self._ranks())

  def _read(self, path):
    try:
      with open(path, errors="replace") as f:
        return f.read()
    except FileNotFoundError:
      return ""

  def _streams(self, index):
    """Each rank's stdout and stderr of case `index`, as horovodrun prefixes them."""
    out, err = [], []
    for r in self._ranks():
      for kind, lines in (("stdout", out), ("stderr", err)):
        text = self._read(self._path(index, r, kind))
        prefix = "" if self.ranks is None else f"[{r}]<{kind}>:"
        lines += [prefix + line for line in text.splitlines(keepends=True)]
    return "".join(out), "".join(err)

  def result(self, name):
    """`name`'s CaseResult, once every rank reported it (or the run ended without it)."""
    index = next((i for i, c in enumerate(self.cases) if c.name == name), None)
    assert index is not None, f"no case {name!r} in the shared run of {self.label}"
    self._start()
    while not self._reported(index):
      # Deadlines run case by case: each case's timeout starts when the one before it ended.
      while self._next < index and self._reported(self._next):
        ended = max(os.path.getmtime(self._path(self._next, r, "json")) for r in self._ranks())
        self._next += 1
        self._deadline = ended + self.cases[self._next].timeout
      if self._proc.poll() is not None:
        if self._reported(index):  # (its last rank reported as the run ended)
          break
        return self._missing(index)
      if time.time() > self._deadline:
        late = self.cases[self._next]
        self.stop(f"{late!r} ran past its timeout of {late.timeout} s")
        return self._missing(index)
      time.sleep(0.2)
    outcomes = [json.loads(self._read(self._path(index, r, "json"))) for r in self._ranks()]
    stdout, stderr = self._streams(index)
    failed = [o for o in outcomes if o["returncode"]]
    returncode = failed[0]["returncode"] if failed else 0
    if failed:
      ranks = ", ".join(f"rank {o['rank']} exit {o['returncode']}" for o in failed)
      stderr = f"{self.cases[index]!r} of the shared run of {self.label}: {ranks}\n" + stderr
    return CaseResult(returncode, stdout, stderr)

  def _missing(self, index):
    """The result of a case the run ended (or was stopped) without: it fails, naming why."""
    case = self.cases[index]
    stdout, stderr = self._streams(index)
    launcher_out = self._read(os.path.join(self.directory, "launcher.stdout"))
    launcher_err = self._read(os.path.join(self.directory, "launcher.stderr"))
    why = self._stopped_why or f"the run ended (exit {self._proc.returncode})"
    reported = [r for r in self._ranks() if os.path.exists(self._path(index, r, "json"))]
    header = (
      f"{case!r} of the shared run of {self.label} did not finish on every rank (reported: "
      f"{reported}): {why}, {time.time() - self._started:.0f} s after the start\n"
    )
    return CaseResult(
      self._proc.returncode if self._proc.returncode not in (None, 0) else -9,
      stdout + "\n--- the launcher's stdout (tail)\n" + launcher_out[-TAIL:],
      header + stderr[-TAIL:] + "\n--- the launcher's stderr (tail)\n" + launcher_err[-TAIL:],
    )


def shared_run(request, tmp_path_factory, cases, ranks=4, **kwargs):
  """A SharedRun of the `cases` that selected tests of `request`'s module read, closed when
  the module's tests end (for a module-scoped fixture)."""
  run = SharedRun(
    selected(cases, request),
    ranks=ranks,
    directory=tmp_path_factory.mktemp(f"shared_{ranks or 1}ranks"),
    **kwargs,
  )
  request.addfinalizer(run.close)
  return run

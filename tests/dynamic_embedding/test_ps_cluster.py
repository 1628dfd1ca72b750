"""Sharded tables on TensorFlow's own parameter-server runtime, with real processes on loopback:
2 PS tasks, a chief and a worker train with MonitoredTrainingSession; each PS holds about half the
rows; after a checkpoint, one PS is killed and restarted, the chief restores, lookups match the
checkpoint and training goes on. Also: an unreachable PS is a clear error, not a hang."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from _subprocess import ROOT

TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ps_task.py")
WAIT_S = 60  # every wait is bounded: the whole test fails instead of hanging


def _free_ports(n):
  """n distinct free loopback ports (held together while chosen, so they differ)."""
  with contextlib.ExitStack() as stack:
    sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]


class Cluster:
  """The processes of one test: started with a TF_CONFIG each, logged to files, all killed at
  the end whatever happens."""

  def __init__(self, tmp_path):
    ports = _free_ports(4)
    self.spec = {
      "ps": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
      "chief": [f"127.0.0.1:{ports[2]}"],
      "worker": [f"127.0.0.1:{ports[3]}"],
    }
    self.tmp = tmp_path
    self.procs = {}

  def start(self, name, job, index, *args, spec=None):
    env = dict(
      os.environ,
      PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
      TF_CPP_MIN_LOG_LEVEL="2",
      TF_CONFIG=json.dumps({"cluster": spec or self.spec, "task": {"type": job, "index": index}}),
    )
    log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
      [sys.executable, TASK, *map(str, args)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    self.procs[name] = (proc, log)
    return proc

  def log(self, name):
    return (self.tmp / f"{name}.log").read_text()

  def wait_ready(self, name):
    deadline = time.monotonic() + WAIT_S
    while "READY" not in self.log(name):
      assert self.procs[name][0].poll() is None, f"{name} exited:\n{self.log(name)}"
      assert time.monotonic() < deadline, f"{name} not ready in {WAIT_S} s:\n{self.log(name)}"
      time.sleep(0.1)

  def wait(self, name, timeout=120):
    proc = self.procs[name][0]
    try:
      rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
      raise AssertionError(f"{name} still running after {timeout} s:\n{self.log(name)}") from None
    assert rc == 0, f"{name} failed ({rc}):\n{self.log(name)}"

  def kill(self, name):
    proc, log = self.procs.pop(name)
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    log.close()

  def close(self):
    for name in list(self.procs):
      self.kill(name)


@pytest.fixture
def cluster(tmp_path):
  c = Cluster(tmp_path)
  try:
    yield c
  finally:
    c.close()


def test_train_checkpoint_kill_a_ps_restore_and_continue(cluster, tmp_path):
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  for i in range(2):
    cluster.start(f"ps{i}", "ps", i, "ps")
  for i in range(2):
    cluster.wait_ready(f"ps{i}")
  chief_out, worker_out = tmp_path / "chief.json", tmp_path / "worker.json"
  cluster.start("chief", "chief", 0, "train", model_dir, chief_out, WAIT_S)
  cluster.start("worker", "worker", 0, "train", model_dir, worker_out, WAIT_S)
  cluster.wait("worker", 150)
  cluster.wait("chief", 150)
  trained = json.loads(chief_out.read_text())
  assert json.loads(worker_out.read_text())["own_steps"] == 20

  # 1-2. Trained together; each PS holds one shard, about half the rows.
  # (Round robin over all variables: the global step went first, so shard 0 may be on task 1.)
  assert sorted(trained["devices"]) == ["/job:ps/task:0", "/job:ps/task:1"]
  assert trained["saved"]["step"] >= 30
  sizes = trained["saved"]["sizes"]
  assert sum(sizes) > 900 and all(abs(s - sum(sizes) / 2) < 0.1 * sum(sizes) for s in sizes)
  assert trained["checkpoint"].endswith(f"-{trained['saved']['step']}")

  # 4. PS 1 dies (SIGKILL) and comes back on the same port, empty.
  cluster.kill("ps1")
  cluster.start("ps1_again", "ps", 1, "ps")
  cluster.wait_ready("ps1_again")

  # 5-6. The chief restores the checkpoint: lookups are the checkpoint's; training goes on.
  out = tmp_path / "restored.json"
  cluster.start("chief_again", "chief", 0, "restore", model_dir, out, WAIT_S)
  cluster.wait("chief_again", 120)
  restored = json.loads(out.read_text())
  on_ps1 = trained["devices"].index("/job:ps/task:1")
  expected = [0 if i == on_ps1 else size for i, size in enumerate(sizes)]
  assert restored["sizes_before_restore"] == expected  # rows live in the PS processes
  assert restored["restored"]["step"] == trained["saved"]["step"]
  assert restored["restored"]["sizes"] == sizes
  np.testing.assert_array_equal(restored["restored"]["probe"], trained["saved"]["probe"])
  assert restored["after"]["step"] == trained["saved"]["step"] + 5
  assert np.all(np.isfinite(restored["losses"]))
  assert not np.array_equal(restored["after"]["probe"], trained["saved"]["probe"])


def test_unreachable_ps_fails_clearly_within_the_timeout(cluster, tmp_path):
  # Nobody listens on the PS ports: the trainer must fail fast, naming them, not hang.
  start = time.monotonic()
  cluster.start("chief", "chief", 0, "train", tmp_path, tmp_path / "out.json", 5)
  proc = cluster.procs["chief"][0]
  try:
    rc = proc.wait(60)
  except subprocess.TimeoutExpired:
    raise AssertionError(f"hung:\n{cluster.log('chief')}") from None
  log = cluster.log("chief")
  assert rc != 0 and time.monotonic() - start < 60
  assert "DeadlineExceededError" in log and "unreachable after 5 s" in log, log
  for address in cluster.spec["ps"]:
    assert address in log

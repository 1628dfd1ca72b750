"""Launches LightCC test programs on real ranks: horovodrun --gloo -np 4 -H localhost:4."""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def horovodrun(worker, ranks=4, timeout=600, **env):
  bin_dir = os.path.dirname(sys.executable)
  launcher = shutil.which("horovodrun", path=bin_dir + os.pathsep + os.environ["PATH"])
  assert launcher, "horovodrun not found next to the test's python (make setup installs Horovod)"
  run_env = dict(
    os.environ,
    TF_EXT_ROOT=ROOT,
    TF_CPP_MIN_LOG_LEVEL="3",
    PATH=bin_dir + os.pathsep + os.environ["PATH"],
    **{k: str(v) for k, v in env.items()},
  )
  return subprocess.run(
    [
      launcher,
      "--gloo",
      "-np",
      str(ranks),
      "-H",
      f"localhost:{ranks}",
      sys.executable,
      os.path.join(HERE, worker),
    ],
    env=run_env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def assert_ok(proc):
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


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

"""TFRA's HvdAllToAllEmbedding over tf_ext's all-to-all tables, on two real ranks."""

import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def test_hvd_all_to_all_embedding_trains_as_one_process_on_the_global_batch():
  bin_dir = os.path.dirname(sys.executable)
  launcher = shutil.which("horovodrun", path=bin_dir + os.pathsep + os.environ["PATH"])
  assert launcher, "horovodrun not found next to the test's python (make setup installs Horovod)"
  env = dict(
    os.environ,
    TF_EXT_ROOT=ROOT,
    TF_CPP_MIN_LOG_LEVEL="3",
    PATH=bin_dir + os.pathsep + os.environ["PATH"],
  )
  proc = subprocess.run(
    [
      launcher,
      "--gloo",
      "-np",
      "2",
      "-H",
      "localhost:2",
      sys.executable,
      os.path.join(HERE, "_worker_alltoall.py"),
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
  summaries = re.findall(r"rank \d+: (\d+) cases, 0 failures", proc.stdout)
  assert len(summaries) == 2 and all(int(n) >= 6 for n in summaries), proc.stdout

"""TFRA's HvdAllToAllEmbedding over tf_ext's all-to-all tables, on two real ranks."""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# LightCC's launcher of real ranks (tests/lightcc/_launch.py).
sys.path.insert(0, os.path.join(os.path.dirname(HERE), os.pardir, "lightcc"))
from _launch import assert_ok, horovodrun  # noqa: E402


def test_hvd_all_to_all_embedding_trains_as_one_process_on_the_global_batch():
  proc = horovodrun(os.path.join(HERE, "_worker_alltoall.py"), ranks=2, timeout=300)
  assert_ok(proc)
  summaries = re.findall(r"rank \d+: (\d+) cases, 0 failures", proc.stdout)
  assert len(summaries) == 2 and all(int(n) >= 6 for n in summaries), proc.stdout

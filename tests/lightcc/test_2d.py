"""2D allreduce equals Horovod's flat allreduce (real ranks)."""

import pytest
from _launch import assert_ok, horovodrun


@pytest.mark.parametrize("intra", [2, 4, 1])
def test_2d_allreduce_equals_flat_for_dtypes_lengths_and_ops(intra):
  assert_ok(horovodrun("_worker_2d.py", INTRA=intra))

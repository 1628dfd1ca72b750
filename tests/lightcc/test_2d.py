"""2D allreduce equals Horovod's flat allreduce (real ranks: one horovodrun for every case)."""

import pytest
from _launch import Case, assert_ok, shared_run

INTRAS = [2, 4, 1]
TEST = "test_2d_allreduce_equals_flat_for_dtypes_lengths_and_ops"


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
  cases = [Case(f"intra{i}", "_worker_2d.py", {"intra": i}, tests=TEST) for i in INTRAS]
  return shared_run(request, tmp_path_factory, cases)


@pytest.mark.parametrize("intra", INTRAS)
def test_2d_allreduce_equals_flat_for_dtypes_lengths_and_ops(ranks, intra):
  assert_ok(ranks.result(f"intra{intra}"))

"""LossAwareOptimizer with LightCC on real ranks: one decision for all ranks, in any wrapping
order, in TF1, Keras and GradientTape training (one horovodrun for both cases)."""

import pytest
from _launch import Case, assert_ok, shared_run


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
  test = "test_ranks_fall_back_and_return_together_and_stay_identical"
  cases = [
    Case(f"light{light}", "_worker_amp.py", {"light": light}, tests=test) for light in (0, 1)
  ]
  return shared_run(request, tmp_path_factory, cases, ranks=2)


@pytest.mark.parametrize("light", [0, 1], ids=["horovod_wrappers", "lightcc_2d"])
def test_ranks_fall_back_and_return_together_and_stay_identical(ranks, light):
  assert_ok(ranks.result(f"light{light}"))

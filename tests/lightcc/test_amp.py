"""LossAwareOptimizer with LightCC on real ranks: one decision for all ranks, in any wrapping
order, in TF1, Keras and GradientTape training."""

import pytest
from _launch import assert_ok, horovodrun


@pytest.mark.parametrize("light", [0, 1], ids=["horovod_wrappers", "lightcc_2d"])
def test_ranks_fall_back_and_return_together_and_stay_identical(light):
  assert_ok(horovodrun("_worker_amp.py", ranks=2, LIGHT=light))

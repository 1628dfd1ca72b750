"""DynamicEmbeddingOptimizer and LightCC's wrappers compose in any order (real ranks)."""

import pytest
from _launch import assert_ok, horovodrun


@pytest.mark.parametrize("light", [0, 1], ids=["horovod_wrappers", "lightcc_2d_topk"])
def test_wrappers_compose_in_any_order_in_tf1_keras_and_tape_training(light):
  assert_ok(horovodrun("_worker_composition.py", LIGHT=light))

"""DynamicEmbeddingOptimizer and LightCC's wrappers compose in any order (real ranks: one
horovodrun for both cases)."""

import pytest
from _launch import Case, assert_ok, shared_run


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
  test = "test_wrappers_compose_in_any_order_in_tf1_keras_and_tape_training"
  cases = [
    Case(f"light{light}", "_worker_composition.py", {"light": light}, tests=test)
    for light in (0, 1)
  ]
  return shared_run(request, tmp_path_factory, cases)


@pytest.mark.parametrize("light", [0, 1], ids=["horovod_wrappers", "lightcc_2d_topk"])
def test_wrappers_compose_in_any_order_in_tf1_keras_and_tape_training(ranks, light):
  assert_ok(ranks.result(f"light{light}"))

"""Each bucket's exchange overlaps the rest of the backward pass and is released on its own
(real ranks: one horovodrun for every case)."""

import pytest
from _launch import Case, assert_ok, shared_run

CONFIGS = ["2d", "2d+topk", "fusion", "2d+topk+fusion"]


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
  test = "test_buckets_are_released_before_the_last_gradient_exists"
  cases = [Case(c, "_worker_overlap.py", {"config": c}, tests=test) for c in CONFIGS]
  return shared_run(request, tmp_path_factory, cases)


@pytest.mark.parametrize("config", CONFIGS)
def test_buckets_are_released_before_the_last_gradient_exists(ranks, config):
  assert_ok(ranks.result(config))

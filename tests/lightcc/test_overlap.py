"""Each bucket's exchange overlaps the rest of the backward pass and is released on its own
(real ranks)."""

import pytest
from _launch import assert_ok, horovodrun


@pytest.mark.parametrize("config", ["2d", "2d+topk", "fusion", "2d+topk+fusion"])
def test_buckets_are_released_before_the_last_gradient_exists(config):
  assert_ok(horovodrun("_worker_overlap.py", CONFIG=config))

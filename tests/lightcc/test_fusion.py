"""Adaptive gradient fusion with real ranks."""

import pytest
from _launch import assert_ok, horovodrun


@pytest.mark.parametrize("two_d,topk", [(0, 0), (1, 0), (1, 1)])
def test_adaptive_fusion_reduces_like_horovod_and_ranks_switch_together(two_d, topk):
  assert_ok(horovodrun("_worker_fusion.py", TWO_D=two_d, TOPK=topk))


def test_a_frozen_choice_retraced_holds_one_bucketing_and_reduces_alike():
  assert_ok(horovodrun("_worker_fusion.py", TWO_D=1, TOPK=1, FREEZE=1))

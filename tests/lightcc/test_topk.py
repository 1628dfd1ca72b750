"""TOPK compression with error feedback (real ranks)."""

import pytest
from _launch import assert_ok, horovodrun


@pytest.mark.parametrize("two_d", [0, 1])
def test_topk_with_ratio_one_equals_dense(two_d):
  assert_ok(horovodrun("_worker_topk.py", MODE="dense_equal", TWO_D=two_d))


@pytest.mark.parametrize("two_d,fp16", [(0, 0), (1, 1)])
def test_error_feedback_sent_sum_approaches_gradient_sum(two_d, fp16):
  assert_ok(horovodrun("_worker_topk.py", MODE="feedback", TWO_D=two_d, FP16=fp16))

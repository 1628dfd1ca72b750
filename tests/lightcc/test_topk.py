"""TOPK compression with error feedback (real ranks: one horovodrun for every case)."""

import pytest
from _launch import Case, assert_ok, shared_run

DENSE_EQUAL = [0, 1]
FEEDBACK = [(0, 0), (1, 1)]


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
  cases = [
    Case(
      f"dense_equal_2d{two_d}",
      "_worker_topk.py",
      {"mode": "dense_equal", "two_d": two_d},
      tests="test_topk_with_ratio_one_equals_dense",
    )
    for two_d in DENSE_EQUAL
  ] + [
    Case(
      f"feedback_2d{two_d}_fp16{fp16}",
      "_worker_topk.py",
      {"mode": "feedback", "two_d": two_d, "fp16": fp16},
      tests="test_error_feedback_sent_sum_approaches_gradient_sum",
    )
    for two_d, fp16 in FEEDBACK
  ]
  return shared_run(request, tmp_path_factory, cases)


@pytest.mark.parametrize("two_d", DENSE_EQUAL)
def test_topk_with_ratio_one_equals_dense(ranks, two_d):
  assert_ok(ranks.result(f"dense_equal_2d{two_d}"))


@pytest.mark.parametrize("two_d,fp16", FEEDBACK)
def test_error_feedback_sent_sum_approaches_gradient_sum(ranks, two_d, fp16):
  assert_ok(ranks.result(f"feedback_2d{two_d}_fp16{fp16}"))

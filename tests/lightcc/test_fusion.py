"""Adaptive gradient fusion with real ranks (one horovodrun for every multi-rank case)."""

import pytest
from _launch import Case, assert_ok, init_in_subprocess, shared_run

ADAPTIVE = [(0, 0), (1, 0), (1, 1)]
T_ADAPTIVE = "test_adaptive_fusion_reduces_like_horovod_and_ranks_switch_together"
T_FROZEN = "test_a_frozen_choice_retraced_holds_one_bucketing_and_reduces_alike"
T_RETRACED = "test_retraced_probe_graphs_hold_one_bucketing_each_and_reduce_alike"
T_STALE = "test_a_step_not_traced_again_under_retrace_stops_with_an_error_that_says_so"


@pytest.fixture(scope="module")
def ranks(request, tmp_path_factory):
  worker = "_worker_fusion.py"
  cases = [
    Case(f"adaptive_2d{two_d}_topk{topk}", worker, {"two_d": two_d, "topk": topk}, tests=T_ADAPTIVE)
    for two_d, topk in ADAPTIVE
  ] + [
    Case("frozen", worker, {"two_d": 1, "topk": 1, "freeze": 1}, tests=T_FROZEN),
    Case("retraced", worker, {"two_d": 1, "topk": 1, "freeze": 1, "retrace": 1}, tests=T_RETRACED),
    Case("stale", worker, {"retrace": 1, "stale": 1, "freeze": 1}, tests=T_STALE),
  ]
  return shared_run(request, tmp_path_factory, cases)


@pytest.mark.parametrize("two_d,topk", ADAPTIVE)
def test_adaptive_fusion_reduces_like_horovod_and_ranks_switch_together(ranks, two_d, topk):
  assert_ok(ranks.result(f"adaptive_2d{two_d}_topk{topk}"))


def test_a_frozen_choice_retraced_holds_one_bucketing_and_reduces_alike(ranks):
  assert_ok(ranks.result("frozen"))


def test_retraced_probe_graphs_hold_one_bucketing_each_and_reduce_alike(ranks):
  assert_ok(ranks.result("retraced"))


def test_a_step_not_traced_again_under_retrace_stops_with_an_error_that_says_so(ranks):
  assert_ok(ranks.result("stale"))


def test_retrace_is_refused_in_a_tf1_graph_with_a_clear_error():
  proc = init_in_subprocess(
    {},
    "import tensorflow as tf\n"
    "hvd.init(light_fusion=1, light_fusion_retrace=1)\n"
    "with tf.Graph().as_default():\n"
    "  v = tf.Variable(tf.zeros([4]))\n"
    "  try:\n"
    "    hvd.reduce_gradients([tf.ones([4])], [v])\n"
    "  except ValueError as error:\n"
    "    print('REFUSED', error)\n",
  )
  assert "REFUSED LIGHT_FUSION_RETRACE=1 needs a step that can be traced again" in proc.stdout, (
    proc.stdout + proc.stderr
  )

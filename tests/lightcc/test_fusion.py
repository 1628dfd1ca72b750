"""Adaptive gradient fusion with real ranks."""

import pytest
from _launch import assert_ok, horovodrun, init_in_subprocess


@pytest.mark.parametrize("two_d,topk", [(0, 0), (1, 0), (1, 1)])
def test_adaptive_fusion_reduces_like_horovod_and_ranks_switch_together(two_d, topk):
  assert_ok(horovodrun("_worker_fusion.py", TWO_D=two_d, TOPK=topk))


def test_a_frozen_choice_retraced_holds_one_bucketing_and_reduces_alike():
  assert_ok(horovodrun("_worker_fusion.py", TWO_D=1, TOPK=1, FREEZE=1))


def test_retraced_probe_graphs_hold_one_bucketing_each_and_reduce_alike():
  assert_ok(horovodrun("_worker_fusion.py", TWO_D=1, TOPK=1, FREEZE=1, RETRACE=1))


def test_a_step_not_traced_again_under_retrace_stops_with_an_error_that_says_so():
  assert_ok(horovodrun("_worker_fusion.py", RETRACE=1, STALE=1, FREEZE=1))


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

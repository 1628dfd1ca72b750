"""LightCC settings, errors and the drop-in API.

The one-process programs (what init_in_subprocess would run, each in a fresh process) share one
process: tests/lightcc/_case_runner.py gives each its own environment and output.
"""

import pytest
from _launch import Case, horovodrun, shared_run

INVALID = [
  ({"LIGHT_TOPK_RATIO": "0"}, "LIGHT_TOPK_RATIO"),
  ({"LIGHT_TOPK_RATIO": "1.5"}, "LIGHT_TOPK_RATIO"),
  ({"LIGHT_TOPK_RATIO": "abc"}, "LIGHT_TOPK_RATIO"),
  ({"LIGHT_INTRA_SIZE": "x"}, "LIGHT_INTRA_SIZE"),
  ({"LIGHT_INTRA_SIZE": "0"}, "LIGHT_INTRA_SIZE"),
  ({"LIGHT_2D_ALLREDUCE": "maybe"}, "LIGHT_2D_ALLREDUCE"),
  ({"LIGHT_HIERARCHICAL_THRESHOLD": "-1"}, "LIGHT_HIERARCHICAL_THRESHOLD"),
  ({"LIGHT_TOPK_THRESHOLD": "1e3x"}, "LIGHT_TOPK_THRESHOLD"),
  ({"LIGHT_TOPK_FP16": "2"}, "LIGHT_TOPK_FP16"),
  ({"LIGHT_FUSION_BUCKETS_MB": "4,1"}, "LIGHT_FUSION_BUCKETS_MB"),
  ({"LIGHT_FUSION_PROBE_STEPS": "1"}, "LIGHT_FUSION_PROBE_STEPS"),
]


DROP_IN = """
import horovod.tensorflow as h, horovod.tensorflow.keras as hk, tensorflow as tf
import tf_ext.lightcc.keras as lk
import types
public = lambda m: {n for n, v in vars(m).items()
                    if not n.startswith('_') and not isinstance(v, types.ModuleType)}
assert not public(h) - set(dir(hvd)), public(h) - set(dir(hvd))
assert not public(hk) - set(dir(lk)), public(hk) - set(dir(lk))
for name in ('elastic', 'callbacks'):
  assert hasattr(hvd if name == 'elastic' else lk, name)
hvd.init()
assert not hvd.light_config().enabled
opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
assert type(opt).__module__.startswith('horovod.'), type(opt)
tape = hvd.DistributedGradientTape(tf.GradientTape())
assert type(tape).__module__.startswith('horovod.'), type(tape)
assert float(hvd.allreduce(tf.constant(3.0))) == 3.0
print('OK')
"""

HARP = """
import os, tf_ext.harp
hvd.init()
assert hvd.light_config().harp
assert os.environ["NCCL_NET_PLUGIN"] == tf_ext.harp.plugin_path(), os.environ["NCCL_NET_PLUGIN"]
assert os.path.exists(os.environ["NCCL_NET_PLUGIN"]) and os.environ["NCCL_NET"] == "HARP"
print('OK')
"""

T_INVALID = "test_invalid_settings_fail_at_init_naming_the_variable"
T_KEYWORDS = "test_keyword_settings_are_checked_too"
T_HARP = "test_light_harp_points_nccl_at_the_plugin_before_init"
T_HARP_REFUSES = "test_light_harp_refuses_to_override_another_plugin"
CASES = [
  Case(f"invalid{i}", code="hvd.init()", env=env, tests=T_INVALID, timeout=120)
  for i, (env, _) in enumerate(INVALID)
] + [
  Case("keyword_value", code="hvd.init(light_topk_ratio=-1)", tests=T_KEYWORDS, timeout=120),
  Case("keyword_name", code="hvd.init(light_topk_ratoi=0.5)", tests=T_KEYWORDS, timeout=120),
  Case(
    "drop_in",
    code=DROP_IN,
    tests="test_drop_in_api_and_horovod_behaviour_with_settings_off",
    timeout=120,
  ),
  Case("harp", code=HARP, env={"LIGHT_HARP": "1"}, tests=T_HARP, timeout=120),
  Case(
    "harp_off",
    code="import os; hvd.init(); print(os.environ.get('NCCL_NET'))",
    tests=T_HARP,
    timeout=120,
  ),
  Case(
    "harp_other_plugin",
    code="hvd.init()",
    tests=T_HARP_REFUSES,
    timeout=120,
    env={"LIGHT_HARP": "1", "NCCL_NET_PLUGIN": "/opt/other/libnccl-net.so"},
  ),
  Case(
    "harp_invalid",
    code="hvd.init()",
    env={"LIGHT_HARP": "maybe"},
    tests=T_HARP_REFUSES,
    timeout=120,
  ),
]


@pytest.fixture(scope="module")
def one_process(request, tmp_path_factory):
  return shared_run(request, tmp_path_factory, CASES, ranks=None)


@pytest.mark.parametrize("env,variable", INVALID)
def test_invalid_settings_fail_at_init_naming_the_variable(one_process, env, variable):
  proc = one_process.result(f"invalid{INVALID.index((env, variable))}")
  assert proc.returncode != 0 and "ValueError" in proc.stderr and variable in proc.stderr, (
    proc.stderr[-2000:]
  )


def test_keyword_settings_are_checked_too(one_process):
  proc = one_process.result("keyword_value")
  assert proc.returncode != 0 and "LIGHT_TOPK_RATIO" in proc.stderr
  proc = one_process.result("keyword_name")
  assert proc.returncode != 0 and "light_topk_ratoi" in proc.stderr


def test_world_size_not_a_multiple_of_intra_size_fails_at_init():
  proc = horovodrun("_worker_2d.py", INTRA=3)
  assert proc.returncode != 0
  assert "LIGHT_INTRA_SIZE=3 does not divide the world size 4" in proc.stdout + proc.stderr


def test_drop_in_api_and_horovod_behaviour_with_settings_off(one_process):
  proc = one_process.result("drop_in")
  assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_light_harp_points_nccl_at_the_plugin_before_init(one_process):
  proc = one_process.result("harp")
  assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-2000:]
  # This project's Horovod has no NCCL (CPU collectives): the user is told HARP carries nothing.
  assert "built without NCCL" in proc.stderr
  # Off by default: NCCL's environment is left alone.
  off = one_process.result("harp_off")
  assert off.returncode == 0 and off.stdout.strip() == "None", off.stderr[-2000:]


def test_light_harp_refuses_to_override_another_plugin(one_process):
  proc = one_process.result("harp_other_plugin")
  assert proc.returncode != 0 and "already has NCCL_NET_PLUGIN=/opt/other" in proc.stderr, (
    proc.stderr[-2000:]
  )
  proc = one_process.result("harp_invalid")
  assert proc.returncode != 0 and "LIGHT_HARP" in proc.stderr

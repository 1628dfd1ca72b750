"""LightCC with real ranks: horovodrun --gloo -np 4 -H localhost:4 on this machine."""
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def horovodrun(worker, ranks=4, timeout=600, **env):
  launcher = shutil.which("horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
  assert launcher, "horovodrun not found next to the test's python (make setup installs Horovod)"
  run_env = dict(os.environ, TF_EXT_ROOT=ROOT, TF_CPP_MIN_LOG_LEVEL="3",
                 PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
                 **{k: str(v) for k, v in env.items()})
  return subprocess.run([launcher, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}",
                         sys.executable, os.path.join(HERE, worker)],
                        env=run_env, capture_output=True, text=True, timeout=timeout)


def _assert_ok(proc):
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("intra", [2, 4, 1])
def test_2d_allreduce_equals_flat_for_dtypes_lengths_and_ops(intra):
  _assert_ok(horovodrun("_worker_2d.py", INTRA=intra))


@pytest.mark.parametrize("two_d", [0, 1])
def test_topk_with_ratio_one_equals_dense(two_d):
  _assert_ok(horovodrun("_worker_topk.py", MODE="dense_equal", TWO_D=two_d))


@pytest.mark.parametrize("two_d,fp16", [(0, 0), (1, 1)])
def test_error_feedback_sent_sum_approaches_gradient_sum(two_d, fp16):
  _assert_ok(horovodrun("_worker_topk.py", MODE="feedback", TWO_D=two_d, FP16=fp16))


def _keras_run(**env):
  proc = horovodrun("_worker_keras.py", **env)
  _assert_ok(proc)
  results = re.findall(r"RESULT rank=(\d) accuracy=([\d.]+) identical=(\w+) table_size=(\d+)", proc.stdout)
  assert len(results) == 4 and all(r[2] == "True" for r in results), proc.stdout
  return float(results[0][1]), int(results[0][3])


def test_keras_digits_topk_1_percent_fp16_within_half_a_percent_of_dense():
  (dense, _), (compressed, _) = _keras_run(TOPK=0), _keras_run(TOPK=1)
  print(f"digits accuracy: dense {dense:.4f}, TOPK 1% + fp16 {compressed:.4f}")
  assert dense > 0.9
  assert compressed >= dense - 0.005


def test_replicas_with_a_dynamic_embedding_table_stay_identical():
  # The worker exits non-zero unless every rank holds the same weights and table rows.
  _, table_size = _keras_run(TOPK=1, TABLE=1, EPOCHS=5)
  assert table_size > 5


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
]


def _init_in_subprocess(env, code="hvd.init()"):
  run_env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", **env)
  return subprocess.run([sys.executable, "-c", f"import tf_ext.lightcc as hvd\n{code}"],
                        env=run_env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("env,variable", INVALID)
def test_invalid_settings_fail_at_init_naming_the_variable(env, variable):
  proc = _init_in_subprocess(env)
  assert proc.returncode != 0 and "ValueError" in proc.stderr and variable in proc.stderr, proc.stderr[-2000:]


def test_keyword_settings_are_checked_too():
  proc = _init_in_subprocess({}, "hvd.init(light_topk_ratio=-1)")
  assert proc.returncode != 0 and "LIGHT_TOPK_RATIO" in proc.stderr
  proc = _init_in_subprocess({}, "hvd.init(light_topk_ratoi=0.5)")
  assert proc.returncode != 0 and "light_topk_ratoi" in proc.stderr


def test_world_size_not_a_multiple_of_intra_size_fails_at_init():
  proc = horovodrun("_worker_2d.py", INTRA=3)
  assert proc.returncode != 0
  assert "LIGHT_INTRA_SIZE=3 does not divide the world size 4" in proc.stdout + proc.stderr


def test_drop_in_api_and_horovod_behaviour_with_settings_off():
  code = """
import horovod.tensorflow as h, horovod.tensorflow.keras as hk, tensorflow as tf
import tf_ext.lightcc.keras as lk
import types
public = lambda m: {n for n, v in vars(m).items() if not n.startswith('_') and not isinstance(v, types.ModuleType)}
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
  proc = _init_in_subprocess({}, code)
  assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]

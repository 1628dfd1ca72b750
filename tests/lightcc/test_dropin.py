"""The drop-in modules resolve every attribute of the Horovod modules they stand in for."""

import types

import horovod.tensorflow as horovod_tf
import horovod.tensorflow.keras as horovod_keras
import horovod.tensorflow.keras.callbacks as horovod_callbacks
import horovod.tensorflow.keras.elastic as horovod_keras_elastic
import pytest

import tf_ext.lightcc as lightcc
import tf_ext.lightcc.keras as lightcc_keras
import tf_ext.lightcc.keras.callbacks as lightcc_callbacks
import tf_ext.lightcc.keras.elastic as lightcc_keras_elastic

PAIRS = [
  (lightcc, horovod_tf),
  (lightcc_keras, horovod_keras),
  (lightcc_callbacks, horovod_callbacks),
  (lightcc.elastic, horovod_tf.elastic),
  (lightcc_keras_elastic, horovod_keras_elastic),
]
# What LightCC implements itself (the rest must be Horovod's own objects).
OURS = {
  lightcc: {
    "init",
    "allreduce",
    "grouped_allreduce",
    "DistributedOptimizer",
    "DistributedGradientTape",
    "elastic",
    "keras",
  },
  lightcc_keras: {"init", "DistributedOptimizer", "callbacks", "elastic", "load_model"},
  lightcc_callbacks: set(),
  lightcc.elastic: {"run", "TensorFlowKerasState", "TensorFlowState"},
  lightcc_keras_elastic: {"run", "KerasState", "TensorFlowKerasState"},
}


@pytest.mark.parametrize("ours,theirs", PAIRS, ids=lambda m: m.__name__)
def test_every_horovod_attribute_resolves_private_helpers_included(ours, theirs):
  names = set(dir(theirs))
  assert names <= set(dir(ours)), names - set(dir(ours))
  for name in names:
    value = getattr(ours, name)
    if name not in OURS[ours] and not name.startswith("__"):
      assert value is getattr(theirs, name), name


def test_horovod_private_helpers_work_through_the_drop_in():
  assert lightcc._executing_eagerly() is True
  assert callable(lightcc._make_allreduce_grads_fn)
  with pytest.raises(AttributeError, match="tf_ext.lightcc.*no_such_name"):
    lightcc.no_such_name  # noqa: B018


def test_lightcc_names_are_ours_and_keras_is_our_submodule():
  assert lightcc.keras is lightcc_keras
  assert lightcc_keras.callbacks is lightcc_callbacks
  assert lightcc_keras.elastic is lightcc_keras_elastic
  for module, names in OURS.items():
    for name in names:
      value = getattr(module, name)
      origin = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
      assert origin.startswith("tf_ext."), (module, name)
  assert lightcc_keras.callbacks.LightCCTrafficCallback.__module__.startswith("tf_ext.")

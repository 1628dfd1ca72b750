"""Elastic training with LightCC: `hvd.elastic.run` and state objects that carry LightCC's state.

Every name of `horovod.tensorflow.elastic` resolves here; LightCC has its own versions of three:

  - run(func): Horovod's loop (sync, call, and on a failed collective: restore, reset, sync, call
    again), but the reset re-runs LightCC's init with the arguments of the first, and every failed
    Horovod collective in a step (HorovodAlltoall and HorovodAllgather, which 2D and TOPK use,
    included) becomes a HorovodInternalError. Horovod's own wrapper recognises allreduce, allgather
    and broadcast only, and returns None from the step for any other error.
  - TensorFlowKerasState, TensorFlowState: Horovod's, whose commit() also saves LightCC's state,
    restore() brings it back and sync() makes it consistent on a new set of ranks:
      * the TOPK error-feedback residuals: committed and restored per rank; never broadcast, since
        each holds what that rank has not sent yet (rank 0's copy on every rank would send rank 0's
        unsent mass N times). A rank that joins starts from zeros, as at the first step;
      * the adaptive fusion policies (probed medians, a probe in progress, current bucket size):
        committed, restored, and broadcast from rank 0 by sync(), since every rank must pick the
        same bucket size. The step clock restarts: the first step after a reset is not timed.

A reset changes the number of ranks, which LightCC bakes into a traced step (the 1/size of an
average): build the step's tf.function inside the function that run() wraps, so that each call
after a reset traces it again; residuals and policies are found again by their variables and
shapes. Eager (TF2) programs only; LIGHT_2D_ALLREDUCE is refused: its process sets are fixed at
init, before an elastic job knows its size.
"""

import copy
import functools

import horovod.tensorflow as _hvd
import horovod.tensorflow.elastic as _horovod_elastic
import numpy as np
import tensorflow as tf

# Horovod's elastic API that LightCC does not change.
from horovod.common.elastic import ObjectState, State, run_fn  # noqa: F401
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401

from tf_ext.lightcc import _reexport
from tf_ext.lightcc import reduction as _reduction
from tf_ext.lightcc import state as _state

# LightCC's own; every other name of horovod.tensorflow.elastic resolves to Horovod's object.
__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]


def _is_collective_failure(error):
  """A TensorFlow error from a Horovod collective (or from Horovod having shut down)."""
  return "Horovod" in str(error) or "Gloo" in str(error) or "gloo" in str(error)


def _lightcc_reset():
  _hvd.shutdown()
  args, kwargs = _state.process.init_call
  _state.init(*args, **kwargs)


def run(func):
  """Horovod's elastic.run for LightCC (see the module's docstring)."""

  def wrapper(state, *args, **kwargs):
    if _state.process.config.two_d:
      raise NotImplementedError(
        "LIGHT_2D_ALLREDUCE under elastic training: 2D's process sets are fixed at init, before an "
        "elastic job knows its size; use TOPK and fusion without 2D, or a fixed-size job"
      )
    try:
      return func(state, *args, **kwargs)
    except tf.errors.OpError as error:
      if _is_collective_failure(error):
        raise HorovodInternalError(error) from error
      raise

  return functools.wraps(func)(run_fn(wrapper, _lightcc_reset))


class _LightCCState:
  """commit / restore / sync of LightCC's own state (eager), mixed into Horovod's state classes:
  each runs Horovod's, then LightCC's part."""

  def save(self):
    super().save()
    self._lightcc_save()

  def restore(self):
    super().restore()
    self._lightcc_load()

  def sync(self):
    super().sync()
    self._lightcc_sync()

  def _lightcc_save(self):
    graph_state = _state.graph_state()
    # Copies in host memory (commit() is documented as a copy to host memory).
    self._lightcc_residuals = {
      key: np.array(variable.numpy(), copy=True) for key, variable in graph_state.residuals.items()
    }
    self._lightcc_policies = {
      key: copy.deepcopy(vars(fusion.policy)) for key, fusion in graph_state.fusions.items()
    }

  def _lightcc_load(self):
    graph_state = _state.graph_state()
    saved = getattr(self, "_lightcc_residuals", {})
    for key, variable in graph_state.residuals.items():
      # A residual made after the commit held zeros at the commit.
      variable.assign(saved[key] if key in saved else tf.zeros_like(variable))
    for key, policy_state in getattr(self, "_lightcc_policies", {}).items():
      fusion = graph_state.fusions.get(key)
      if fusion is not None:
        _set_policy(fusion, policy_state)

  def _lightcc_sync(self):
    """Rank 0's fusion policies on every rank; each rank keeps its own residuals."""
    graph_state = _state.graph_state()
    policies = {key: vars(fusion.policy) for key, fusion in graph_state.fusions.items()}
    policies = _hvd.broadcast_object(policies, root_rank=0, name="lightcc_elastic_policies")
    for key, policy_state in policies.items():
      # (A rank that joined has no fusion yet before its first step: it is made here.)
      _set_policy(_reduction.fusion_for_key(key), policy_state)
    self._lightcc_save()

  def lightcc_committed(self):
    """What the last commit (or sync) saved of LightCC's state: ({residual name: numpy value},
    [policy state dicts]), for inspection and tests."""
    residuals = getattr(self, "_lightcc_residuals", {})
    names = {key: variable.name for key, variable in _state.graph_state().residuals.items()}
    return (
      {names.get(key, str(key)): value.copy() for key, value in residuals.items()},
      [copy.deepcopy(p) for p in getattr(self, "_lightcc_policies", {}).values()],
    )


def _set_policy(fusion, policy_state):
  policy_state = copy.deepcopy(policy_state)  # (broadcast_object gives rank 0 its own object)
  vars(fusion.policy).clear()
  vars(fusion.policy).update(policy_state)
  fusion.choice.assign(fusion.policy.current)
  fusion.forget_last_step()  # the time across a reset is no step time


class TensorFlowKerasState(_LightCCState, _horovod_elastic.TensorFlowKerasState):
  """horovod.tensorflow.elastic.TensorFlowKerasState, plus LightCC's TOPK residuals and fusion
  policies (see the module's docstring)."""

  def __init__(self, model, optimizer=None, backend=None, **kwargs):
    _require_eager()
    super().__init__(model, optimizer=optimizer, backend=backend, **kwargs)
    self._lightcc_save()


class TensorFlowState(_LightCCState, _horovod_elastic.TensorFlowState):
  """horovod.tensorflow.elastic.TensorFlowState, plus LightCC's TOPK residuals and fusion
  policies (see the module's docstring)."""

  def __init__(self, variables=None, session=None, **kwargs):
    _require_eager()
    super().__init__(variables=variables, session=session, **kwargs)
    self._lightcc_save()

  def sync(self):
    # Horovod's broadcasts the variables once, when the state is made (eager); a rank that joins
    # later needs them too.
    _hvd.broadcast_variables(self.variables, root_rank=0)
    super().sync()


def _require_eager():
  if not tf.executing_eagerly():
    raise NotImplementedError(
      "tf_ext.lightcc.elastic states need eager execution (TF2, steps in tf.function); "
      "horovod.tensorflow.elastic.TensorFlowState serves TF1 Sessions without LightCC's state"
    )


__getattr__, __dir__ = _reexport.fallback(__name__, globals(), _horovod_elastic)

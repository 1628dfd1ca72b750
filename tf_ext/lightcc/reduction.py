"""Reduction of one step's gradients over all ranks the LightCC way: sparse ones allgathered as
Horovod does, large dense ones TOPK-compressed with error feedback, the others 2D; with
LIGHT_FUSION in adaptive buckets (fusion.py)."""

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.tensorflow import Average, Compression

from tf_ext.lightcc import collectives, state
from tf_ext.lightcc import fusion as _fusion


def reduce_gradients(
  gradients, variables, op=Average, compression=Compression.none, sparse_as_dense=False
):
  """Reduces one step's gradients over all ranks the LightCC way.

  Sparse gradients are allgathered as Horovod does. Dense ones of at least LIGHT_TOPK_THRESHOLD
  bytes go TOPK, the others 2D when it is on (else Horovod's allreduce). Both kinds go out in
  buckets, in backprop order, each exchanged as soon as its gradients exist and released as soon
  as it is reduced: with LIGHT_FUSION of an adaptive size, else of LIGHT_BUCKET_MB (0: all TOPK
  gradients in one exchange and all 2D ones in another).
  """
  config, reduced = state.process.config, list(gradients)
  compressible, dense = [], []  # indices into gradients
  for index, gradient in enumerate(gradients):
    if gradient is None:
      continue
    if isinstance(gradient, tf.IndexedSlices) and sparse_as_dense:
      gradient = reduced[index] = tf.convert_to_tensor(gradient)
    if isinstance(gradient, tf.IndexedSlices):  # sparse (e.g. tf_ext tables): allgather, as Horovod
      reduced[index] = _hvd.allreduce(gradient, op=op, name=f"lightcc_grad_{index}")
    elif collectives.is_compressible(gradient, config):
      compressible.append(index)
    elif (config.fusion and gradient.shape.is_fully_defined()) or collectives.uses_2d(
      gradient, config, state.process.topology
    ):
      dense.append(index)
    else:
      reduced[index] = collectives.allreduce(
        gradient, op=op, compression=compression, name=f"lightcc_grad_{index}"
      )
  topk = _TopKGroup(compressible, list(reduced), variables, op) if compressible else None

  def reduce_bucket(indices):
    """Reduced gradients of these indices, in their order (TOPK ones together, dense together)."""
    out = {}
    comp = sorted(i for i in indices if topk is not None and i in topk.position)
    if comp:
      out.update(zip(comp, topk.reduce(comp)))
    rest = [i for i in indices if i not in out]
    if rest:
      out.update(
        zip(
          rest,
          collectives.grouped_allreduce([reduced[i] for i in rest], op=op, compression=compression),
        )
      )
    return [out[i] for i in indices]

  bucketed = sorted(compressible + dense)
  if bucketed:
    tensors = [reduced[i] for i in bucketed]

    def reduce_positions(bucket):
      return reduce_bucket([bucketed[b] for b in bucket])

    if config.fusion:
      results = _fusion_for(tensors).reduce(tensors, reduce_positions)
    elif config.bucket_mb > 0:
      results = _fusion.reduce_in_buckets(
        tensors, max(1, _fusion.bytes_of_mib(config.bucket_mb)), reduce_positions
      )
    else:
      results = (reduce_bucket(compressible) if compressible else []) + (
        reduce_bucket(dense) if dense else []
      )
      bucketed = compressible + dense
    for i, r in zip(bucketed, results):
      reduced[i] = r
  return reduced


class _TopKGroup:
  """One step's TOPK gradients and their residual variable (this rank's pieces, in index order)."""

  def __init__(self, indices, gradients, variables, op):
    config = state.process.config
    self.topology = state.process.topology if config.two_d else None
    self.gradients, self.op = gradients, op
    lengths = collectives.topk_piece_lengths(
      [gradients[i].shape.num_elements() for i in indices], self.topology
    )
    self.position = {i: p for p, i in enumerate(indices)}
    self.offsets = [sum(lengths[:p]) for p in range(len(indices))]
    key = (tuple(_variable_key(variables[i]) for i in indices), sum(lengths))
    self.residual = state.graph_state().residuals.get(key, sum(lengths))

  def reduce(self, indices):
    """TOPK exchange of consecutive TOPK gradients (ascending indices)."""
    return collectives.topk_grouped_allreduce(
      [self.gradients[i] for i in indices],
      self.op,
      state.process.config,
      self.topology,
      self.residual,
      self.offsets[self.position[indices[0]]],
      state.traffic_counter(),
    )


def _variable_key(variable):
  return variable.ref() if hasattr(variable, "ref") else id(variable)


def _fusion_for(tensors):
  """The AdaptiveFusion of this set of gradients (one per model), created on first use."""
  return fusion_for_key(tuple((tuple(t.shape.as_list()), t.dtype.name) for t in tensors))


def fusion_for_key(key):
  """The AdaptiveFusion of the gradients whose (shape, dtype) list is `key`, created on first use
  with the configured candidates (also by elastic.py, for a rank that joins before its first
  step)."""
  fusions = state.graph_state().fusions
  fusion = fusions.get(key)
  if fusion is None:
    config = state.process.config
    fusion = fusions[key] = _fusion.AdaptiveFusion(
      [_fusion.bytes_of_mib(mb) for mb in config.fusion_buckets_mb],
      config.fusion_probe_steps,
      config.fusion_reprobe_steps,
      retrace=config.fusion_retrace,
    )
  return fusion


def fusion_policies():
  """The adaptive fusion policies in use (their probed medians and history), for inspection."""
  return [f.policy for f in state.graph_state().fusions.values()]


def fusion_graph_key():
  """What the graph of a step must hold for the adaptive fusions in use: a step function traced
  under one key is right as long as the key stays the same. It changes when a choice freezes
  (freeze_settled_fusion) and, with LIGHT_FUSION_RETRACE=1, whenever the bucket size in force
  changes; every rank's key changes after the same step, as the policies agree. () before the
  first traced step, which makes the fusions. FusionStepFunction keeps one step function per key.
  """
  return tuple(f.graph_key() for f in state.graph_state().fusions.values())


class FusionStepFunction:
  """A step function that is traced again whenever adaptive fusion needs another graph.

  `make_step()` returns a new step function (a tf.function, traced at its first call); one is
  made and kept for each fusion_graph_key() met, so with LIGHT_FUSION_RETRACE=1 each candidate
  bucket size is traced once, and every step runs the graph of the size in force. With
  freeze_when_settled, the choice is frozen (freeze_settled_fusion) after the step that settles
  it, and the steps after it run a graph that holds the chosen bucketing alone. Every rank must
  call it for the same steps, as any collective:

      step = hvd.FusionStepFunction(make_step)
      for batch in data:
        loss = step(batch)
  """

  def __init__(self, make_step, freeze_when_settled=True):
    self._make_step = make_step
    self._freeze = freeze_when_settled
    self._functions = {}
    self._made = 0
    self.steps = 0
    self.frozen_after_steps = None  # steps run when the choice froze

  @property
  def traced(self):
    """Step functions made so far (one per graph key met), the first one included."""
    return self._made

  def current(self):
    """The step function of the graph adaptive fusion needs now, made if it is new."""
    key = fusion_graph_key()
    function = self._functions.get(key)
    if function is None:
      function = self._functions[key] = self._make_step()
      self._made += 1
    if key and all(frozen for frozen, _ in key):
      # Frozen choices are final: the probe's graphs will not run again, and each holds memory.
      self._functions = {key: function}
    return function

  def first_step_ran(self, function):
    """`function` ran the first step, before any fusion existed: its trace made the fusions
    with the sizes then current, and the first step is never timed, so it is the graph of the
    key of now."""
    self._functions[fusion_graph_key()] = function
    self._made = max(self._made, 1)

  def __call__(self, *args, **kwargs):
    first = not fusion_graph_key()
    function = self.current()
    result = function(*args, **kwargs)
    self.steps += 1
    if first:
      self.first_step_ran(function)
    if self._freeze and self.frozen_after_steps is None and freeze_settled_fusion():
      self.frozen_after_steps = self.steps
    return result


def freeze_settled_fusion():
  """Freezes the choice of every adaptive fusion in use once all have made their final one
  (probe over, LIGHT_FUSION_REPROBE_STEPS=0), and says whether it did. A step function traced
  after a freeze holds only the chosen bucketing, so it runs lighter than the switch over every
  candidate; retrace it after this returns True (Keras: callbacks.FusionSettledCallback).

  Call it on every rank after the same step, as any collective: the policies then agree on every
  rank, and all ranks must hold the same graph. False before the first traced step."""
  fusions = list(state.graph_state().fusions.values())
  if not fusions or not all(f.policy.settled for f in fusions):
    return False
  for fusion in fusions:
    fusion.policy.frozen = True
  return True

"""Adaptive gradient fusion: gradients go out in buckets, in the order backprop produces them, and
the bucket size follows the measured step time.

Why buckets: a bucket's collective can start as soon as its gradients exist (TensorFlow runs
it when its inputs are ready), so communication overlaps the rest of backprop; one bucket per
tensor pays the per-collective latency many times, one bucket for everything overlaps nothing.
Which size is best depends on the model, the link and the machine, so it is measured:

Policy (settings in tf_ext/settings.py, LIGHT_FUSION_*):
  1. explore: the candidate sizes of LIGHT_FUSION_BUCKETS_MB take turns, one step each, for
     LIGHT_FUSION_PROBE_STEPS rounds (the first round is not counted: a bucketing's first step
     pays for its first negotiation); each one's median step time is kept;
  2. refine: the sizes whose median is within CLOSE of the fastest's take turns for as many
     rounds again, every one counted, and their medians are taken over both probes (telling
     close sizes apart needs more steps; their steps cost little, as they are all fast);
  3. exploit the fastest; every LIGHT_FUSION_REPROBE_STEPS steps its neighbours in the candidate
     list are probed again (refined alike) and the fastest of the three is kept (the network
     and the load change).
All bucketings exist in the graph behind one tf.switch_case, so switching needs no retracing and
works in TF1 sessions too. With re-probes off, once the probe is over, every rank may freeze the
choice after the same step and retrace: the new graph holds the chosen bucketing alone
(reduction.freeze_settled_fusion; for Keras, callbacks.FusionSettledCallback). With
LIGHT_FUSION_RETRACE=1 there is no switch: a graph holds the size in force alone, so the probe
times the graph that will run, and the caller traces the step again whenever the size changes
(reduction.FusionStepFunction); each decision then runs one step late.
Every rank must pick the same branch: the step time the policy sees is the average over ranks
(one scalar allreduce per step), so all ranks make identical decisions.

Nothing waits for the last bucket: each output of the switch_case (lowered to Switch/Merge) is
released when its own bucket is reduced. The step clock runs at the start of a step, off the
critical path: the time from the previous step's start to this one's is averaged over ranks and
given to the policy, whose answer is this step's branch index; it has no input but the clock, so
it runs while the forward and backward passes compute, before the first bucket is ready.
"""

import itertools
import statistics
import threading
import time

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from tf_ext.settings import FUSION_MIN_PROBE_ROUNDS


class FusionPolicy:
  """Chooses a candidate index from a stream of (rank-averaged) step times. Pure Python.

  Candidates are probed in interleaved rounds (A B C, A B C, ...) rather than one after the
  other, so that a load or a network that drifts while probing weighs on every candidate alike;
  the first round is not counted (a bucketing's first step pays for Horovod's first negotiation
  of its tensors). Candidates that end close to the fastest are then refined (module docstring).
  """

  # Medians within 3 % of the fastest's are refined. Four steps' medians told ResNet50's 0.38 and
  # 1.52 MiB buckets apart by 0.7-3.5 %, the wrong way round in three runs of three, where they
  # were 1.6 % apart; refined, the choice was the best fixed size in three runs of three
  # (docs/benchmarks.md, 2026-11-28). Sizes further apart rarely swap places.
  CLOSE = 0.03

  def __init__(self, num_candidates, probe_steps, reprobe_steps):
    self.num_candidates = num_candidates
    self.probe_steps = max(FUSION_MIN_PROBE_ROUNDS, probe_steps)
    self.reprobe_steps = reprobe_steps
    self.medians = {}
    self._start_probing(list(range(num_candidates)))
    self._since_decision = 0
    self.history = []  # (step_seconds, index that produced it)
    # Set by reduction.freeze_settled_fusion() on every rank after the same step: graphs traced
    # from then on hold only the choice. Not on settling alone, since a rank may retrace alone
    # (a batch of its own shape), and its graph must keep the collectives of the others'. Here,
    # so that elastic commits, restores and syncs it with the rest of the policy.
    self.frozen = False

  @staticmethod
  def longest_probe(num_candidates, probe_steps):
    """Steps until the first probe's choice runs, at most: every candidate close enough to be
    refined; retraced, each decision runs one step late (in each of the two phases), and each
    candidate's graph costs the step before its first one (whose time holds its tracing)."""
    return 2 * num_candidates * max(FUSION_MIN_PROBE_ROUNDS, probe_steps) + 2 + num_candidates

  @property
  def current(self):
    return self._current

  @property
  def settled(self):
    """The choice is final: the probe is over and re-probes are off."""
    return not self._probing and not self.reprobe_steps

  def _start_probing(self, candidates, refining=False):
    self._probing = candidates
    self._refining = refining
    self._probe_step = 0  # steps run in this probe: the turn of candidates[step % len]
    if not refining:  # a refinement adds to the samples of the probe before it
      self._samples = {i: [] for i in candidates}
      self._timed_once = set()  # a candidate's first step in a probe is not counted
    # Counted steps each candidate needs before the probe ends.
    self._needed = {
      i: len(self._samples[i]) + self.probe_steps if refining else self.probe_steps - 1
      for i in candidates
    }
    self._current = candidates[0]

  def observe(self, step_seconds, ran=None, untimed=False):
    """Records the time of a step that ran candidate `ran` (default `current`: the switch runs
    the index returned for its step; a retraced graph runs the index that was current when it
    was chosen, one step behind); returns the index for the next step. An `untimed` step (its
    time holds a tracing) takes its turn but is not counted."""
    ran = self._current if ran is None else ran
    self.history.append((step_seconds, ran))
    if self._probing:
      # A candidate's first step in a probe pays for its first negotiation (and, retraced, its
      # tracing): not counted. Every step of a refinement counts. A step of a candidate that is
      # no longer probed (retraced graphs lag one step) adds to its samples, which no one reads.
      if ran in self._samples and (self._refining or ran in self._timed_once) and not untimed:
        self._samples[ran].append(step_seconds)
      self._timed_once.add(ran)
      self._probe_step += 1
      if any(len(self._samples[i]) < self._needed[i] for i in self._probing):
        self._current = self._probing[self._probe_step % len(self._probing)]
        return self._current
      for i in self._probing:
        self.medians[i] = statistics.median(self._samples[i])
      fastest = min(self._probing, key=self.medians.get)
      close = [
        i for i in self._probing if self.medians[i] <= self.medians[fastest] * (1 + self.CLOSE)
      ]
      if len(close) > 1 and not self._refining:
        self._start_probing(close, refining=True)
        return self._current
      self._probing = []
      self._current = fastest
      self._since_decision = 0
      return self._current
    self._since_decision += 1
    if self.reprobe_steps and self._since_decision >= self.reprobe_steps:
      best = self._current
      neighbours = [i for i in (best - 1, best + 1) if 0 <= i < self.num_candidates]
      for i in neighbours + [best]:
        self.medians.pop(i, None)
      self._start_probing(neighbours + [best])
    return self._current


# The bucket exchanged last holds bucket_bytes / 2**TAIL_HALVINGS (see buckets_in_backprop_order).
TAIL_HALVINGS = 3


def buckets_in_backprop_order(sizes, bucket_bytes, tail_halvings=TAIL_HALVINGS):
  """Indices of tensors grouped into buckets, last tensor first (backprop computes the gradients of
  the last layers first), each bucket's indices in that order too.

  The buckets exchanged last are smaller: the very last holds bucket_bytes / 2**tail_halvings,
  and sizes double from there towards the output layers up to bucket_bytes. Whatever shares a
  bucket with the first layers waits for their gradients, the last the backward pass computes:
  a full-size last bucket held back gradients that were ready long before the backward pass ended
  (a third of it in VGG16 at 1/16 of its size), and sent them all after it.
  """
  buckets, current, filled = [], [], 0
  capacity = bucket_bytes / 2**tail_halvings
  for index in range(len(sizes)):  # from the first layer, whose bucket goes last
    if current and filled + sizes[index] > capacity:
      buckets.append(current)
      current, filled = [], 0
      capacity = min(bucket_bytes, 2 * capacity)
    current.append(index)
    filled += sizes[index]
  if current:
    buckets.append(current)
  return [bucket[::-1] for bucket in reversed(buckets)]


class AdaptiveFusion:
  """The bucketed reduction of one model's gradients, with its policy and step clock.

  retrace=False: the graph holds every candidate behind one tf.switch_case, whose index the step
  clock picks (no retracing; TF1 Sessions). retrace=True: a graph holds the candidate current
  when it was traced alone, plus the clock, and the caller traces the step again whenever
  graph_key() changes, so that a probe times the graph that will run; every candidate's graph
  is traced once and kept by the caller.
  """

  _instances = itertools.count()
  # Retraced: steps whose graph held another candidate than the one the policy had chosen for
  # them (the one current when the graph was picked). FusionStepFunction never runs one; a few
  # are let through, more mean the step function is not traced again.
  STALE_STEPS_ALLOWED = 2

  def __init__(self, candidates_bytes, probe_steps, reprobe_steps, retrace=False):
    self.candidates = list(candidates_bytes)
    self.retrace = retrace
    self._number = next(self._instances)
    self.policy = FusionPolicy(len(self.candidates), probe_steps, reprobe_steps)
    self._lock = threading.Lock()
    self._ran_last = None  # retraced: the candidate of the previous step's graph
    self._stale_steps = 0
    self._graphs_run = set()  # graphs (traced step functions) that have run a step
    self._last_graph_was_new = False
    with tf.init_scope():
      self.choice = tf.Variable(
        self.policy.current, dtype=tf.int32, trainable=False, name="lightcc_fusion_choice"
      )
      self.last_time = tf.Variable(
        -1.0, dtype=tf.float64, trainable=False, name="lightcc_fusion_last_time"
      )

  def graph_key(self):
    """What a graph of this fusion holds: a step traced under another key is out of date."""
    if self.policy.frozen or self.retrace:
      return (self.policy.frozen, self.policy.current)
    return (False, None)

  def forget_last_step(self):
    """The next step's time is no step time (an elastic reset happened in between)."""
    self.last_time.assign(-1.0)
    self._ran_last = None
    self._stale_steps = 0
    self._last_graph_was_new = False

  def _observe(self, seconds, pinned, graph):
    pinned, graph = int(pinned), int(graph)  # (numpy's int32: the history stays plain Python)
    with self._lock:
      # The switch runs the policy's index; a retraced graph its own (`pinned`), and the time
      # observed now is the previous step's, so it belongs to the previous graph's candidate.
      ran, self._ran_last = self._ran_last, (pinned if pinned >= 0 else None)
      # A new graph's tracing falls in the previous step's time (from its clock to this one's),
      # its first negotiations in its own first step: neither is a step time.
      new = graph >= 0 and graph not in self._graphs_run
      untimed, self._last_graph_was_new = new or self._last_graph_was_new, new
      self._graphs_run.add(graph)
      if seconds <= 0:
        return np.int32(self.policy.current)
      if pinned >= 0 and pinned != self.policy.current:
        self._stale_steps += 1
        if self._stale_steps > self.STALE_STEPS_ALLOWED:
          raise RuntimeError(
            "LIGHT_FUSION_RETRACE=1: the step ran the graph of bucket candidate "
            f"{pinned} where adaptive fusion had chosen {self.policy.current} "
            f"({self._stale_steps} steps so far): trace the step function again whenever "
            "hvd.fusion_graph_key() changes (Keras: khvd.callbacks.FusionSettledCallback), or "
            "set LIGHT_FUSION_RETRACE=0"
          )
      return np.int32(self.policy.observe(float(seconds), ran, untimed=untimed))

  def reduce(self, tensors, reduce_bucket):
    """reduce_bucket(positions in `tensors`) -> their reduced tensors, in that order; returns all
    reduced tensors in input order, each as soon as its bucket is reduced."""

    if self.policy.frozen:
      # Its choice is final: a graph traced now holds that bucketing alone. The others, dead
      # branches of the switch, cost each rank CPU every step and memory (docs/lightcc.md).
      return reduce_in_buckets(tensors, self.candidates[self.policy.current], reduce_bucket)

    if self.retrace:
      graph = tf.compat.v1.get_default_graph()
      if not tf.executing_eagerly() and not graph.building_function:
        raise ValueError(
          "LIGHT_FUSION_RETRACE=1 needs a step that can be traced again (tf.function, Keras, "
          "eager); a TF1 Session keeps one graph: set LIGHT_FUSION_RETRACE=0 there"
        )
      # The clock runs for its side effects (automatic control dependencies keep it).
      pinned = self.policy.current
      self._step_choice(pinned=pinned)
      return reduce_in_buckets(tensors, self.candidates[pinned], reduce_bucket)

    def branch(bucket_bytes):
      return lambda: reduce_in_buckets(tensors, bucket_bytes, reduce_bucket)

    index = self._step_choice()
    # Branches without automatic control dependencies: in a tf.function they would make every
    # output of a branch wait for every stateful op in it (TOPK's compress op of the last bucket
    # included), so no bucket would be released before the last one. Each stateful op of a branch
    # is consumed (data or control) by a bucket's own outputs, and the TOPK ops write disjoint
    # parts of the residual, as in TF1 graphs, where branches never get them.
    graph = tf.compat.v1.get_default_graph()
    automatic = getattr(graph, "_add_control_dependencies", False)
    graph._add_control_dependencies = False
    try:
      return tf.switch_case(index, [branch(b) for b in self.candidates])
    finally:
      graph._add_control_dependencies = automatic

  def _step_choice(self, pinned=-1):
    """This step's candidate index, decided at the step's start from the previous step's time
    (step start to step start, averaged over ranks); -1 on the first step, which the policy skips.
    `pinned`: the candidate this graph holds alone (retraced), -1 for the switch.

    Its only input is the clock, so it does not wait for any gradient. The clock and the policy
    are stateless numpy_functions: in a tf.function, automatic control dependencies chain every
    stateful op without a resource input (tf.timestamp, py_function, a model's stateful
    numpy_function) in program order, which would hold them, and so every bucket, until the
    backward pass had run its last such op.
    """
    last = tf.convert_to_tensor(self.last_time)
    now = tf.numpy_function(_seconds_now, [last], tf.float64, stateful=False)
    now = tf.ensure_shape(now, [])
    elapsed = tf.where(last > 0, now - last, tf.constant(-1.0, tf.float64))
    # All ranks decide on the same (averaged) number, so they switch together.
    elapsed = _hvd.allreduce(
      elapsed, op=_hvd.Average, name=f"lightcc_fusion_step_time_{self._number}"
    )
    choice = tf.numpy_function(
      self._observe,
      [elapsed, tf.constant(pinned, tf.int32), tf.constant(_new_graph_number(), tf.int32)],
      tf.int32,
      stateful=False,
    )
    choice = tf.ensure_shape(choice, [])
    with tf.control_dependencies([elapsed]):  # last_time is read before it is written
      update = tf.group(self.choice.assign(choice), self.last_time.assign(now))
    with tf.control_dependencies([update]):
      return tf.identity(choice)


_graph_numbers = itertools.count()


def _new_graph_number():
  """A number for the graph being traced; -1 when eager, where no step is a first run."""
  return -1 if tf.executing_eagerly() else next(_graph_numbers)


def _seconds_now(_):
  return np.float64(time.time())


def bytes_of_mib(mib):
  """A size in MiB (the LIGHT_* settings' unit) in bytes."""
  return int(mib * (1 << 20))


def reduce_in_buckets(tensors, bucket_bytes, reduce_bucket):
  """All `tensors` reduced bucket by bucket (buckets_in_backprop_order), in input order: each
  bucket's exchange depends only on its own tensors, so it starts as soon as they exist and its
  results are released as soon as it ends."""
  sizes = [t.shape.num_elements() * t.dtype.size for t in tensors]
  out = [None] * len(sizes)
  for bucket in buckets_in_backprop_order(sizes, bucket_bytes):
    for i, r in zip(bucket, reduce_bucket(bucket)):
      out[i] = r
  return out

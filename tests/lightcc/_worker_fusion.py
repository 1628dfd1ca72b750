"""Rank program: adaptive fusion reduces exactly like Horovod, and all ranks switch together.

main(two_d, topk, freeze, retrace, stale) (run as a script: $TWO_D, $TOPK, $FREEZE, $RETRACE,
$STALE, each 0 by default):

freeze=1 turns re-probes off, freezes the choice after the probe and traces the step again: the
new graph reduces alike without the switch over the candidates.

retrace=1 (with freeze=1) sets LIGHT_FUSION_RETRACE=1 and steps through hvd.FusionStepFunction:
every step's graph holds one bucketing alone, without a switch, and the choice freezes once
settled. stale=1 (with retrace=1) keeps one traced step instead: the ranks must stop with an
error that says to trace the step again.

topk=1 also sends the larger gradients through TOPK at ratio 1.0 (so still exactly Horovod's
result): buckets then mix TOPK and dense gradients, and the TOPK residual's layout must not depend
on the bucket size in force.
"""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import horovod.tensorflow as flat_hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402

SHAPES = [(40, 30), (30,), (30, 20), (20,), (7, 3, 5)]


def main(two_d=0, topk=0, freeze=0, retrace=0, stale=0):
  two_d, topk, freeze, retrace, stale = (int(v) for v in (two_d, topk, freeze, retrace, stale))
  hvd.init(
    light_fusion=1,
    light_fusion_buckets_mb=[0.001, 0.01, 1],
    light_fusion_probe_steps=2,
    light_fusion_reprobe_steps=0 if freeze else 3,
    light_2d_allreduce=two_d,
    light_intra_size=2,
    light_topk_allreduce=topk,
    light_topk_ratio=1.0,
    light_topk_threshold=400,
    light_fusion_retrace=retrace,
  )
  rank = hvd.rank()
  shapes = SHAPES
  variables = [tf.Variable(tf.zeros(s)) for s in shapes]
  rng = np.random.default_rng(rank)

  def traced_step():
    @tf.function
    def step(gradients):
      with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, gradients)])
      return hvd.DistributedGradientTape(tape).gradient(loss, variables)

    return step

  def run_steps(step, steps, failures):
    for number in range(steps):
      grads = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
      ours = step(grads)
      for o, g in zip(ours, grads):
        expected = flat_hvd.allreduce(g, op=flat_hvd.Average).numpy()
        if not np.allclose(o.numpy(), expected, rtol=1e-5, atol=1e-6):
          failures.append(f"step {number}: max diff {np.abs(o.numpy() - expected).max()}")

  def switches_in(step):
    graph = step.get_concrete_function([tf.TensorSpec(s, tf.float32) for s in shapes]).graph
    return [op.type for op in graph.get_operations() if "Case" in op.type or "If" in op.type]

  failures = []
  if hvd.freeze_settled_fusion():
    failures.append("froze before any step was traced")
  if stale:
    try:
      run_steps(traced_step(), 20, failures)
      failures.append("a step traced once ran 20 steps while the bucket size changed")
    except tf.errors.OpError as error:
      if "trace the step function again" not in str(error):
        failures.append(f"unclear error: {error}")
    print(f"rank {rank}: {len(failures)} failures {failures[:3]}", flush=True)
    sys.exit(1 if failures else 0)
  if retrace:
    traced = []

    def make_step():
      traced.append(traced_step())
      return traced[-1]

    step = hvd.FusionStepFunction(make_step)
    run_steps(step, 25, failures)
    policy = hvd.fusion_policies()[0]
    # One graph per candidate, then the frozen choice's; none holds a switch.
    if step.frozen_after_steps is None or step.traced != 4 or len(traced) != 4:
      failures.append(f"frozen after {step.frozen_after_steps}, {len(traced)} traced")
    if list(step._functions.values()) != [traced[-1]]:  # the probe's graphs are let go
      failures.append(f"kept {len(step._functions)} step functions after the freeze")
    if not all(type(index) is int for _, index in policy.history):  # policies are saved as JSON
      failures.append(f"history holds {[type(index) for _, index in policy.history]}")
    if any(switches_in(s) for s in traced):
      failures.append(f"a retraced step holds a switch: {[switches_in(s) for s in traced]}")
  else:
    step = traced_step()
    run_steps(step, 20, failures)
    policy = hvd.fusion_policies()[0]
  if freeze and not retrace:
    # Re-probes off: the probe (at most 2 x 3 x 2 steps) is over, so the choice freezes, and a
    # step traced now holds that bucketing alone: no switch, no step clock (the history stops).
    if not hvd.freeze_settled_fusion():
      failures.append(f"not settled after 20 steps: {policy.history}")
    frozen_step, steps_seen = traced_step(), len(policy.history)
    run_steps(frozen_step, 5, failures)
    switches = switches_in(frozen_step)
    if switches or len(policy.history) != steps_seen:
      failures.append(
        f"frozen step kept {switches}, {len(policy.history) - steps_seen} clock ticks"
      )
  choices = np.array([index for _, index in policy.history], np.int32)
  everyone = flat_hvd.allgather(tf.constant(choices[None, :])).numpy()
  if len(set(choices.tolist())) < 3:
    failures.append(f"not every candidate was tried: {choices.tolist()}")
  if not all(np.array_equal(everyone[0], row) for row in everyone):
    failures.append(f"ranks chose differently: {everyone.tolist()}")
  print(
    f"rank {rank}: choices {choices.tolist()} medians {policy.medians} "
    f"{len(failures)} failures {failures[:3]}",
    flush=True,
  )
  sys.exit(1 if failures else 0)


if __name__ == "__main__":
  main(
    **{k.lower(): os.environ.get(k, "0") for k in ("TWO_D", "TOPK", "FREEZE", "RETRACE", "STALE")}
  )

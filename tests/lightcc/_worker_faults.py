"""Rank program for LightCC's faults: a rank that dies mid-step, a link cut, elastic training.

CONFIG: "+"-joined parts of 2d, topk, fusion (LightCC's settings; 2D groups of 2 ranks).

MODE=kill: every rank trains; at step DIE_STEP, rank DIE_RANK SIGKILLs itself inside the backward
pass, while the step's later buckets are already in their exchange (the first layer's gradient,
which backprop produces last, calls the kill). The others ignore the launcher's SIGTERM (to see
what their own step does) and print when and how their step failed.

MODE=cut: every rank trains until stopped; the test takes the link between the nodes down
(benchmarks/lightcc_cluster.Cluster). Each rank prints the time of each step, then when and how
its step failed.

MODE=elastic: under `horovodrun --min-np`, with tf_ext.lightcc.elastic.run and TensorFlowState
(TOPK + fusion: LightCC's residuals and fusion policy in the state). Commits every COMMIT_EVERY
steps and writes what it committed; rank DIE_RANK of the first round SIGKILLs itself mid-step at
DIE_STEP. The others restore, re-form without it and check, before their next step, that
LightCC's residuals and policy are the committed ones; training then runs to STEPS.

main(mode, config, die_rank, die_step, steps, commit_every, result_dir); run as a script (as the
tests run it: a killed rank, a link cut and elastic training each need processes of their own):
$MODE, $CONFIG, $DIE_RANK, $DIE_STEP, $STEPS, $COMMIT_EVERY, $RESULT_DIR.
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402
from tf_ext.lightcc import state as lightcc_state  # noqa: E402

# This run's: set by main() (the functions below read them).
DIE_RANK, DIE_STEP = 1, 3
SHAPES = [(64, 256), (256, 256), (256, 256), (256, 8)]


def say(message):
  print(f"rank {hvd.rank()}: {message}", flush=True)


def make_variables():
  rng = np.random.default_rng(7)
  return [
    tf.Variable(rng.normal(0, 0.1, s).astype(np.float32), name=f"w{i}")
    for i, s in enumerate(SHAPES)
  ]


def make_step(variables, optimizer, die_at=None):
  """A tf.function training step; with die_at, this rank SIGKILLs itself in the backward pass of
  the step whose counter equals die_at (the first layer's gradient: the last one made)."""

  def kill_if(dy, step):
    if die_at is not None and int(step) == die_at:
      say(f"dying at {time.time():.3f}")
      os.kill(os.getpid(), signal.SIGKILL)
    return dy

  @tf.custom_gradient
  def watched(w, step):
    def grad(dy):
      return tf.ensure_shape(tf.numpy_function(kill_if, [dy, step], tf.float32), dy.shape), None

    return tf.identity(w), grad

  rng = np.random.default_rng(100 + hvd.rank())
  x = tf.constant(rng.normal(size=(32, SHAPES[0][0])).astype(np.float32))
  y = tf.constant(rng.normal(size=(32, SHAPES[-1][1])).astype(np.float32))

  @tf.function
  def step(counter):
    with tf.GradientTape() as tape:
      h = x @ watched(variables[0], counter)
      for w in variables[1:]:
        h = tf.nn.tanh(h) @ w
      loss = tf.reduce_mean(tf.square(h - y))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return loss

  return step


def run_until_failure(steps, die_at):
  variables = make_variables()
  optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9)
  step = make_step(variables, optimizer, die_at if hvd.rank() == DIE_RANK else None)
  # The launcher terminates the other ranks when one dies: ignored here, to see what each
  # survivor's step itself does (horovodrun still SIGKILLs it 5 s later).
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  for i in range(steps):
    start = time.time()
    try:
      loss = step(tf.constant(i, tf.int64))
      say(f"step {i} done at {time.time():.3f} loss {float(loss):.4f}")
    except Exception as error:  # noqa: BLE001
      first = str(error).strip().splitlines()[0] if str(error).strip() else ""
      say(
        f"the step failed at {time.time():.3f} after {time.time() - start:.1f} s: "
        f"{type(error).__name__}: {first}"
      )
      os._exit(4)
  say("all steps finished")


def elastic_training(directory, steps, commit_every):
  variables = make_variables()
  optimizer = tf.keras.optimizers.SGD(0.05, momentum=0.9)
  optimizer.build(variables)
  st = hvd.elastic.TensorFlowState(variables + optimizer.variables, step=0, rounds=0)
  first_rank = hvd.rank()  # the rank of the first round (names this process in the logs)

  @hvd.elastic.run
  def train(state):
    state.rounds += 1
    if state.rounds > 1:
      # After a reset: before any step, LightCC's state must be what was committed.
      residuals, policies = state.lightcc_committed()
      now = {v.name: v.numpy() for _, v in lightcc_state.graph_state().residuals.items()}
      same = sorted(now) == sorted(residuals) and all(
        np.array_equal(now[k], residuals[k]) for k in now
      )
      policy_now = [vars(p) for p in hvd.fusion_policies()]
      same_policy = [{k: v for k, v in p.items() if k != "history"} for p in policy_now] == [
        {k: v for k, v in p.items() if k != "history"} for p in policies
      ]
      nonzero = sum(float(np.abs(v).sum()) for v in now.values())
      say(
        f"(first rank {first_rank}) restored: size {hvd.size()} at step {state.step}, "
        f"residuals as committed: {same} "
        f"({len(now)} variables, |sum| {nonzero:.4f}), policy as committed: {same_policy} "
        f"({len(policy_now)} policies)"
      )
    die_at = DIE_STEP if (first_rank == DIE_RANK and state.rounds == 1) else None
    step = make_step(variables, optimizer, die_at)  # traced again after a reset (new size)
    while state.step < steps:
      loss = step(tf.constant(state.step, tf.int64))
      state.step += 1
      residual_sum = sum(
        float(np.abs(v.numpy()).sum()) for _, v in lightcc_state.graph_state().residuals.items()
      )
      say(f"(first rank {first_rank}) after step {state.step}: residual |sum| {residual_sum:.4f}")
      if state.step % commit_every == 0:
        state.commit()
        residuals, policies = state.lightcc_committed()
        say(f"committed step {state.step} size {hvd.size()} loss {float(loss):.4f}")
        with open(os.path.join(directory, f"commit_{first_rank}_{state.step}.json"), "w") as f:
          json.dump(
            {
              "size": hvd.size(),
              "residual_abs_sum": sum(float(np.abs(v).sum()) for v in residuals.values()),
              "policies": [p.get("_current") for p in policies],
            },
            f,
          )
    say(f"finished {state.step} steps on {hvd.size()} ranks")

  train(st)


def main(
  mode, config="topk+fusion", die_rank=1, die_step=3, steps=None, commit_every=2, result_dir=None
):
  global DIE_RANK, DIE_STEP
  parts = set(config.split("+"))
  hvd.init(
    light_2d_allreduce=int("2d" in parts),
    light_intra_size=2,
    light_topk_allreduce=int("topk" in parts),
    light_topk_ratio=0.1,
    light_topk_threshold=1000,
    light_fusion=int("fusion" in parts),
    light_fusion_buckets_mb=[0.05, 0.5],
    light_fusion_probe_steps=2,
    light_fusion_reprobe_steps=4,
  )
  DIE_RANK, DIE_STEP = int(die_rank), int(die_step)
  if mode == "kill":
    run_until_failure(int(steps or 20), DIE_STEP)
  elif mode == "cut":
    run_until_failure(10**6, None)
  elif mode == "elastic":
    elastic_training(result_dir, int(steps or 12), int(commit_every))
  else:
    raise SystemExit(f"unknown MODE {mode}")


if __name__ == "__main__":
  main(
    os.environ["MODE"],
    os.environ.get("CONFIG", "topk+fusion"),
    os.environ.get("DIE_RANK", "1"),
    os.environ.get("DIE_STEP", "3"),
    os.environ.get("STEPS"),
    os.environ.get("COMMIT_EVERY", "2"),
    os.environ.get("RESULT_DIR"),
  )

"""The rank program of lightcc_cluster.py (`lightcc_cluster.py --worker`): Horovod's
DistributedGradientTape from tf_ext.lightcc over gradients of the model's shapes, the timed steps
between two barriers, and the counters read around them, written to the result folder."""

import json
import os
import time

import _horovod_cluster


def worker(args):
  import horovod.tensorflow as horovod_hvd
  import numpy as np
  import tensorflow as tf

  import tf_ext.lightcc as hvd

  with open(args.spec) as f:
    spec = json.load(f)
  hvd.init()
  rank, local_rank = hvd.rank(), hvd.local_rank()
  rng = np.random.default_rng(1234 + rank)
  shapes = [tuple(s) for s in spec["shapes"]]
  variables = [tf.Variable(tf.zeros(s, tf.float32), name=f"w{i}") for i, s in enumerate(shapes)]
  targets = [tf.constant(rng.standard_normal(s, dtype=np.float32)) for s in shapes]

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, targets)])
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, variables)
    for v, g in zip(variables, grads):
      v.assign_sub(1e-3 * g)
    return loss

  def barrier():
    _horovod_cluster.barrier(horovod_hvd, tf, "lcc_bench_barrier")

  t = time.perf_counter()
  for _ in range(args.warmup):
    step()
  warmup_s = time.perf_counter() - t
  barrier()
  hvd.reset_traffic()
  before = _horovod_cluster.read_counters()
  t0 = time.perf_counter()
  for _ in range(args.steps):
    step()
  barrier()
  elapsed = time.perf_counter() - t0
  after = _horovod_cluster.read_counters()
  traffic = hvd.traffic()
  result = {
    "rank": rank,
    "local_rank": local_rank,
    "node": rank // _horovod_cluster.RANKS_PER_NODE,
    "steps": args.steps,
    "elapsed_s": elapsed,
    "warmup_s": warmup_s,
    "counters": {k: after[k] - before[k] for k in after},
    "traffic": traffic,
    "light_config": repr(hvd.light_config()),
    "fusion": [
      {
        "candidates_mb": [float(c) for c in hvd.light_config().fusion_buckets_mb],
        "chosen": p.current,
        "median_step_s": p.medians,
      }
      for p in hvd.fusion_policies()
    ],
  }
  with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
  barrier()  # nobody leaves (tearing down Gloo) while a peer still reads its counters

"""Rank program: adaptive fusion reduces exactly like Horovod, and all ranks switch together.

TOPK=1 also sends the larger gradients through TOPK at ratio 1.0 (so still exactly Horovod's
result): buckets then mix TOPK and dense gradients, and the TOPK residual's layout must not depend
on the bucket size in force.
"""

import os
import sys

sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import horovod.tensorflow as flat_hvd
import numpy as np
import tensorflow as tf

import tf_ext.lightcc as hvd

two_d = int(os.environ.get("TWO_D", "0"))
topk = int(os.environ.get("TOPK", "0"))
hvd.init(
  light_fusion=1,
  light_fusion_buckets_mb=[0.001, 0.01, 1],
  light_fusion_probe_steps=2,
  light_fusion_reprobe_steps=3,
  light_2d_allreduce=two_d,
  light_intra_size=2,
  light_topk_allreduce=topk,
  light_topk_ratio=1.0,
  light_topk_threshold=400,
)
rank = hvd.rank()
shapes = [(40, 30), (30,), (30, 20), (20,), (7, 3, 5)]
variables = [tf.Variable(tf.zeros(s)) for s in shapes]
rng = np.random.default_rng(rank)


@tf.function
def step(gradients):
  with tf.GradientTape() as tape:
    loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, gradients)])
  return hvd.DistributedGradientTape(tape).gradient(loss, variables)


failures = []
for number in range(20):
  grads = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
  ours = step(grads)
  for o, g in zip(ours, grads):
    expected = flat_hvd.allreduce(g, op=flat_hvd.Average).numpy()
    if not np.allclose(o.numpy(), expected, rtol=1e-5, atol=1e-6):
      failures.append(f"step {number}: max diff {np.abs(o.numpy() - expected).max()}")
policy = hvd.fusion_policies()[0]
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

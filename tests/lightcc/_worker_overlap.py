"""Rank program: each bucket's reduced gradients are released as soon as that bucket is reduced,
before the gradient that backprop produces last exists (LightCC's exchange overlaps the backward
pass), and the results stay Horovod's.

The first variable's gradient (the last one backprop produces, so the last bucket) is held back
DELAY seconds by a sleep in its backward (a stateful numpy_function, as a model's own may be);
every other gradient is ready at once. Each reduced
gradient is stamped with tf.timestamp() when it is released. The last layer's gradient must be
released well before the first layer's: before LightCC released its buckets one by one, all
gradients (one group per kind without LIGHT_FUSION; every bucket, the step-time allreduce and the
fusion policy with it) came out together after the delayed one.

main(config): "+"-joined parts of 2d, topk, fusion (run as a script: $CONFIG). Every tensor is
its own bucket (LIGHT_BUCKET_MB and the fusion candidates are tiny); TOPK runs at ratio 1.0, so
results equal Horovod's.
"""

import os
import sys
import time

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import horovod.tensorflow as flat_hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _rank_checks import finish  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402

DELAY = 1.5


def _sleep(x):
  time.sleep(DELAY)
  return x


def _now(_):
  return np.float64(time.time())


@tf.custom_gradient
def held_back(x):
  def grad(upstream):
    return tf.ensure_shape(tf.numpy_function(_sleep, [upstream], tf.float32), upstream.shape)

  return tf.identity(x), grad


def main(config="2d"):
  parts = set(config.split("+"))
  hvd.init(
    light_2d_allreduce=int("2d" in parts),
    light_intra_size=2,
    light_topk_allreduce=int("topk" in parts),
    light_topk_ratio=1.0,
    light_topk_threshold=1000,
    light_fusion=int("fusion" in parts),
    light_fusion_buckets_mb=[0.0001, 0.0002],
    light_fusion_probe_steps=2,
    light_fusion_reprobe_steps=0,
    light_bucket_mb=0.0001,
  )
  rank = hvd.rank()
  shapes = [(32, 16), (16,), (16, 32), (32,), (24, 24)]  # 2 KiB, 64 B, 2 KiB, 128 B, 2.3 KiB
  variables = [tf.Variable(tf.zeros(s)) for s in shapes]
  rng = np.random.default_rng(rank)

  @tf.function
  def step(gradients):
    with tf.GradientTape() as tape:
      products = [tf.reduce_sum(v * g) for v, g in zip(variables, gradients)]
      products[0] = tf.reduce_sum(held_back(variables[0]) * gradients[0])
      loss = tf.add_n(products)
    grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
    # Stateless stamps: tf.timestamp() is stateful, and a tf.function runs stateful ops without a
    # resource input in program order, which would stamp every gradient after the held-back one.
    stamps = [tf.numpy_function(_now, [g], tf.float64, stateful=False) for g in grads]
    return grads, stamps

  failures, cases = [], 0
  for number in range(6):
    inputs = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
    ours, stamps = step(inputs)
    stamps = [float(s) for s in stamps]
    for i, (o, g) in enumerate(zip(ours, inputs)):
      cases += 1
      expected = flat_hvd.allreduce(g, op=flat_hvd.Average).numpy()
      if not np.allclose(o.numpy(), expected, rtol=1e-5, atol=1e-6):
        failures.append(
          f"step {number} gradient {i}: max diff {np.abs(o.numpy() - expected).max()}"
        )
    if number == 0:
      continue  # the first call traces and warms up Horovod's process sets
    cases += 1
    lead = stamps[0] - stamps[-1]  # first layer's release after the last layer's
    print(
      f"rank {rank} step {number}: last layer released {lead:.3f} s before the first", flush=True
    )
    if lead < 0.6 * DELAY:
      failures.append(
        f"step {number}: the last layer's gradient was released only {lead:.3f} s before the "
        f"first layer's (held back {DELAY} s): it waited for the last bucket"
      )
  finish(rank, cases, failures)


if __name__ == "__main__":
  main(os.environ.get("CONFIG", "2d"))

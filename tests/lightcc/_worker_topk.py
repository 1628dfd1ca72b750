"""Rank program: TOPK compression properties (run by test_topk.py).

main(mode, two_d, fp16):
  mode="dense_equal": ratio 1.0 gives exactly Horovod's dense average.
  mode="feedback":    with error feedback the running sum of what was exchanged approaches the
                      running sum of gradients (the gap is the residual, which stays bounded).
Run as a script: $MODE, $TWO_D, $FP16.
"""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import horovod.tensorflow as flat_hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402


def main(mode, two_d=0, fp16=0):
  two_d = int(two_d)
  hvd.init(
    light_topk_allreduce=1,
    light_topk_threshold=0,
    light_2d_allreduce=two_d,
    light_intra_size=2,
    light_topk_ratio=1.0 if mode == "dense_equal" else 0.05,
    light_topk_fp16=int(fp16),
  )
  rank = hvd.rank()
  variable = tf.Variable(tf.zeros([37, 11]))  # 407 entries: odd, so the 2D chunks are uneven
  rng = np.random.default_rng(rank)

  def reduced_gradient(g):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(variable * g)
    return hvd.DistributedGradientTape(tape).gradient(loss, [variable])[0]

  failures = []
  if mode == "dense_equal":
    for step in range(3):
      g = tf.constant(rng.normal(size=(37, 11)), tf.float32)
      ours, dense = reduced_gradient(g).numpy(), flat_hvd.allreduce(g, op=flat_hvd.Average).numpy()
      if not np.allclose(ours, dense, rtol=1e-5, atol=1e-6):
        failures.append(f"step {step}: max diff {np.abs(ours - dense).max()}")
  else:
    sent_sum = np.zeros((37, 11))
    true_sum = np.zeros((37, 11))
    gaps = []
    for step in range(1, 301):
      # A drift, as real gradients have.
      g = tf.constant(rng.normal(size=(37, 11)) + 0.1, tf.float32)
      sent_sum += reduced_gradient(g).numpy()
      true_sum += flat_hvd.allreduce(g, op=flat_hvd.Average).numpy()
      if step in (30, 300):
        gaps.append(np.linalg.norm(sent_sum - true_sum) / np.linalg.norm(true_sum))
    # The gap is the averaged residual: bounded while the sum grows, so its share shrinks.
    if not gaps[1] < gaps[0] * 0.5:
      failures.append(f"relative gap did not shrink: {gaps}")
    if not gaps[1] < 0.35:
      failures.append(f"relative gap after 300 steps too large: {gaps}")
    figures = hvd.traffic()
    if two_d:  # in-group legs stay dense; the inter-group leg carries a few percent of a flat ring
      if not figures["inter_bytes"] < 0.1 * figures["dense_equivalent_bytes"]:
        failures.append(f"inter-group leg not compressed: {figures}")
    elif not figures["compression_ratio"] > 2:
      failures.append(f"no compression measured: {figures}")
    print(f"rank {rank}: gaps {gaps} traffic {figures}", flush=True)
  print(f"rank {rank}: {len(failures)} failures {failures[:3]}", flush=True)
  sys.exit(1 if failures else 0)


if __name__ == "__main__":
  main(os.environ["MODE"], os.environ.get("TWO_D", "0"), os.environ.get("FP16", "0"))

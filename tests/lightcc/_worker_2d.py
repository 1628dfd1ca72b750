"""Rank program: 2D allreduce equals Horovod's flat allreduce (run by test_2d.py).

main(intra): LIGHT_INTRA_SIZE (run as a script: $INTRA, default 2)."""

import os
import sys

if __name__ == "__main__":
  sys.path.insert(0, os.environ["TF_EXT_ROOT"])
import horovod.tensorflow as flat_hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ext.lightcc as hvd  # noqa: E402


def main(intra=2):
  hvd.init(light_2d_allreduce=1, light_intra_size=int(intra))
  rank = hvd.rank()
  failures = []
  for dtype in (tf.int32, tf.int64, tf.float16, tf.float32, tf.float64):
    for length in (1, 2, 3, 7, 64, 1001):
      for op in (hvd.Sum, hvd.Average):
        rng = np.random.default_rng(rank * 1000 + length)
        values = (
          rng.integers(-100, 100, size=(length,))
          if dtype.is_integer
          else rng.normal(size=(length,))
        )
        tensor = tf.constant(values.reshape(-1, 1) if length % 2 else values, dtype)
        ours = hvd.allreduce(tensor, op=op, name=f"t_{dtype.name}_{length}_{op}")
        theirs = flat_hvd.allreduce(tensor, op=op, name=f"f_{dtype.name}_{length}_{op}")
        if ours.shape != theirs.shape or ours.dtype != theirs.dtype:
          failures.append(f"{dtype.name} n={length} op={op}: shape/dtype {ours.shape}/{ours.dtype}")
        elif dtype.is_integer:
          if not np.array_equal(ours.numpy(), theirs.numpy()):
            failures.append(f"{dtype.name} n={length} op={op}: not exact")
        else:
          tol = 2e-2 if dtype == tf.float16 else 1e-5
          if not np.allclose(ours.numpy(), theirs.numpy(), rtol=tol, atol=tol):
            failures.append(
              f"{dtype.name} n={length} op={op}: max diff "
              f"{np.abs(ours.numpy() - theirs.numpy()).max()}"
            )
  traffic = hvd.traffic()
  print(f"rank {rank}: {len(failures)} failures {failures[:3]} traffic {traffic}", flush=True)
  sys.exit(1 if failures else 0)


if __name__ == "__main__":
  main(os.environ.get("INTRA", "2"))

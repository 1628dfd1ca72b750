"""Checks shared by the rank programs: whether all ranks hold the same arrays, and the exit."""

import sys

import numpy as np
import tensorflow as tf


def ranks_differ(hvd, arrays):
  """Whether any rank's `arrays` differ from rank 0's (bit for bit)."""
  fingerprint = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
  everyone = hvd.allgather(tf.constant(fingerprint[None, :])).numpy()
  return not all(np.array_equal(everyone[0], row) for row in everyone)


def finish(rank, cases, failures, shown=4):
  """Prints this rank's summary and first failures; exits non-zero if any."""
  print(f"rank {rank}: {cases} cases, {len(failures)} failures", flush=True)
  for failure in failures[:shown]:
    print(failure, flush=True)
  sys.exit(1 if failures else 0)

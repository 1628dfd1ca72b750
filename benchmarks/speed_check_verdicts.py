"""How often tf_ext.jit's speed check gets its verdicts right, on simulated calls.

A speed check (tf_ext/jit/speed_check.py) times 12 calls compiled and 12 uncompiled, drawn from the
stream, and decides (1) whether to run compiled now, with today's buckets' padding, and (2)
whether XLA would be faster at all without padding (else no new bucket is compiled). This script
draws such checks from cost models shaped like the two workloads of benchmarks/jit_cache.py (a
fixed cost per call plus a cost per element, 15% noise, and 3% of calls stalled 3x) and counts how
often each rule's verdicts agree with the truth, the two ways' mean cost over the whole stream:
  medians  the anchor, the earlier rule: medians of time per element, per true element
           for (1) and per padded element for (2);
  ours     SpeedCheck as it is: each way's Theil-Sen line of time against elements, both lines
           compared over the check's calls.
Cases near a tie (within the 5% margin) are hard for any rule; the costs below are the ones the
benchmark's checks measured on 2-core CPUs, in microseconds.
"""

import argparse
import math
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_ext.jit import speed_check  # noqa: E402

MARGIN = 0.05


def stream_a(rng):
  """Workload A: batch sizes 8-512 in steps of 4, uniform."""
  return [int(n) for n in 4 * rng.integers(2, 129, size=4000)]


def stream_b(rng):
  """Workload B: batch x longest sequence, as benchmarks/jit_cache.py draws them."""
  out = []
  for _ in range(4000):
    batch = 128 if rng.random() < 0.7 else 8 * math.ceil(int(rng.integers(1, 129)) / 8)
    length = min(200, 4 * math.ceil(min(200, max(1, rng.gamma(2.0, 30.0))) / 4))
    out.append((min(128, batch), length))
  return out


def bucket_of(boundaries, n):
  return min(b for b in boundaries if b >= n)


# (name, stream, elements(x), padded elements(x), uncompiled (fixed, per element),
#  compiled (fixed, per padded element)), in microseconds.
def cases():
  a_sizes = lambda buckets: (lambda n: n, lambda n: bucket_of(buckets, n))  # noqa: E731

  def b_sizes(seq_buckets):
    return (lambda x: x[0] * x[1], lambda x: 128 * bucket_of(seq_buckets, x[1]))

  return [
    ("A, bucket 512, XLA 10 us/el", stream_a, *a_sizes([512]), (400, 24), (600, 10)),
    ("A, bucket 512, XLA 14 us/el", stream_a, *a_sizes([512]), (400, 24), (600, 14)),
    ("A, buckets 264/512", stream_a, *a_sizes([264, 512]), (400, 24), (600, 11)),
    ("A, 4 buckets, XLA 17 us/el", stream_a, *a_sizes([144, 264, 376, 512]), (400, 24), (600, 17)),
    ("B, seq bucket 208", stream_b, *b_sizes([208]), (1000, 0.6), (1000, 0.7)),
    ("B, seq buckets 76/208", stream_b, *b_sizes([76, 208]), (1000, 0.6), (1000, 0.7)),
    ("B, 3 seq buckets, XLA faster", stream_b, *b_sizes([40, 76, 208]), (1000, 0.6), (1000, 0.5)),
  ]


def medians_rule(samples):
  """The anchor: medians of time per element."""
  compiled = [(t, n, p) for ran, t, n, p in samples if ran]
  uncompiled = [(t, n) for ran, t, n, _ in samples if not ran]
  per_true = statistics.median(t / n for t, n, _ in compiled)
  per_padded = statistics.median(t / p for t, _, p in compiled)
  bound = statistics.median(t / n for t, n in uncompiled) * (1 + MARGIN)
  return per_true <= bound, per_padded <= bound


def ours_rule(samples):
  check = speed_check.SpeedCheck(settle_calls=0, samples=12, margin=MARGIN)
  check.run_compiled()
  compiled = [s for s in samples if s[0]]
  uncompiled = [s for s in samples if not s[0]]
  while True:
    ran = check.run_compiled()
    _, seconds, n, p = (compiled if ran else uncompiled).pop()
    if check.record(ran, seconds, n, p):
      return check.compiled_faster, check.xla_faster


def simulate(case, checks, rng):
  """{rule: [% right of "run compiled?", % right of "keep compiling?"]}, and the truth's ratios
  (compiled with today's padding, compiled unpadded) to uncompiled."""
  _, stream, elements, padded, (fixed_u, per_u), (fixed_c, per_c) = case
  calls = stream(rng)
  mean_u = np.mean([fixed_u + per_u * elements(x) for x in calls])
  mean_c = np.mean([fixed_c + per_c * padded(x) for x in calls])
  mean_x = np.mean([fixed_c + per_c * elements(x) for x in calls])
  truth = (mean_c <= mean_u * (1 + MARGIN), mean_x <= mean_u * (1 + MARGIN))
  right = {"medians": [0, 0], "ours": [0, 0]}
  for _ in range(checks):
    samples = []
    for index in range(24):
      x = calls[rng.integers(len(calls))]
      noise = rng.lognormal(0, 0.15) * (3 if rng.random() < 0.03 else 1)
      ran = index % 2 == 0
      us = fixed_c + per_c * padded(x) if ran else fixed_u + per_u * elements(x)
      samples.append((ran, us * 1e-6 * noise, elements(x), padded(x)))
    for rule, decide in (("medians", medians_rule), ("ours", ours_rule)):
      verdicts = decide(samples)
      for k in (0, 1):
        right[rule][k] += verdicts[k] == truth[k]
  percent = {rule: [100 * v / checks for v in counts] for rule, counts in right.items()}
  return percent, (mean_c / mean_u, mean_x / mean_u)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--checks", type=int, default=2000, help="simulated checks per case")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  rng = np.random.default_rng(args.seed)
  print(f"{args.checks} simulated checks per case; % of verdicts equal to the truth")
  print(f"{'case':<30}{'truth':>14}{'run compiled?':>22}{'keep compiling?':>22}")
  print(f"{'':<30}{'c/u  x/u':>14}{'medians -> ours':>22}{'medians -> ours':>22}")
  for case in cases():
    pct, (compiled_ratio, unpadded_ratio) = simulate(case, args.checks, rng)
    print(
      f"{case[0]:<30}{compiled_ratio:>7.2f}{unpadded_ratio:>7.2f}"
      f"{pct['medians'][0]:>14.0f} -> {pct['ours'][0]:>3.0f}"
      f"{pct['medians'][1]:>14.0f} -> {pct['ours'][1]:>3.0f}"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())

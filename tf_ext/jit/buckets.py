"""Bucket planning for tf_ext.jit: pure Python (and numpy), no TensorFlow.

A *dimension* is a named axis whose size varies between calls ("batch", "seq"). Its observed sizes
form a histogram {size: count}. A bucket plan for it is an increasing tuple of boundaries; a size
runs in the smallest boundary that holds it, padded up to that boundary.

`optimal_boundaries` chooses, for one dimension and k buckets, the boundaries that minimize the
padded work sum(count * (bucket - size)) exactly (dynamic programming over the sorted distinct
sizes: an optimal boundary is always an observed size, and the largest observed size is always
one). `plan` chooses how many buckets each dimension gets: at most `max_buckets` bucket shapes in
total (the product over the dimensions), and an extra bucket only where it cuts the expected
padded work (measured on the joint histogram of observed size tuples) by at least `min_gain` of
the unpadded work: fewer executables unless more clearly pay.
"""

import itertools
import math
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

Boundaries = Tuple[int, ...]


def geometric_boundaries(max_size: int, smallest: int = 8, ratio: float = 2.0) -> Boundaries:
  """A default plan before there are observations: smallest, smallest*ratio, ... up to max_size
  (always included)."""
  if max_size < 1 or smallest < 1 or ratio <= 1.0:
    raise ValueError("geometric_boundaries needs max_size >= 1, smallest >= 1 and ratio > 1")
  out, size = [], smallest
  while size < max_size:
    out.append(int(size))
    size = max(int(size) + 1, int(math.ceil(size * ratio)))
  out.append(int(max_size))
  return tuple(out)


def bucket_of(size: int, boundaries: Boundaries) -> Optional[int]:
  """The smallest boundary >= size, or None when the plan cannot hold `size`."""
  for boundary in boundaries:
    if boundary >= size:
      return boundary
  return None


def padding_cost(histogram: Mapping[int, int], boundaries: Boundaries) -> float:
  """Padded elements sum(count * (bucket - size)); inf if a size does not fit."""
  total = 0.0
  for size, count in histogram.items():
    bucket = bucket_of(size, boundaries)
    if bucket is None:
      return math.inf
    total += count * (bucket - size)
  return total


def optimal_boundaries(histogram: Mapping[int, int], k: int) -> Boundaries:
  """The at most k boundaries minimizing padding_cost(histogram, .) (exact: O(k n^2) in numpy
  for n distinct sizes)."""
  if k < 1:
    raise ValueError("k must be >= 1")
  items = sorted((int(s), int(c)) for s, c in histogram.items() if c > 0)
  if not items:
    raise ValueError("empty histogram")
  if any(s < 0 for s, _ in items):
    raise ValueError("sizes must be >= 0")
  sizes = np.array([s for s, _ in items], dtype=np.float64)
  counts = np.array([c for _, c in items], dtype=np.float64)
  n = len(items)
  if k >= n:
    return tuple(int(s) for s in sizes)
  # Prefix sums: the group (i..j], bucket sizes[j-1], costs sizes[j-1]*C - S over the group.
  pc = np.concatenate([[0.0], np.cumsum(counts)])
  ps = np.concatenate([[0.0], np.cumsum(counts * sizes)])

  def group_cost(i, j):  # vector over i (array), groups i..j-1 (0-based, half-open)
    return sizes[j - 1] * (pc[j] - pc[i]) - (ps[j] - ps[i])

  inf = np.inf
  # best[m][j]: minimal cost of the first j sizes in m groups; choice[m][j]: start of the last.
  best = np.full((k + 1, n + 1), inf)
  choice = np.zeros((k + 1, n + 1), dtype=np.int64)
  best[0][0] = 0.0
  for m in range(1, k + 1):
    for j in range(1, n + 1):
      starts = np.arange(0, j)
      candidates = best[m - 1][starts] + group_cost(starts, j)
      at = int(np.argmin(candidates))
      best[m][j] = candidates[at]
      choice[m][j] = at
  m = int(np.argmin(best[1:, n])) + 1  # fewer groups may tie; argmin takes the fewest
  out, j = [], n
  while j > 0:
    out.append(int(sizes[j - 1]))
    j = int(choice[m][j])
    m -= 1
  return tuple(sorted(out))


def marginals(joint: Mapping[Tuple[int, ...], int], dims: int) -> Tuple[Dict[int, int], ...]:
  """The per-dimension histograms of a joint histogram {(size_1, ..., size_d): count}."""
  out = tuple({} for _ in range(dims))
  for sizes, count in joint.items():
    for d, size in enumerate(sizes):
      out[d][size] = out[d].get(size, 0) + count
  return out


def joint_cost(joint: Mapping[Tuple[int, ...], int], plan: Sequence[Boundaries]) -> float:
  """Padded work of a plan on a joint histogram: sum(count * (prod(buckets) - prod(sizes)))."""
  total = 0.0
  for sizes, count in joint.items():
    padded = 1
    for size, boundaries in zip(sizes, plan):
      bucket = bucket_of(size, boundaries)
      if bucket is None:
        return math.inf
      padded *= bucket
    total += count * (padded - math.prod(sizes))
  return total


def plan(
  joint: Mapping[Tuple[int, ...], int], dims: int, max_buckets: int, min_gain: float = 0.03
) -> Tuple[Boundaries, ...]:
  """Boundaries for each of `dims` dimensions from a joint histogram of observed size tuples.

  Candidates are the per-dimension optimal boundaries for each count k_d with prod(k_d) <=
  max_buckets. Starting from one bucket per dimension, the plan grows while some candidate with
  more bucket shapes lowers the padded work by at least min_gain * (unpadded work) per extra
  bucket shape; among those it takes the best gain per extra shape."""
  if dims == 0:
    return ()
  if max_buckets < 1:
    raise ValueError("max_buckets must be >= 1")
  hists = marginals(joint, dims)
  work = float(sum(count * math.prod(sizes) for sizes, count in joint.items())) or 1.0
  options = {}  # (dimension, k) -> boundaries
  for d in range(dims):
    for k in range(1, max_buckets + 1):
      options[(d, k)] = optimal_boundaries(hists[d], k)

  keys = list(joint)
  sizes = np.array(keys, dtype=np.float64).reshape(len(keys), dims)
  weights = np.array([joint[key] for key in keys], dtype=np.float64)
  unpadded = float(np.sum(weights * np.prod(sizes, axis=1)))

  def cost(counts):  # joint_cost, vectorized
    padded = np.ones(len(keys))
    for d, k in enumerate(counts):
      bounds = np.array(options[(d, k)], dtype=np.float64)
      padded *= bounds[np.searchsorted(bounds, sizes[:, d])]
    return float(np.sum(weights * padded)) - unpadded

  current = (1,) * dims
  current_cost = cost(current)
  while True:
    best, best_rate = None, 0.0
    for counts in itertools.product(range(1, max_buckets + 1), repeat=dims):
      shapes, now = math.prod(counts), math.prod(current)
      if shapes > max_buckets or shapes <= now:
        continue
      if any(c < cur for c, cur in zip(counts, current)):
        continue
      gain = (current_cost - cost(counts)) / work
      rate = gain / (shapes - now)
      if rate >= min_gain and rate > best_rate:
        best, best_rate = counts, rate
    if best is None:
      break
    current, current_cost = best, cost(best)
  return tuple(options[(d, k)] for d, k in enumerate(current))


def grow(
  joint: Mapping[Tuple[int, ...], int],
  current: Sequence[Boundaries],
  max_buckets: int,
  min_gain: float = 0.03,
) -> Tuple[Boundaries, ...]:
  """`current` with one more boundary, the one (over every dimension and observed size) that
  cuts the padded work most per extra bucket shape, if that is at least min_gain of the unpadded
  work per extra shape and the plan stays within max_buckets shapes; else `current`. The other
  boundaries stay, so growing costs exactly the compilations of the new bucket shapes."""
  current = tuple(tuple(b) for b in current)
  dims = len(current)
  if not dims or not joint:
    return current
  work = float(sum(count * math.prod(sizes) for sizes, count in joint.items())) or 1.0
  base = joint_cost(joint, current)
  if math.isinf(base):
    return current
  shapes = math.prod(len(b) for b in current)
  best, best_rate = current, 0.0
  for d in range(dims):
    more = shapes // len(current[d]) * (len(current[d]) + 1)
    if more > max_buckets:
      continue
    for size in {sizes[d] for sizes in joint}:
      if size in current[d] or size > current[d][-1]:
        continue
      candidate = list(current)
      candidate[d] = tuple(sorted(current[d] + (size,)))
      rate = (base - joint_cost(joint, candidate)) / work / (more - shapes)
      if rate >= min_gain and rate > best_rate:
        best, best_rate = tuple(candidate), rate
  return best

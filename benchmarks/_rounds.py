"""Interleaved rounds: the variants a benchmark compares measured alternately in the same run,
each round in another order, so that a shared machine's drifting load weighs on all of them
alike; and the figures taken over the rounds (ratios of medians, medians of the rounds' ratios,
a paired ratio's standard error). Imported as `_rounds` (the scripts run from this folder)."""

import statistics
import time


def rotated(names, round_index):
  """`names` starting at position round_index (mod len): the order of an interleaved round, so
  that no variant always runs first (or right after a given other one)."""
  shift = round_index % len(names)
  return names[shift:] + names[:shift]


def interleaved(names, rounds, measure):
  """measure(name) for every name in each of `rounds` rounds, round r in the order
  rotated(names, r); {name: [what measure returned, round by round]}."""
  got = {name: [] for name in names}
  for r in range(rounds):
    for name in rotated(list(names), r):
      got[name].append(measure(name))
  return got


def wall_and_cpu(fn, batches):
  """(wall seconds, process CPU seconds) to run fn over every batch once (each call is
  synchronous on CPU). CPU time counts every thread of this process: on a shared machine it is
  less disturbed by other tenants than wall time, so it is reported as context."""
  cpu_start, start = time.process_time(), time.perf_counter()
  for b in batches:
    out = fn(b)
  del out
  return time.perf_counter() - start, time.process_time() - cpu_start


def timed_rounds(methods, warmup, repeats):
  """methods: {name: (fn, batches)}. `warmup` untimed rounds, then `repeats` timed ones, each
  running every method over all its batches in a rotating order. ({name: [wall seconds per
  round]}, {name: [process CPU seconds per round]})."""
  names = list(methods)

  def measure(name):
    return wall_and_cpu(*methods[name])

  interleaved(names, warmup, measure)
  got = interleaved(names, repeats, measure)
  return (
    {name: [wall for wall, _ in got[name]] for name in names},
    {name: [cpu for _, cpu in got[name]] for name in names},
  )


def ratio_of_medians(values, reference):
  """median(values) / median(reference)."""
  return statistics.median(values) / statistics.median(reference)


def median_of_ratios(values, reference):
  """The median over the rounds of values[r] / reference[r]: each round's two figures ran
  within seconds of each other, so a drift between rounds cancels."""
  return statistics.median(v / r for v, r in zip(values, reference))


def speed_ratio_with_error(runs, reference_runs):
  """The speed of `runs` against `reference_runs`, the per-run step times of two configurations
  that ran in the same rounds (None for a failed run), over the rounds where both ran:
  mean(reference) / mean(runs), and its standard error from how the rounds' pairs stray from that
  ratio (first order). The shared machine slows whole rounds for minutes, and both of a round's
  runs alike (their CPU time per step rises with their step time): pairing the runs by round takes
  that out of the error, which unpaired runs' spread would count twice. A ratio closer to its
  target than two standard errors says less than its digits."""
  pairs = [(x, y) for x, y in zip(runs, reference_runs) if x is not None and y is not None]
  if not pairs:
    return float("nan"), float("nan")
  mean = statistics.fmean(x for x, _ in pairs)
  ratio = statistics.fmean(y for _, y in pairs) / mean
  if len(pairs) < 2:
    return ratio, float("nan")
  strays = [y - ratio * x for x, y in pairs]
  return ratio, (statistics.variance(strays) / len(pairs)) ** 0.5 / mean

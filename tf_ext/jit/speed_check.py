"""Whether XLA actually makes a function faster, measured on its own calls.

XLA is not always faster: on some CPUs its code for a model is slower than TensorFlow's own
kernels, and a short run may never earn back a compilation. So once a tf_ext.jit.function has a
ready executable, it runs a few calls each way, interleaved (so that both see the same machine
load), and compares what the two ways would cost over the same calls.

Each way's time is modelled as a fixed cost per call plus a cost per element (the product of the
padded dimensions' sizes; a compiled call pays for its padded elements), fitted robustly
(Theil-Sen) to its timed calls. Comparing fitted lines over all the timed calls' sizes, rather
than medians of time per element, keeps the verdicts from swinging with the sizes a check happens
to draw: a small call's time per element is mostly its fixed cost. (Simulated checks,
benchmarks/speed_check_verdicts.py: on benchmark A's stream the first verdict is right 92% of the
time instead of 73%, on benchmark B's the "keep compiling?" verdict 80-84% instead of 8-21%.)
Two verdicts come out of one check:
  * run compiled?   the compiled line at the calls' padded sizes against the uncompiled line at
                    their true sizes: the padding of today's buckets included, which way is
                    faster now;
  * keep compiling? the compiled line at the true sizes against the uncompiled line: would XLA's
                    code be faster with no padding at all; if not, better buckets cannot help,
                    so no new bucket is compiled (the executables already made still run where
                    they win).
Where the compiled calls' padded sizes barely vary (one bucket), their line has no slope to fit:
its fixed cost is taken as the uncompiled calls' (both ways pay the same dispatch), at most its
fastest call's time.
A new check starts a few calls after each new executable is ready (the buckets changed), and
every `recheck_every` calls (the load or the shape mix may have changed).

Pure Python and clock-free: the caller measures and reports.
"""

import statistics


class SpeedCheck:
  """One function signature's verdicts. Not thread-safe (the owner holds its lock)."""

  def __init__(self, *, settle_calls=8, samples=12, margin=0.05, recheck_every=1000):
    self.settle_calls = settle_calls  # calls after a new executable before checking
    self.samples = samples  # timed calls of each kind per check
    self.margin = margin  # compiled may be this much slower and still count as not slower
    self.recheck_every = recheck_every
    self.compiled_faster = None  # run compiled? None: no verdict yet
    self.xla_faster = None  # keep compiling new buckets? None: no verdict yet
    # The last check's fitted seconds per element over its calls: "compiled" (per true element,
    # padding included), "padded" (per padded element), "unpadded" (the compiled line at the true
    # sizes), "uncompiled".
    self.last = None
    self._calls = 0  # calls that could have run compiled
    self._next_check = settle_calls
    self._reset_samples()

  def _reset_samples(self):
    self._compiled, self._uncompiled = [], []  # (seconds, elements, padded elements) per call

  @property
  def checking(self):
    return self._calls > self._next_check

  def executables_changed(self):
    """A new executable is ready: check again soon (its buckets pad less)."""
    self._next_check = min(self._next_check, self._calls + self.settle_calls)
    self._reset_samples()

  def run_compiled(self, timed=True):
    """Called when a ready executable could run this call: whether to run it compiled.
    `timed`: whether its time will be recorded (calls that are not, e.g. while the compiler
    competes for the CPU, follow the last verdict)."""
    self._calls += 1
    if self.checking and timed:
      # Interleave: the kind with fewer samples runs next (compiled on a tie).
      return len(self._compiled) <= len(self._uncompiled)
    return self.compiled_faster is not False

  def record(self, compiled, seconds, elements, padded_elements):
    """A call that run_compiled() chose: whether it ran compiled, its time, its true element
    count and its padded one (for an uncompiled call, what its bucket would have padded it to).
    Returns True when this call completed a check (the verdicts are new), else False."""
    if not self.checking or elements <= 0:
      return False
    (self._compiled if compiled else self._uncompiled).append(
      (seconds, elements, max(padded_elements, elements))
    )
    if min(len(self._compiled), len(self._uncompiled)) < self.samples:
      return False
    calls = self._compiled + self._uncompiled
    sizes = [n for _, n, _ in self._uncompiled]
    seconds = [t for t, _, _ in self._uncompiled]
    # Every call of one size: time proportional to the elements.
    uncompiled = _fit(sizes, seconds) or _line_through(0.0, sizes, seconds)
    sizes = [p for _, _, p in self._compiled]
    seconds = [t for t, _, _ in self._compiled]
    # One bucket: the uncompiled fixed cost, at most the fastest call's (see the module doc).
    compiled = _fit(sizes, seconds) or _line_through(min(uncompiled[0], *seconds), sizes, seconds)
    elements = sum(n for _, n, _ in calls)
    padded = sum(p for _, _, p in calls)
    cost = {
      "compiled": _total(compiled, [p for _, _, p in calls]),
      "unpadded": _total(compiled, [n for _, n, _ in calls]),
      "uncompiled": _total(uncompiled, [n for _, n, _ in calls]),
    }
    self.last = {kind: value / elements for kind, value in cost.items()}
    self.last["padded"] = cost["compiled"] / padded
    bound = cost["uncompiled"] * (1.0 + self.margin)
    self.compiled_faster = cost["compiled"] <= bound
    self.xla_faster = cost["unpadded"] <= bound
    self._reset_samples()
    self._next_check = self._calls + self.recheck_every
    return True


def _fit(sizes, seconds):
  """(fixed, per element) seconds of a call: the Theil-Sen line (the median of the pairwise
  slopes, then the median intercept; one stalled call cannot move it), both at least 0. None
  where the sizes span less than a factor 1.5 (no slope to fit)."""
  if min(sizes) * 1.5 > max(sizes):
    return None
  slopes = [
    (seconds[j] - seconds[i]) / (sizes[j] - sizes[i])
    for i in range(len(sizes))
    for j in range(i + 1, len(sizes))
    if sizes[j] != sizes[i]
  ]
  slope = max(0.0, statistics.median(slopes))
  fixed = max(0.0, statistics.median([t - slope * n for n, t in zip(sizes, seconds)]))
  return fixed, slope


def _line_through(fixed, sizes, seconds):
  """(fixed, per element): the median cost per element beyond a given fixed cost."""
  return fixed, statistics.median([(t - fixed) / n for n, t in zip(sizes, seconds)])


def _total(line, sizes):
  fixed, slope = line
  return sum(fixed + slope * n for n in sizes)

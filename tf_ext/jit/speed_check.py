"""Whether XLA actually makes a function faster, measured on its own calls.

XLA is not always faster: on some CPUs its code for a model is slower than TensorFlow's own
kernels, and a short run may never earn back a compilation. So once a tf_ext.jit.function has a
ready executable, it runs a few calls each way, interleaved (so that both see the same machine
load), and compares their median times per element (the product of the padded dimensions' sizes).
Two verdicts come out of one check:
  * run compiled?   compiled time per true element <= uncompiled time per element: the padding
                    of today's buckets included, which way is faster now;
  * keep compiling? compiled time per padded element <= uncompiled time per element: is XLA's
                    code faster at all; if not, better buckets cannot help, so no new bucket is
                    compiled (the executables already made still run where they win).
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
    self.last = None  # medians of the last check, seconds: {"compiled", "padded", "uncompiled"}
    self._calls = 0  # calls that could have run compiled
    self._next_check = settle_calls
    self._reset_samples()

  def _reset_samples(self):
    self._compiled, self._padded, self._uncompiled = [], [], []

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
    """A call that run_compiled() chose, its time, its true and padded element counts. Returns
    True when this call completed a check (the verdicts are new), else False."""
    if not self.checking or elements <= 0:
      return False
    if compiled:
      self._compiled.append(seconds / elements)
      self._padded.append(seconds / padded_elements)
    else:
      self._uncompiled.append(seconds / elements)
    if min(len(self._compiled), len(self._uncompiled)) < self.samples:
      return False
    self.last = {
      "compiled": statistics.median(self._compiled),
      "padded": statistics.median(self._padded),
      "uncompiled": statistics.median(self._uncompiled),
    }
    bound = self.last["uncompiled"] * (1.0 + self.margin)
    self.compiled_faster = self.last["compiled"] <= bound
    self.xla_faster = self.last["padded"] <= bound
    self._reset_samples()
    self._next_check = self._calls + self.recheck_every
    return True

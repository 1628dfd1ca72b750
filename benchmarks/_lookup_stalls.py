"""Lookup stalls while a table works (eviction.py, bulk_insert.py): back-to-back lookups in
another thread, timed one by one, and the windows in which the work ran. Imported as
`_lookup_stalls` (the scripts run from this folder)."""

import statistics
import threading
import time


class LookupLoop:
  """Back-to-back lookups in another thread, each recorded as (start, latency)."""

  def __init__(self, lookup, batches):
    self._lookup, self._batches = lookup, batches
    self._stop = threading.Event()
    self.records = []
    self._thread = threading.Thread(target=self._run, name="lookups", daemon=True)

  def _run(self):
    while not self._stop.is_set():
      for ids in self._batches:
        begin = time.perf_counter()
        self._lookup(ids)
        self.records.append((begin, time.perf_counter() - begin))

  def __enter__(self):
    self._thread.start()
    time.sleep(0.2)  # running before the first window
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()

  def window(self):
    """Times a window: `with loop.window() as w: ...`; w.latencies() after it."""
    return _Window(self)


class _Window:
  def __init__(self, loop):
    self._loop = loop

  def __enter__(self):
    self.begin = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.end = time.perf_counter()
    time.sleep(0.2)  # a gap, so that a lookup seldom overlaps two windows

  def latencies(self):
    """Latencies of the lookups that ran, at least partly, within the window."""
    return [
      lat for start, lat in self._loop.records if start < self.end and start + lat > self.begin
    ]


def summarize_windows(windows, target_ms):
  """Latency figures (ms) of a kind of window over the repeats; lookups over target_ms counted."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  every = [lat for w in windows for lat in w]
  longest = [max(w) * 1e3 for w in windows if w]
  p99 = float(np.percentile(np.asarray(every), 99)) * 1e3 if every else float("nan")
  return {
    "lookups": len(every),
    "median_ms": statistics.median(every) * 1e3 if every else float("nan"),
    "p99_ms": p99,
    "longest_ms": max(longest) if longest else float("nan"),
    "longest_per_window_ms": longest,
    "median_longest_ms": statistics.median(longest) if longest else float("nan"),
    "over_target": sum(lat * 1e3 > target_ms for lat in every),
  }


def busy_one_core(seconds):
  """A control window's work: one core busy for `seconds`, no table work (numpy's sort runs
  without the GIL, as a table op does)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  data = np.random.default_rng(1).random(1 << 20)
  end = time.perf_counter() + seconds
  while time.perf_counter() < end:
    np.sort(data)

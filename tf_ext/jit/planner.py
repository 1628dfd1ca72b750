"""The bucket planner shared by tf_ext.jit.function (TF2) and tf_ext.jit.Bucketing (TF1 input
pipelines): observed sizes per group of padded dimensions, the plan in force, and when to grow or
replace it. Pure Python; the optimal-boundary arithmetic is tf_ext.jit.buckets.

The schedule (documented for users in tf_ext/jit/function.py): no plan before
`min_observations` observations; then one bucket shape (the largest sizes seen, rounded up);
each time the observations double (and the compiler is idle, and the owner allows it) the plan
grows by the boundary that cuts the padded work most, if it cuts at least `min_gain` of the
unpadded work, up to `max_buckets` shapes, or is replaced by the optimal plan of as many shapes if
that cuts the padded work by `replan_gain`; a size above the plan extends it at once, or, where
growing waits (`may_grow` False), once growing may or after `min_observations` such calls.
"""

import json
import math
import os

from tf_ext.jit import buckets as bucket_lib
from tf_ext.jit import options as options_lib

PLAN_VERSION = 1


class Planner:
  """Plans for groups of padded dimensions (a tuple of dimension names, e.g. ("batch", "seq")).
  `on_plan(dims, boundaries, reason)` is told of every new plan. `options`: tf_ext.jit options
  (tf_ext/jit/options.py; the planner reads max_buckets, max_size, min_observations, min_gain and
  replan_gain, the others are its owner's). Not thread-safe: the owner holds its own lock around
  calls."""

  def __init__(self, on_plan, **options):
    options_lib.check(options, "tf_ext.jit.planner.Planner")
    self._on_plan = on_plan
    self.max_buckets = options_lib.value("max_buckets", options.get("max_buckets"))
    max_size = options.get("max_size")
    if isinstance(max_size, dict):
      self._max_sizes = {d: options_lib.value("max_size", v) for d, v in max_size.items()}
      self._default_max_size = options_lib.value("max_size")
    else:
      self._max_sizes = {}
      self._default_max_size = options_lib.value("max_size", max_size)
    self.min_observations = options_lib.value("min_observations", options.get("min_observations"))
    self.min_gain = options_lib.value("min_gain", options.get("min_gain"))
    self.replan_gain = options_lib.value("replan_gain", options.get("replan_gain"))
    self.joint = {}  # dims -> joint histogram {sizes tuple: count}
    self.plans = {}  # dims -> boundaries per dimension
    self._next_check = {}  # dims -> observation count at which to consider growing
    self._deferred_extensions = {}  # dims -> calls above the plan not yet extended for

  def options(self):
    """The options the planner reads, as it read them: to make a planner like this one."""
    return dict(
      max_buckets=self.max_buckets,
      max_size=dict(self._max_sizes) or self._default_max_size,
      min_observations=self.min_observations,
      min_gain=self.min_gain,
      replan_gain=self.replan_gain,
    )

  def max_size_of(self, dim):
    return self._max_sizes.get(dim, self._default_max_size)

  def largest_max_size(self):
    return max([self._default_max_size, *self._max_sizes.values()])

  def observe(self, dims, sizes):
    if not dims:
      return
    joint = self.joint.setdefault(dims, {})
    joint[sizes] = joint.get(sizes, 0) + 1

  def maybe_plan(self, dims, sizes, compiler_busy=False, may_grow=True):
    """The plan for `dims` after observing `sizes`: None before the first plan. Growing or
    replanning, which only saves padding, waits while `may_grow` is False (asked again at the
    next call); so does extending for a size above the plan, for at most `min_observations`
    such calls (which meanwhile have no bucket)."""
    if not dims:
      return ()
    plan = self.plans.get(dims)
    seen = sum(self.joint.get(dims, {}).values())
    if plan is None:
      if seen >= self.min_observations:
        # One bucket shape to start: every call runs compiled after a single compilation.
        joint = self.joint[dims]
        first = tuple(
          (self.round_up(max(sizes[d] for sizes in joint), dims[d]),) for d in range(len(dims))
        )
        self.plans[dims] = first
        self._next_check[dims] = 2 * seen
        self._on_plan(dims, first, "first plan")
        return first
      return None
    if any(n > bounds[-1] for n, bounds in zip(sizes, plan)):
      # Where growing waits (for the owner's verdict on XLA's speed), so does an extension, but
      # for at most min_observations calls above the plan: were none of the calls to fit the
      # plan, no verdict could come.
      deferred = self._deferred_extensions.get(dims, 0)
      if may_grow or deferred >= self.min_observations:
        self._deferred_extensions[dims] = 0
        return self._extend(dims, plan, sizes)
      self._deferred_extensions[dims] = deferred + 1
      return plan
    if seen >= self._next_check.get(dims, 0) and not compiler_busy and may_grow:
      # Each time the calls seen double (the run has proven that long again), one more
      # bucket if it pays; a distribution that moved gets a new plan.
      self._next_check[dims] = 2 * seen
      replanned = self.make_plan(dims, force=False, reason="replan")
      if replanned != plan:
        return replanned
      grown = bucket_lib.grow(self.joint[dims], plan, self.max_buckets, self.min_gain)
      if grown != plan:
        self.plans[dims] = grown
        self._on_plan(dims, grown, f"grown after {seen} calls")
      return grown
    return plan

  def _extend(self, dims, plan, sizes):
    """A size above the plan: a new top boundary (with a little headroom), added if the bucket
    budget allows, else replacing the old top (whose executable still serves smaller sizes)."""
    new = [tuple(b) for b in plan]
    for d, n in enumerate(sizes):
      if n > new[d][-1]:
        top = self.round_up(n, dims[d])
        grown = math.prod(len(b) for b in new) // len(new[d]) * (len(new[d]) + 1)
        new[d] = new[d] + (top,) if grown <= self.max_buckets else new[d][:-1] + (top,)
    new = tuple(new)
    self.plans[dims] = new
    self._on_plan(dims, new, f"size {sizes} above the plan")
    return new

  def round_up(self, n, dim):
    """A top boundary for size n with headroom (so that the next larger size seen does not
    need a new executable): n rounded up to a multiple of 1/8 of its power of two (500 -> 512,
    200 -> 208), at most the dimension's maximum size."""
    step = 2 ** max(0, int(math.floor(math.log2(max(n, 1)))) - 3)
    return min(self.max_size_of(dim), int(math.ceil(n / step)) * step)

  def make_plan(self, dims, force, reason):
    joint = self.joint.get(dims)
    if not joint:
      return self.plans.get(dims)
    old = self.plans.get(dims)
    budget = self.max_buckets
    if old is not None and not force:  # as many bucket shapes as now: has the histogram moved?
      budget = min(budget, math.prod(len(b) for b in old))
    new = bucket_lib.plan(joint, len(dims), budget, 0.0 if not force else self.min_gain)
    if old is not None:  # keep compiled boundaries that are close (at most 1/8 larger)
      new = tuple(
        tuple(sorted({min((o for o in ob if b <= o <= b * 1.125), default=b) for b in nb}))
        for nb, ob in zip(new, old)
      )
    if old is not None and not force:
      old_cost = bucket_lib.joint_cost(joint, old)
      new_cost = bucket_lib.joint_cost(joint, new)
      work = sum(c * math.prod(s) for s, c in joint.items()) or 1
      if new == old or (old_cost - new_cost) / work < self.replan_gain:
        return old
    self.plans[dims] = new
    self._next_check.setdefault(dims, 2 * sum(joint.values()))
    self._on_plan(dims, new, reason)
    return new

  def replan(self):
    for dims in list(self.joint):
      self.make_plan(dims, force=True, reason="replan (requested)")

  # -- persistence: the JSON of a saved plan ----------------------------------------------------

  def to_json(self, owner, buckets_in_use):
    """`buckets_in_use(dims)`: the bucket tuples in use for dims, most recently used first."""
    entries = []
    for dims, plan in self.plans.items():
      joint = self.joint.get(dims, {})
      entries.append(
        {
          "dims": list(dims),
          "boundaries": [list(b) for b in plan],
          "histogram": [list(k) + [c] for k, c in sorted(joint.items())],
          "buckets": [list(b) for b in buckets_in_use(dims)],
        }
      )
    return {"version": PLAN_VERSION, "function": owner, "plans": entries}

  def load_json(self, data, path):
    """Takes the plans of `data` (from to_json); returns {dims: bucket tuples in use}."""
    if data.get("version") != PLAN_VERSION:
      raise ValueError(f"{path}: plan version {data.get('version')}, expected {PLAN_VERSION}")
    warm = {}
    for entry in data["plans"]:
      dims = tuple(entry["dims"])
      plan = tuple(tuple(int(b) for b in bounds) for bounds in entry["boundaries"])
      if len(plan) != len(dims):
        raise ValueError(f"{path}: {len(plan)} boundary lists for dims {dims}")
      joint = {tuple(int(v) for v in row[:-1]): int(row[-1]) for row in entry["histogram"]}
      self.plans[dims] = plan
      self.joint[dims] = joint
      self._next_check[dims] = max(2 * sum(joint.values()), self.min_observations)
      warm[dims] = [tuple(int(v) for v in b) for b in entry["buckets"]]
      self._on_plan(dims, plan, f"warm restart from {path}")
    return warm


def plan_file(path, name):
  """Where a plan named `name` lives for a user's `plan_path`, the one rule of tf_ext.jit.function
  and Bucketing: a .json path or an existing file is the file itself; anything else is a
  directory (made when the plan is first written; e.g. a model_dir not made yet) that gets
  tf_ext_jit_plan.<name>.json."""
  path = os.fspath(path)
  if path.endswith(".json") or os.path.isfile(path):
    return path
  return os.path.join(path, f"tf_ext_jit_plan.{name}.json")


def read_json(path):
  """A saved plan's JSON, or None where there is none yet (a first run)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_json_atomically(path, data):
  """Readers (a restarting job) see the old file or the new one, never half of one."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(data, f)
  os.replace(tmp, path)

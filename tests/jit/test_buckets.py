"""tf_ext.jit.buckets: the bucket planning (pure Python): exact optimal boundaries, the bucket
budget across dimensions, the gain threshold, geometric defaults; and when the planner may grow a
plan."""

import itertools
import math
import random

import pytest

from tf_ext.jit import buckets
from tf_ext.jit.planner import Planner


def brute_force(histogram, k):
  sizes = sorted(histogram)
  best = math.inf
  for m in range(1, k + 1):
    for chosen in itertools.combinations(sizes[:-1], m - 1):
      best = min(best, buckets.padding_cost(histogram, tuple(chosen) + (sizes[-1],)))
  return best


@pytest.mark.parametrize("seed", range(8))
def test_optimal_boundaries_match_brute_force(seed):
  rng = random.Random(seed)
  histogram = {rng.randint(1, 200): rng.randint(1, 50) for _ in range(rng.randint(1, 9))}
  for k in range(1, 5):
    boundaries = buckets.optimal_boundaries(histogram, k)
    assert len(boundaries) <= k
    assert list(boundaries) == sorted(set(boundaries))
    assert boundaries[-1] == max(histogram)  # the largest size always fits
    assert buckets.padding_cost(histogram, boundaries) == brute_force(histogram, k)


def test_optimal_boundaries_edges():
  assert buckets.optimal_boundaries({7: 3}, 4) == (7,)
  assert buckets.optimal_boundaries({1: 1, 2: 1, 3: 1}, 5) == (1, 2, 3)
  assert buckets.optimal_boundaries({1: 1, 100: 1}, 1) == (100,)
  # Mass at 10 and 100: two buckets put the boundary at 10.
  assert buckets.optimal_boundaries({9: 5, 10: 100, 90: 1, 100: 100}, 2) == (10, 100)
  with pytest.raises(ValueError):
    buckets.optimal_boundaries({}, 2)
  with pytest.raises(ValueError):
    buckets.optimal_boundaries({3: 1}, 0)


def test_bucket_of_and_costs():
  assert buckets.bucket_of(5, (4, 8, 16)) == 8
  assert buckets.bucket_of(8, (4, 8, 16)) == 8
  assert buckets.bucket_of(17, (4, 8, 16)) is None
  assert buckets.padding_cost({3: 2, 8: 1}, (8,)) == 10
  assert buckets.padding_cost({9: 1}, (8,)) == math.inf
  assert buckets.joint_cost({(3, 5): 2}, [(4,), (5,)]) == 2 * (20 - 15)
  assert buckets.marginals({(1, 2): 3, (1, 4): 1}, 2) == ({1: 4}, {2: 3, 4: 1})


def test_plan_respects_the_bucket_budget_across_dimensions():
  rng = random.Random(0)
  joint = {}
  for _ in range(2000):
    key = (rng.randint(1, 64), rng.randint(1, 200))
    joint[key] = joint.get(key, 0) + 1
  for budget in (1, 2, 4, 6, 8):
    plan = buckets.plan(joint, 2, budget, min_gain=0.0)
    assert math.prod(len(b) for b in plan) <= budget
    assert plan[0][-1] == max(k[0] for k in joint) and plan[1][-1] == max(k[1] for k in joint)
  # More buckets never pad more.
  costs = [buckets.joint_cost(joint, buckets.plan(joint, 2, b, 0.0)) for b in (1, 2, 4, 8)]
  assert costs == sorted(costs, reverse=True) and costs[-1] < costs[0]


def test_min_gain_trades_padding_against_executables():
  uniform = {(n,): 1 for n in range(1, 257)}
  assert buckets.plan(uniform, 1, 8, min_gain=10.0) == ((256,),)  # nothing is worth a bucket
  many = buckets.plan(uniform, 1, 8, min_gain=0.0)
  assert len(many[0]) == 8
  some = buckets.plan(uniform, 1, 8, min_gain=0.05)
  assert 1 < len(some[0]) < 8
  # One size only: one bucket, exactly that size, whatever the budget.
  assert buckets.plan({(32,): 100}, 1, 8) == ((32,),)
  assert buckets.plan({}, 0, 8) == ()


def test_geometric_boundaries():
  assert buckets.geometric_boundaries(100) == (8, 16, 32, 64, 100)
  assert buckets.geometric_boundaries(8) == (8,)
  assert buckets.geometric_boundaries(5) == (5,)
  assert buckets.geometric_boundaries(20, smallest=4, ratio=1.5) == (4, 6, 9, 14, 20)
  with pytest.raises(ValueError):
    buckets.geometric_boundaries(10, ratio=1.0)


def test_grow_adds_one_boundary_and_keeps_the_others():
  joint = {(n,): 1 for n in range(1, 101)}
  grown = buckets.grow(joint, [(100,)], max_buckets=8, min_gain=0.01)
  assert len(grown[0]) == 2 and grown[0][-1] == 100 and 40 <= grown[0][0] <= 60
  again = buckets.grow(joint, grown, max_buckets=8, min_gain=0.01)
  assert len(again[0]) == 3 and set(grown[0]) <= set(again[0])  # compiled buckets stay
  assert buckets.grow(joint, [(100,)], max_buckets=1) == ((100,),)  # the budget is full
  assert buckets.grow(joint, [(100,)], max_buckets=8, min_gain=0.9) == ((100,),)  # not worth it
  # Two dimensions: the boundary goes where it cuts most work (the long, varying one).
  joint2 = {(128, n): 1 for n in range(1, 201)}
  assert buckets.grow(joint2, [(128,), (200,)], max_buckets=8)[0] == (128,)
  assert len(buckets.grow(joint2, [(128,), (200,)], max_buckets=8)[1]) == 2


def test_the_planner_grows_only_when_its_owner_allows():
  plans = []
  planner = Planner(lambda dims, plan, reason: plans.append((plan, reason)), min_observations=4)
  planner.max_buckets, planner.min_gain = 4, 0.0
  dims, sizes = ("batch",), [2, 8, 2, 8]

  def call(n, **rule):
    planner.observe(dims, (n,))
    return planner.maybe_plan(dims, (n,), **rule)

  for n in sizes:
    call(n)
  assert plans == [(((8,),), "first plan")]
  # The calls double (8 seen): growing is due, but waits while the owner says it may not.
  for n in sizes * 2:
    assert call(n, may_grow=False) == ((8,),)
  # Still due (not postponed to the next doubling while held): grows at the first call allowed.
  assert call(2) == ((2, 8),) and plans[-1][1] == "grown after 13 calls"


def test_a_size_above_the_plan_waits_as_growing_does_but_not_forever():
  plans = []
  planner = Planner(lambda dims, plan, reason: plans.append((plan, reason)), min_observations=4)
  dims = ("batch",)

  def call(n, **rule):
    planner.observe(dims, (n,))
    return planner.maybe_plan(dims, (n,), **rule)

  for n in [2, 8, 2, 8]:
    call(n)
  assert plans == [(((8,),), "first plan")]
  # While the owner holds growing back (no verdict on XLA's speed yet), a larger size waits too.
  for _ in range(3):
    assert call(12, may_grow=False) == ((8,),)
  assert call(2, may_grow=False) == ((8,),) and len(plans) == 1
  # Allowed: the next larger size extends the plan at once.
  assert call(12) == ((8, 12),) and plans[-1] == (((8, 12),), "size (12,) above the plan")
  # Held back for good (e.g. no call fits the plan, so no verdict comes): after min_observations
  # calls above the plan, it extends anyway.
  for _ in range(4):
    assert call(40, may_grow=False) == ((8, 12),)
  assert call(40, may_grow=False) == ((8, 12, 40),) and len(plans) == 3

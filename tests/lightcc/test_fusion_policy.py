"""The adaptive fusion policy and the bucketing, without ranks (pure Python)."""

from tf_ext.lightcc.fusion import FusionPolicy, buckets_in_backprop_order


def _drive(policy, step_time_of, steps):
  choice = policy.current
  for _ in range(steps):
    choice = policy.observe(step_time_of(choice))
  return choice


def test_explores_every_candidate_then_keeps_the_fastest():
  times = {0: 1.0, 1: 0.6, 2: 0.8, 3: 0.9}
  policy = FusionPolicy(4, probe_steps=3, reprobe_steps=0)
  assert _drive(policy, times.get, 12) == 1
  assert set(policy.medians) == {0, 1, 2, 3}
  assert _drive(policy, times.get, 50) == 1  # stays: no re-probing configured


def test_first_step_after_a_switch_is_not_counted():
  policy = FusionPolicy(2, probe_steps=3, reprobe_steps=0)
  slow_first = iter([9.0, 1.0, 1.0, 9.0, 2.0, 2.0])
  _drive(policy, lambda _: next(slow_first), 6)
  assert policy.medians == {0: 1.0, 1: 2.0} and policy.current == 0


def test_reprobes_neighbours_and_follows_a_change():
  times = {0: 1.0, 1: 0.5, 2: 0.8}
  policy = FusionPolicy(3, probe_steps=2, reprobe_steps=10)
  assert _drive(policy, lambda c: times[c], 6) == 1
  times[2] = 0.2  # the network got faster for large buckets
  choice = _drive(policy, lambda c: times[c], 10 + 3 * 2)
  assert choice == 2


def test_buckets_follow_backprop_order_and_size():
  sizes = [10, 10, 10, 30, 5]
  assert buckets_in_backprop_order(sizes, 20) == [[4], [3], [2, 1], [0]]  # 30 fills one alone
  assert buckets_in_backprop_order(sizes, 1000) == [[4, 3, 2, 1, 0]]
  assert buckets_in_backprop_order(sizes, 1) == [[4], [3], [2], [1], [0]]

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


def test_candidates_take_turns_and_the_first_round_is_not_counted():
  policy = FusionPolicy(2, probe_steps=3, reprobe_steps=0)
  ran = []
  times = iter([9.0, 9.0, 1.0, 2.0, 1.0, 2.0])

  def step_time(choice):
    ran.append(choice)
    return next(times)

  _drive(policy, step_time, 6)
  assert ran == [0, 1, 0, 1, 0, 1]
  assert policy.medians == {0: 1.0, 1: 2.0} and policy.current == 0


def test_a_load_that_grows_while_probing_does_not_pick_the_first_candidate():
  # Candidate 1 is 5 % faster, but every step is 3 % slower than the one before: probing one
  # candidate after the other would see candidate 0 fastest because it ran first.
  # The two end within 3 % of each other, so they are refined (10 more steps).
  policy = FusionPolicy(2, probe_steps=5, reprobe_steps=0)
  steps = iter(range(100))
  assert _drive(policy, lambda c: (1.0 - 0.05 * c) * 1.03 ** next(steps), 20) == 1


def test_close_candidates_are_probed_again_before_the_choice():
  # The first probe's counted steps make candidate 1 look 1 % faster than 0, within 3 %; 2 is far
  # behind. 0 and 1 then take turns for 3 more rounds, all counted, and the medians over both
  # probes (0: 1.0 x 5, 1: 0.99 0.99 1.05 1.05 1.05) choose 0.
  policy = FusionPolicy(3, probe_steps=3, reprobe_steps=0)
  ran = []
  first_probe = [9.0, 9.0, 9.0, 1.0, 0.99, 2.0, 1.0, 0.99, 2.0]
  times = iter(first_probe + [1.0, 1.05] * 3)

  def step_time(choice):
    ran.append(choice)
    return next(times)

  assert _drive(policy, step_time, 9 + 6) == 0
  assert ran == [0, 1, 2] * 3 + [0, 1] * 3
  assert policy.medians == {0: 1.0, 1: 1.05, 2: 2.0}
  assert len(ran) <= FusionPolicy.longest_probe(3, probe_steps=3)
  assert _drive(policy, lambda c: 1.0, 20) == 0  # decided: no more probing


def test_reprobes_neighbours_and_follows_a_change():
  times = {0: 1.0, 1: 0.5, 2: 0.8}
  policy = FusionPolicy(3, probe_steps=2, reprobe_steps=10)
  assert _drive(policy, lambda c: times[c], 6) == 1
  times[2] = 0.2  # the network got faster for large buckets
  choice = _drive(policy, lambda c: times[c], 10 + 3 * 2)
  assert choice == 2


def test_buckets_follow_backprop_order_and_size():
  sizes = [10, 10, 10, 30, 5]
  flat = {"tail_halvings": 0}
  assert buckets_in_backprop_order(sizes, 20, **flat) == [[4], [3], [2], [1, 0]]  # 30 alone
  assert buckets_in_backprop_order(sizes, 1000) == [[4, 3, 2, 1, 0]]
  assert buckets_in_backprop_order(sizes, 1) == [[4], [3], [2], [1], [0]]


def test_the_buckets_exchanged_last_are_smaller():
  # 16 tensors of 1 byte, buckets of 8: the bucket with the first layer (exchanged last) holds
  # 8 / 2**3 = 1, then 2, 4, and 8 for the rest, last layers first.
  assert buckets_in_backprop_order([1] * 16, 8) == [
    [15],
    [14, 13, 12, 11, 10, 9, 8, 7],
    [6, 5, 4, 3],
    [2, 1],
    [0],
  ]
  assert buckets_in_backprop_order([1] * 16, 8, tail_halvings=1) == [
    [15, 14, 13, 12],
    [11, 10, 9, 8, 7, 6, 5, 4],
    [3, 2, 1, 0],
  ]


def test_settles_after_the_probe_only_without_reprobes():
  times = {0: 1.0, 1: 0.6, 2: 0.8}
  once = FusionPolicy(3, probe_steps=2, reprobe_steps=0)
  assert not once.settled
  _drive(once, times.get, 6)
  assert once.settled and once.current == 1 and not once.frozen
  reprobing = FusionPolicy(3, probe_steps=2, reprobe_steps=4)
  _drive(reprobing, times.get, 6)
  assert reprobing.current == 1 and not reprobing.settled


def _drive_retraced(policy, times, steps):
  """LIGHT_FUSION_RETRACE=1: step n runs the graph of the index current when it was chosen
  (after step n-1), and at its start the policy is told step n-1's time, with step n-1's index.
  A candidate's graph is traced before its first step: that tracing falls in the step before
  (9.0), its first negotiation in its own first step (9.0), and both are untimed."""
  ran = [policy.current]  # step 0, whose time no one observes (the clock's first step)
  for _ in range(steps):
    ran.append(policy.current)
    untimed = ran[-1] not in ran[:-1] or ran[-2] not in ran[:-2]
    policy.observe(9.0 if untimed else times[ran[-2]], ran=ran[-2], untimed=untimed)
  return ran


def test_a_retraced_graph_one_step_behind_times_each_candidate_by_what_ran():
  # The probe ends once every candidate has its counted steps, with none of the tracing in them.
  times = {0: 1.0, 1: 0.6, 2: 0.8}
  policy = FusionPolicy(3, probe_steps=3, reprobe_steps=0)
  ran = _drive_retraced(policy, times, 16)
  assert ran[:6] == [0, 0, 1, 2, 0, 1] and policy.settled and policy.current == 1
  assert policy.medians == {0: 1.0, 1: 0.6, 2: 0.8}
  assert [index for _, index in policy.history] == ran[:-1]


def test_a_retraced_probe_whose_candidates_all_end_close_runs_its_choice_within_the_bound():
  times = {0: 1.0, 1: 0.99, 2: 1.01}  # all within 3 %: all refined
  policy = FusionPolicy(3, probe_steps=3, reprobe_steps=0)
  ran = _drive_retraced(policy, times, FusionPolicy.longest_probe(3, probe_steps=3) - 1)
  assert policy.settled and ran[-1] == policy.current == 1  # the choice runs by the last step


def test_a_step_of_a_candidate_no_longer_probed_does_not_stall_the_probe():
  # One step behind, the first step of a refinement still runs the last candidate of the probe
  # before it (2, not close to the others): its time is kept aside, it takes a turn, and 0 and 1
  # are refined.
  policy = FusionPolicy(3, probe_steps=2, reprobe_steps=0)
  for index, seconds in [(0, 9.0), (1, 9.0), (2, 9.0), (0, 1.0), (1, 1.01), (2, 3.0)]:
    policy.observe(seconds, ran=index)
  assert policy.current == 0 and not policy.settled  # refining 0 and 1
  policy.observe(3.0, ran=2)
  for index, seconds in [(1, 0.9), (0, 1.0), (1, 0.9), (0, 1.0)]:
    assert policy.current == index
    policy.observe(seconds, ran=index)
  assert policy.settled and policy.current == 1
  assert policy.medians == {0: 1.0, 1: 0.9, 2: 3.0}

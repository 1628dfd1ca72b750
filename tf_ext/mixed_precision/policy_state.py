"""The layout of the loss-aware policy's state, shared by the policy op's wrapper (policy.py) and
its XLA-compilable twin (xla_policy.py)."""

# The policy state's fields, in the order of PolicyState::ToArray (checked against the op by
# tests/mixed_precision/test_policy.py).
STATE_FIELDS = (
  "precision",
  "loss_scale",
  "finite_streak",
  "nonfinite_streak",
  "full_streak",
  "half_run",
  "return_after",
  "steps",
  "half_steps",
  "skipped_steps",
  "switches",
  "last_fallback",
  "loss_mean",
  "loss_variance",
  "losses_seen",
  "last_probe_error",
)
"""The names of the policy state's fields, in the order the policy op returns them."""
# Why the policy last fell back to full precision (the core's Fallback, by value).
FALLBACKS = ("none", "nonfinite_streak", "scale_floor", "nonfinite", "probe", "loss_spike")
"""Why the policy last fell back to full precision: the state's `last_fallback` indexes this."""

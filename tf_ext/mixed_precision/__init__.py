"""Loss-aware mixed precision: half precision where it is safe, full where it is not, per step.

`LossAwareOptimizer(optimizer, half=...)` wraps an optimizer; the op library's graph rewrite gives
each training step a half and a full version, and the `PrecisionPolicy` picks one per step from
the loss, the gradients and a precision probe. docs/mixed_precision.md documents the policy, the
op lists and the settings.
"""

from tf_ext.mixed_precision.optimizer import (
  HALF_CHOICES,
  STATE_COLLECTION,
  LossAwareGradientTape,
  LossAwareOptimizer,
  auto_half_dtype,
  policy_of,
  report,
)
from tf_ext.mixed_precision.policy import (
  PolicyConfig,
  PrecisionPolicy,
  config_from_settings,
)
from tf_ext.mixed_precision.policy_state import FALLBACKS, STATE_FIELDS
from tf_ext.mixed_precision.summaries import SummaryHook, TensorBoardCallback

__all__ = [
  "FALLBACKS",
  "HALF_CHOICES",
  "STATE_COLLECTION",
  "STATE_FIELDS",
  "LossAwareGradientTape",
  "LossAwareOptimizer",
  "PolicyConfig",
  "PrecisionPolicy",
  "SummaryHook",
  "TensorBoardCallback",
  "auto_half_dtype",
  "config_from_settings",
  "policy_of",
  "report",
]

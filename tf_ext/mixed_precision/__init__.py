"""Loss-aware mixed precision (in progress): half precision where it is safe, full where it is not.

Built so far: the policy that decides per step between half and full precision, the loss scale
and whether a step's update applies (`PrecisionPolicy`). The optimizer wrapper and the graph
rewrite that use it come next.
"""

from tf_ext.mixed_precision.policy import (
  FALLBACKS,
  STATE_FIELDS,
  PolicyConfig,
  PrecisionPolicy,
  config_from_settings,
)

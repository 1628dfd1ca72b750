"""Variables whose gradients are already exchanged between ranks when the backward pass ends.

The gradient of an all-to-all table's anchor (tf_ext/dynamic_embedding/alltoall.py) holds, on each
rank, the gradients that every rank sent it for the ids it owns, already summed over the ranks by
the backward all-to-all. A reduction over ranks must leave it out (an allgather would only add
traffic) and scale it as it scales the gradients it averages, so that the table and the dense
variables follow one loss: Horovod's DistributedOptimizer and DistributedGradientTape do both for
the variables registered as local (their `scale_local_gradients` divides by the number of ranks),
and tf_ext.lightcc's reduce stage does the same for marked variables.
"""

MARK = "_tf_ext_rank_local_gradient"


def mark(variable):
  """Marks `variable`'s gradient as rank-local."""
  setattr(variable, MARK, True)


def is_rank_local(variable):
  return bool(getattr(variable, MARK, False))


class _WithMarkedVariables(set):
  """A Horovod wrapper's set of local variables (or their refs) that also holds every marked
  variable, whenever it was created. `refusal`: why the wrapper cannot treat marked variables as
  their gradients need (raised when it asks about one), or None."""

  def __init__(self, current, refusal=None):
    super().__init__(current)
    self.refusal = refusal

  def __contains__(self, item):
    variable = item.deref() if hasattr(item, "deref") else item
    if is_rank_local(variable):
      if self.refusal:
        raise ValueError(self.refusal)
      return True
    return set.__contains__(self, item)

  def __len__(self):
    # Horovod scales local gradients only when its set is not empty.
    return max(1, set.__len__(self))


def _refusal(wrapper):
  """Why a Horovod wrapper cannot reduce with marked variables among its own, or None: their
  gradients must be scaled as it scales the gradients it averages. (With
  backward_passes_per_step > 1 Horovod itself refuses the IndexedSlices gradients of tables.)"""
  if getattr(wrapper, "scale_local_gradients", True) is not False:
    return None
  return (
    f"Horovod's {type(wrapper).__name__} with scale_local_gradients=False cannot train dynamic "
    "embedding tables split across ranks (distribution='alltoall'): their gradients arrive "
    "summed over the ranks and must be divided as Horovod averages the others; leave "
    "scale_local_gradients at True"
  )


def keep_local(wrapper):
  """Makes a Horovod DistributedOptimizer or DistributedGradientTape (or anything else) leave
  marked variables' gradients out of its reduction; returns `wrapper`. One whose settings cannot
  serve them raises a ValueError saying so when it meets a marked variable."""
  refusal = _refusal(wrapper)
  for attribute in ("_local_vars", "_local_sources"):
    current = getattr(wrapper, attribute, None)
    if isinstance(current, set) and not isinstance(current, _WithMarkedVariables):
      setattr(wrapper, attribute, _WithMarkedVariables(current, refusal))
  return wrapper

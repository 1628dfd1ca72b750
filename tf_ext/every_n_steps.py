"""Every N steps: the bookkeeping that tf_ext's periodic Keras callbacks and Session hooks share
(dynamic embedding's eviction and table statistics, mixed precision's summaries).

- `EveryNBatches`: a Keras callback whose `_run(step)` runs after every n-th training batch of
  `fit`, at the optimizer's iteration count.
- `EveryNStepsHook`: a SessionRunHook whose `_run(session, step)` runs after the first step and
  then after each step at least n global steps past the last run (the global step may jump, e.g.
  after a restore), at the global step the run left (read after it when a run may be due: the
  step fetched with the training op may be read before its increment); it counts its own steps
  where the graph has no global step.
"""

import tensorflow as tf


def check_every_n_steps(owner, value, name="every_n_steps"):
  """A clear error for a bad period (or another count that must be a positive int)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")


class EveryNBatches(tf.keras.callbacks.Callback):
  """Calls `_run(step)` after every `every_n_steps`-th training batch; `step` is `_step()`: the
  model's optimizer's iterations (the batches seen, for a model without one)."""

  def __init__(self, owner, every_n_steps):
    super().__init__()
    check_every_n_steps(owner, every_n_steps)
    self._every_n_steps = every_n_steps
    self._batches = 0

  def _step(self):
    optimizer = getattr(self.model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    return int(iterations.numpy()) if iterations is not None else self._batches

  def on_train_batch_end(self, batch, logs=None):
    del batch, logs
    self._batches += 1
    if self._batches % self._every_n_steps == 0:
      self._run(self._step())

  def _run(self, step):
    raise NotImplementedError


class EveryNStepsHook(tf.compat.v1.train.SessionRunHook):
  """Calls `_run(session, step)` after a step when no run happened yet or the step is at least
  `every_n_steps` past the last one. Steps are the global step (`_global_step()`), or the hook's
  own count of steps where that is None. Subclasses that extend `begin` call it."""

  def __init__(self, owner, every_n_steps):
    check_every_n_steps(owner, every_n_steps)
    self._every_n_steps = every_n_steps
    self._last_step = None

  def _global_step(self):
    return tf.compat.v1.train.get_global_step()

  def begin(self):
    self._global_step_tensor = self._global_step()
    self._local_step = 0

  def before_run(self, run_context):
    del run_context
    if self._global_step_tensor is not None:
      return tf.compat.v1.train.SessionRunArgs(self._global_step_tensor)
    return None

  def after_run(self, run_context, run_values):
    self._local_step += 1
    if not self._has_work():
      return
    if self._global_step_tensor is None:
      step = self._local_step
    else:
      # The step fetched with the training op may be read before or after its increment: check
      # the step it is about to be, and read the real one for a run (as DeltaCheckpointHook).
      if not self._due(int(run_values.results) + 1):
        return
      step = int(run_context.session.run(self._global_step_tensor))
    if self._due(step):
      self._last_step = step
      self._run(run_context.session, step)

  def _due(self, step):
    return self._last_step is None or step - self._last_step >= self._every_n_steps

  def _has_work(self):
    """False while there is nothing to run (e.g. no tables): the period starts at the first run."""
    return True

  def _run(self, session, step):
    raise NotImplementedError

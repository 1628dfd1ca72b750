"""Every N steps: the bookkeeping that tf_ext's periodic Keras callbacks and Session hooks share
(dynamic embedding's eviction, table statistics and delta checkpoints, mixed precision's
summaries).

- `EveryNBatches`: a Keras callback whose `_run(step)` runs after every n-th training batch of
  `fit`, at the optimizer's iteration count.
- `GlobalStepSchedule`: the schedule of every periodic SessionRunHook. The session's global step
  when it is created starts the schedule; after a run, the step fetched with it (which may be read
  before or after the training op's increment) + 1 says whether a run may be due, and then the
  step is read again: the hook runs at that step, the one the run left.
- `EveryNStepsHook`: a GlobalStepSchedule whose `_run(session, step)` runs once the global step is
  at least n past the session's start or its last run (the step may jump, e.g. after a restore);
  it counts its own steps where the graph has no global step.
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


class GlobalStepSchedule(tf.compat.v1.train.SessionRunHook):
  """Runs `_run_due(session, step)` after a session run when `_due(step)`, `step` being the global
  step that run left (`_global_step()`; the hook's own count of runs where that is None).
  `_start(session, step)` gets the step the session starts at. Subclasses that extend `begin`
  call it; `_has_work()` False makes the hook read nothing for the session."""

  def _global_step(self):
    return tf.compat.v1.train.get_global_step()

  def begin(self):
    self._global_step_tensor = self._global_step()

  def after_create_session(self, session, coord):
    del coord
    self._local_step = 0
    if self._has_work():
      self._start(session, self._read_step(session))

  def before_run(self, run_context):
    del run_context
    if self._global_step_tensor is not None and self._has_work():
      return tf.compat.v1.train.SessionRunArgs(self._global_step_tensor)
    return None

  def after_run(self, run_context, run_values):
    self._local_step += 1
    if not self._has_work():
      return
    # The step fetched with the run may be read before the training op's increment: the step it
    # is about to be says whether to read the real one (as TensorFlow's CheckpointSaverHook).
    if self._global_step_tensor is not None and not self._due(int(run_values.results) + 1):
      return
    step = self._read_step(run_context.session)
    if self._due(step):
      self._run_due(run_context.session, step)

  def _read_step(self, session):
    if self._global_step_tensor is None:
      return self._local_step
    return int(session.run(self._global_step_tensor))

  def _has_work(self):
    """False while there is nothing to run (e.g. no tables)."""
    return True

  def _start(self, session, step):
    raise NotImplementedError

  def _due(self, step):
    raise NotImplementedError

  def _run_due(self, session, step):
    raise NotImplementedError


class EveryNStepsHook(GlobalStepSchedule):
  """Calls `_run(session, step)` after a run that left the global step at least `every_n_steps`
  past the session's start or the last `_run`."""

  def __init__(self, owner, every_n_steps):
    check_every_n_steps(owner, every_n_steps)
    self._every_n_steps = every_n_steps
    self._last_step = None

  def _start(self, session, step):
    del session
    self._last_step = step

  def _due(self, step):
    return step - self._last_step >= self._every_n_steps

  def _run_due(self, session, step):
    self._last_step = step
    self._run(session, step)

  def _run(self, session, step):
    raise NotImplementedError

"""TFRA's `de.warm_start` and `de.WarmStartHook`: a program's Variables start from the rows another
program saved with tf.compat.v1.train.Saver (under the same names, or those of
`var_name_to_prev_var_name`), shard by shard."""

import tensorflow as tf

from tf_ext.dynamic_embedding import checkpoint
from tf_ext.dynamic_embedding.tfra import file_system
from tf_ext.dynamic_embedding.tfra import variable as variable_lib

__all__ = ["WarmStartHook", "warm_start"]


def _variables(vars_to_warm_start):
  """The Variables named: a regular expression (or a list of them) over the graph's
  GraphKeys.DYNAMIC_EMBEDDING_VARIABLES collection, or a list of Variables."""
  key = variable_lib.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES
  if vars_to_warm_start is None or isinstance(vars_to_warm_start, str):
    return tf.compat.v1.get_collection(key, scope=vars_to_warm_start)
  if isinstance(vars_to_warm_start, list):
    if all(isinstance(v, str) for v in vars_to_warm_start):
      return [v for scope in vars_to_warm_start for v in tf.compat.v1.get_collection(key, scope)]
    if all(isinstance(v, variable_lib.Variable) for v in vars_to_warm_start):
      return vars_to_warm_start
    raise ValueError(
      "If `vars_to_warm_start` is a list, it must be a `de.Variable` or `str`.  Given types are "
      f"{[type(v).__name__ for v in vars_to_warm_start]}"
    )
  raise ValueError(
    f"`vars_to_warm_start must be a `list` or `str`.  Given type is {type(vars_to_warm_start)}"
  )


def warm_start(ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_prev_var_name=None):
  """An op (eagerly: after running it) that fills the Variables of `vars_to_warm_start` from the
  checkpoint (a prefix, or a directory: its latest), each from the Variable of its previous name
  with the same number of tables; from a Variable saved with FileSystemSaver (its tables saved
  together), of any number of tables. A missing or damaged file is an error, and no table
  changes."""
  prefix = ckpt_to_initialize_from
  if tf.io.gfile.isdir(prefix):
    prefix = tf.train.latest_checkpoint(prefix)
    if prefix is None:
      raise ValueError(f"no checkpoint in {ckpt_to_initialize_from!r}")
  renames = var_name_to_prev_var_name or {}
  tables, groups = [], []
  for variable in _variables(vars_to_warm_start):
    previous = renames.get(variable.name, variable.name)
    group = file_system.group_name(previous)
    if tf.io.gfile.exists(prefix + checkpoint.snapshot_suffix(group)):
      groups.append((variable, group))
      continue
    for index, table in enumerate(variable.tables):
      tables.append((table, f"{group}_{index + 1}of{variable.shard_num}"))
  if not groups:
    return checkpoint.warm_start_tables(tables, prefix)
  # Every file is checked first: the groups', then warm_start_tables checks the tables'.
  checks = [file_system.restore_group(v, g, prefix, verify_only=True) for v, g in groups]
  with tf.control_dependencies(checks):
    restored = checkpoint.warm_start_tables(tables, prefix)
  with tf.control_dependencies([restored] if restored is not None else []):
    return tf.group([file_system.restore_group(v, g, prefix) for v, g in groups])


class WarmStartHook(tf.compat.v1.train.SessionRunHook):
  """warm_start for tf.estimator.Estimator and MonitoredTrainingSession: the restore runs once the
  session is created."""

  def __init__(self, ckpt_to_initialize_from, vars_to_warm_start, var_name_to_prev_var_name=None):
    self._ckpt_to_initialize_from = ckpt_to_initialize_from
    self._vars_to_warm_start = vars_to_warm_start
    self._var_name_to_prev_var_name = var_name_to_prev_var_name
    self._restore = None

  def begin(self):
    self._restore = warm_start(
      self._ckpt_to_initialize_from, self._vars_to_warm_start, self._var_name_to_prev_var_name
    )

  def after_create_session(self, session, coord):
    del coord
    session.run(self._restore)

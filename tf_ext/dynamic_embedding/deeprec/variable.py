"""get_embedding_variable: DeepRec's EmbeddingVariable as a tf_ext table, and its helpers.

The object returned is the tf_ext table itself (a DynamicEmbeddingVariable, or a
ShardedDynamicEmbeddingVariable for a partitioner), so tf_ext.DynamicEmbeddingOptimizer trains it,
tf.compat.v1.train.Saver and tf.train.Checkpoint save it, and tf_ext's hooks, callbacks and
lookups take it. What only DeepRec's API needs of it (the value of ids the filter has not
admitted, the key dtype asked for) is kept beside it, by table (`config_of`).
"""

import collections
import inspect
import math
import weakref

import tensorflow as tf

from tf_ext.dynamic_embedding import get_or_create, initializers, lifecycle, limits, live_tables
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.dynamic_embedding.deeprec import options
from tf_ext.dynamic_embedding.sharded import ShardedDynamicEmbeddingVariable

# DeepRec's key dtypes -> the table's: int32 ids are widened to int64 keys (same ids, same rows).
_KEY_DTYPES = {tf.int64: tf.int64, tf.int32: tf.int64, tf.string: tf.string}
# Partitioners are asked for the partitions of a [rows, dim] variable; an EmbeddingVariable has
# no row count, so two unbounded ones are asked, and the answer must not depend on it.
_PROBE_ROWS = (1 << 40, 1 << 50)
# TensorFlow's stddev correction of a normal truncated at two standard deviations.
_TRUNCATED_STDDEV = 0.87962566103423978
# DeepRec's default initializer, tf.compat.v1.truncated_normal_initializer(): mean 0, stddev 1.
_DEFAULT_INITIALIZER = initializers.InitializerSpec("truncated_normal", 0.0, 1.0, 0)

Config = collections.namedtuple(
  "Config",
  ["key_dtype", "filtered", "default_value_no_permission", "admission", "eviction", "initializer"],
)
"""What tf_ext.deeprec keeps of an EmbeddingVariable beside its table: the key dtype asked for
(int32 keys live as int64), whether a feature filter is on, the value read for ids it has not
admitted yet, and the table's admission and eviction policies and InitializerSpec."""

_configs = weakref.WeakKeyDictionary()


def config_of(table):
  """The Config of a table made by get_embedding_variable, or None."""
  try:
    return _configs.get(table)
  except TypeError:  # not weakly referenceable: not a table
    return None


def is_table(value):
  """Whether `value` is a tf_ext table (plain or sharded)."""
  return isinstance(value, (variable_lib.DynamicEmbeddingVariable, ShardedDynamicEmbeddingVariable))


def _not_offered(argument, instead):
  return NotImplementedError(f"tf_ext.deeprec: get_embedding_variable {argument}; {instead}")


def _check_unsupported(regularizer, collections, custom_getter, constraint, init_data_source):
  if regularizer is not None:
    raise _not_offered(
      "regularizer is not offered (a table has no dense tensor to regularize)",
      "add a penalty on the looked-up rows to the loss, e.g. tf.nn.l2_loss(emb)",
    )
  if collections is not None:
    raise _not_offered(
      "collections is not offered (a table is not a variable: tf.compat.v1.train.Saver saves it "
      "through GraphKeys.SAVEABLE_OBJECTS and optimizers train it through ev.gradient_anchor)",
      "add the table to your own collection with tf.compat.v1.add_to_collection(name, ev)",
    )
  if custom_getter is not None:
    raise _not_offered(
      "custom_getter is not offered", "wrap get_embedding_variable in your own function"
    )
  if constraint is not None:
    raise _not_offered(
      "constraint is not offered (updates of table rows are not projected)",
      "clip the looked-up rows, e.g. embedding_lookup(..., max_norm=...)",
    )
  if init_data_source is not None:
    raise _not_offered(
      "init_data_source is not offered",
      "restore the table with tf.compat.v1.train.Saver (or tf_ext.deeprec.Saver), or insert "
      "rows with ev.insert(keys, values)",
    )


def _num_shards(partitioner, embedding_dim):
  """The shards a partitioner asks for: the partitions along axis 0 of an unbounded variable."""
  if partitioner is None:
    return None
  if not callable(partitioner):
    raise ValueError(f"tf_ext.deeprec: partitioner must be callable, got {partitioner!r}")
  answers = []
  for rows in _PROBE_ROWS:
    parts = partitioner(shape=tf.TensorShape([rows, embedding_dim]), dtype=tf.float32)
    answers.append([int(p) for p in parts] if isinstance(parts, (list, tuple)) else parts)
  first = answers[0]
  if (
    answers[0] != answers[1]
    or not isinstance(first, list)
    or len(first) != 2
    or first[1] != 1
    or first[0] < 1
  ):
    raise ValueError(
      "tf_ext.deeprec: the partitioner must give a fixed number of partitions along axis 0 "
      f"whatever the row count (it gave {answers[0]!r} and {answers[1]!r} for unbounded "
      "variables); use tf.compat.v1.fixed_size_partitioner(num_shards)"
    )
  return first[0]


def _variance_scaling_spec(initializer, fan_in, fan_out):
  """The InitializerSpec of a variance-scaling initializer (glorot, he, lecun, VarianceScaling)
  for DeepRec's [default_value_dim, embedding_dim] matrix, or None for other initializers."""
  mode = getattr(initializer, "mode", None)
  scale = getattr(initializer, "scale", None)
  distribution = getattr(initializer, "distribution", None)
  if mode not in ("fan_in", "fan_out", "fan_avg") or not isinstance(scale, (int, float)):
    return None
  fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
  variance = float(scale) / max(1.0, fan)
  seed = int(getattr(initializer, "seed", None) or 0)
  if distribution == "uniform":
    limit = math.sqrt(3.0 * variance)
    return initializers.InitializerSpec("uniform", -limit, limit, seed)
  if distribution in ("truncated_normal", "normal"):  # TF1's "normal" is truncated
    return initializers.InitializerSpec(
      "truncated_normal", 0.0, math.sqrt(variance) / _TRUNCATED_STDDEV, seed
    )
  if distribution == "untruncated_normal":
    return initializers.InitializerSpec("normal", 0.0, math.sqrt(variance), seed)
  return None


def _initializer_spec(initializer, init_option, embedding_dim, name):
  chosen = initializer
  if init_option.initializer is not None:
    if initializer is not None:
      tf.compat.v1.logging.warning(
        "tf_ext.deeprec: '%s' is given two initializers; InitializerOption's is used", name
      )
    chosen = init_option.initializer
  if chosen is None:
    return _DEFAULT_INITIALIZER
  if inspect.isclass(chosen):  # tf.get_variable takes initializer classes, e.g. tf.ones_initializer
    chosen = chosen()
  scaled = _variance_scaling_spec(chosen, init_option.default_value_dim, embedding_dim)
  return scaled if scaled is not None else initializers.spec_from(chosen, embedding_dim, name)


def _as_dtype(value):
  try:
    return tf.as_dtype(value)
  except TypeError:
    return None


def _key_dtype(key_dtype):
  dtype = _as_dtype(key_dtype)
  if dtype not in _KEY_DTYPES:
    raise ValueError(
      f"tf_ext.deeprec: key_dtype must be tf.int64, tf.int32 or tf.string, got {key_dtype!r}"
    )
  return dtype


def get_embedding_variable(
  name,
  embedding_dim,
  key_dtype=tf.int64,
  value_dtype=None,
  initializer=None,
  regularizer=None,
  trainable=True,
  collections=None,
  caching_device=None,
  partitioner=None,
  validate_shape=True,
  custom_getter=None,
  constraint=None,
  steps_to_live=None,
  init_data_source=None,
  ev_option=None,
):
  """DeepRec's tf.get_embedding_variable: the tf_ext table `name` in the current variable scope.

  Gets or creates, as tf_ext.get_dynamic_embedding_variable does: a second call with the same
  name and the same options returns the same table; other options raise ValueError. The table
  is returned itself (for a partitioner, a ShardedDynamicEmbeddingVariable whose shards are
  `<name>/part_<i>`, as DeepRec names partitions). Look it up with tf_ext.deeprec's
  embedding_lookup, embedding_lookup_sparse or safe_embedding_lookup_sparse, and train it with
  tf_ext.DynamicEmbeddingOptimizer(optimizer).

  Args:
    name: the variable's name.
    embedding_dim: the row width, 1 to 4096.
    key_dtype: tf.int64, tf.int32 (held as int64 keys) or tf.string.
    value_dtype: None or tf.float32.
    initializer: an initializer object or class (tf.compat.v1 or Keras: zeros, ones, constant,
      random uniform, normal, truncated normal, and the variance-scaling ones: glorot, he,
      lecun), a number, or None: DeepRec's truncated_normal_initializer() (stddev 1). Rows are
      computed per id from (id, seed); seed None is 0.
    regularizer, collections, custom_getter, constraint, init_data_source: not offered
      (NotImplementedError, saying what to do instead).
    trainable: whether tf_ext.DynamicEmbeddingOptimizer updates it (a filter or steps_to_live
      needs it).
    caching_device, validate_shape: hints, accepted and unused (a table has no cached copy and
      no static row count).
    partitioner: e.g. tf.compat.v1.fixed_size_partitioner(n): a table of n shards.
    steps_to_live: DeepRec's older spelling of GlobalStepEvict(steps_to_live).
    ev_option: an EmbeddingVariableOption (None: the default one).

  Rows are created by their first training update (at the filter_freq-th with a filter) and
  evicted when tf_ext.deeprec.Saver saves, tf_ext.deeprec.evict() runs, or
  tf_ext.deeprec.EvictionHook fires: DeepRec evicts at every checkpoint save.
  """
  del caching_device, validate_shape  # hints
  if not isinstance(name, str) or not name:
    raise ValueError(f"tf_ext.deeprec: name must be a non-empty str, got {name!r}")
  if (
    not isinstance(embedding_dim, int)
    or isinstance(embedding_dim, bool)
    or not 1 <= embedding_dim <= limits.MAX_DIM
  ):
    raise ValueError(
      f"tf_ext.deeprec: embedding_dim must be an int in [1, {limits.MAX_DIM}], got "
      f"{embedding_dim!r}"
    )
  asked_key_dtype = _key_dtype(key_dtype)
  if value_dtype is not None and _as_dtype(value_dtype) != tf.float32:
    raise ValueError(
      f"tf_ext.deeprec: value_dtype must be tf.float32 (or None), got {value_dtype!r}"
    )
  _check_unsupported(regularizer, collections, custom_getter, constraint, init_data_source)
  resolved = options.resolve(ev_option, steps_to_live, trainable)
  spec = _initializer_spec(initializer, resolved.init, embedding_dim, name)
  num_shards = _num_shards(partitioner, embedding_dim)
  table = get_or_create.get_dynamic_embedding_variable(
    name,
    embedding_dim,
    key_dtype=_KEY_DTYPES[asked_key_dtype],
    initializer=spec,
    trainable=trainable,
    admission=resolved.admission,
    eviction=resolved.eviction,
    num_shards=num_shards,
  )
  config = Config(
    asked_key_dtype,
    resolved.filtered,
    resolved.default_value_no_permission,
    resolved.admission,
    resolved.eviction,
    spec,
  )
  known = _configs.get(table)
  if known is None:  # made by tf_ext itself, or just now: its policies must be the asked ones
    known = config._replace(
      admission=table.admission, eviction=table.eviction, initializer=table.initializer_spec
    )
  if known != config:
    raise ValueError(
      f"tf_ext.deeprec: EmbeddingVariable '{table.name}' exists with other options ({known}); "
      f"asked for {config}"
    )
  _configs[table] = config
  return table


def total_count(ev, name=None):
  """DeepRec's ev.total_count() (and get_dynamic_shape()): int64 [rows, embedding_dim].

  Rows are the ids the table holds: those trained, and admitted by the filter; an id only
  looked up, or still waiting for admission, has none (DeepRec counts the ids it tracks).
  """
  with tf.name_scope(name or f"{ev.name}_total_count"):
    return tf.stack([tf.cast(ev.size(), tf.int64), tf.constant(ev.dim, tf.int64)])


def export(ev, name=None):
  """DeepRec's ev.export(): (keys, values, versions, freqs) of every row.

  versions: each row's last update step (the global step the optimizer was given). freqs: its
  training updates since it was admitted, one per step that updates it; DeepRec counts every
  occurrence of the id in lookups instead. Keys of an int32 EmbeddingVariable come back int32.
  """
  keys, values, _, update_counts, last_steps, _ = ev.export_with_slots(name)
  config = config_of(ev)
  if config is not None and config.key_dtype == tf.int32:
    keys = tf.cast(keys, tf.int32)
  return keys, values, last_steps, update_counts


def evict(var_list=None, global_step=None, name=None):
  """Evicts the rows each table's policy condemns, as DeepRec does when it saves: int64 count.

  Tables: `var_list`, or every table of the graph (or of the eager context) that has an
  eviction policy. "Now" is `global_step` (default: the graph's global step, else each table's
  latest update step).
  """
  if var_list is None:
    tables = [t for t in live_tables.tables() if t.eviction is not None]
  else:
    tables = list(var_list)
    for table in tables:
      if not is_table(table):
        raise ValueError(f"tf_ext.deeprec.evict: var_list holds {table!r}, not a table")
    lifecycle.check_evictable("tf_ext.deeprec.evict", tables)
  if global_step is None and not tf.executing_eagerly():
    global_step = tf.compat.v1.train.get_global_step()
  with tf.name_scope(name or "deeprec_evict"):
    if not tables:
      return tf.constant(0, tf.int64)
    return tf.add_n([table.evict(global_step) for table in tables])


class Saver(tf.compat.v1.train.Saver):
  """tf.compat.v1.train.Saver that first evicts, as DeepRec's Saver does at every save.

  The eviction covers the tables with an eviction policy that exist when the Saver is built,
  at the global step of the save (tf_ext.deeprec.evict). Give it to MonitoredTrainingSession or
  Estimator through tf.compat.v1.train.Scaffold(saver=tf_ext.deeprec.Saver()).
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._deeprec_evict_op = None
    if not tf.executing_eagerly() and any(t.eviction is not None for t in live_tables.tables()):
      self._deeprec_evict_op = evict(name="deeprec_saver_evict")

  def save(self, sess, save_path, global_step=None, *args, **kwargs):
    """Evicts, then saves as tf.compat.v1.train.Saver.save does."""
    if self._deeprec_evict_op is not None:
      sess.run(self._deeprec_evict_op)
    return super().save(sess, save_path, global_step, *args, **kwargs)

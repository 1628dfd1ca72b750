"""Get-or-create of dynamic embedding tables by name, in the current variable scope: one table or
a sharded one (num_shards)."""

import threading
import weakref

import tensorflow as tf

from tf_ext.dynamic_embedding import alltoall, live_tables, sharded
from tf_ext.dynamic_embedding import variable as variable_lib

_registry_lock = threading.Lock()
# (graph, full name) -> table. Weak, so a table dropped by its user can be created afresh.
_registry = weakref.WeakValueDictionary()


def get_dynamic_embedding_variable(
  name,
  dim,
  key_dtype=tf.int64,
  value_dtype=tf.float32,
  initializer=None,
  trainable=True,
  gradient_anchor=None,
  admission=None,
  eviction=None,
  num_shards=None,
  distribution=None,
):
  """Returns the table named `name` in the current variable scope, creating it if needed.

  Args:
    name: the table's name; prefixed by the enclosing tf.compat.v1.variable_scope.
    dim: row width, 1 to 4096.
    key_dtype: tf.int64 or tf.string (exact keys, no hashing into buckets).
    value_dtype: tf.float32.
    initializer: initial rows of missing ids: None (normal, mean 0, stddev 0.001), "zeros",
      a number (constant), "uniform"/"normal"/"truncated_normal", or a TF/Keras initializer
      object (Zeros, Ones, Constant, RandomUniform, RandomNormal, TruncatedNormal) whose seed
      is used. Deterministic per id and seed.
    trainable: whether optimizers update it.
    admission: a tf_ext.FrequencyAdmission: ids get a row only at their min_count-th update.
    eviction: a tf_ext.EvictionPolicy: which rows `evict()` (and tf_ext.train.EvictionHook, the
      Keras callback tf_ext.keras.callbacks.TableEviction) removes.
    num_shards: None for one table; an int N >= 1 for a tf_ext.ShardedDynamicEmbeddingVariable
      of N shards split by id (tf_ext/dynamic_embedding/sharded.py), each placed by the active
      device function (e.g. replica_device_setter: round robin over the PS tasks); 1 gives a
      sharded table of one shard. gradient_anchor must then be None.
    distribution: None (the table lives in this process, or in its num_shards shards), or
      "alltoall": split across the Horovod ranks, each holding the ids it owns, looked up and
      trained through all-to-all exchanges (tf_ext/dynamic_embedding/alltoall.py). Needs
      hvd.init() (horovod.tensorflow or tf_ext.lightcc) first; not with num_shards (ValueError).

  An existing table is returned when its dim, dtypes, num_shards and distribution match;
  otherwise InvalidArgumentError.
  """
  scope = tf.compat.v1.get_variable_scope().name
  full_name = f"{scope}/{name}" if scope else name
  key = (live_tables.scope_key(), full_name)
  alltoall.check_distribution(full_name, distribution, num_shards)
  if num_shards is not None:
    sharded.check_num_shards(full_name, num_shards)
    if gradient_anchor is not None:
      raise variable_lib.invalid_argument(
        full_name, "a sharded table creates its shards' gradient anchors"
      )
  with _registry_lock:
    table = _registry.get(key)
    if table is not None:
      if getattr(table, "num_shards", None) != num_shards:
        raise variable_lib.invalid_argument(
          full_name,
          f"exists with num_shards {getattr(table, 'num_shards', None)}; asked for {num_shards}",
        )
      if getattr(table, "distribution", None) != distribution:
        raise variable_lib.invalid_argument(
          full_name,
          f"exists with distribution {getattr(table, 'distribution', None)!r}; asked for "
          f"{distribution!r}",
        )
      if table.dim != dim or table.key_dtype != tf.as_dtype(key_dtype):
        raise variable_lib.invalid_argument(
          full_name,
          f"exists with dim {table.dim} and key_dtype {table.key_dtype.name}; asked "
          f"for dim {dim} and key_dtype {tf.as_dtype(key_dtype).name}",
        )
      return table
    if num_shards is not None:
      table = sharded.ShardedDynamicEmbeddingVariable(
        full_name,
        dim,
        num_shards,
        key_dtype,
        value_dtype,
        initializer,
        trainable,
        admission=admission,
        eviction=eviction,
      )
      _registry[key] = table
      return table
    table_class = variable_lib.DynamicEmbeddingVariable
    if distribution == alltoall.ALLTOALL:
      table_class = alltoall.AllToAllDynamicEmbeddingVariable
    table = table_class(
      full_name,
      dim,
      key_dtype,
      value_dtype,
      initializer,
      trainable,
      gradient_anchor,
      admission=admission,
      eviction=eviction,
    )
    _registry[key] = table
    return table

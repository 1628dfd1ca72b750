"""ShardedDynamicEmbeddingVariable: one logical table split by id into shards, e.g. one per
parameter server.

- Routing: an id belongs to shard `TfExtShardOf(id, num_shards)` (kernels/dynamic_embedding/core/
  sharding.h), a fixed function of the id alone, independent of the tables' internal hashing.
  Lookups, inserts and removals partition the ids in the graph (tf.dynamic_partition), run each
  part colocated with its shard, and put the rows back in order (tf.dynamic_stitch).
- Placement: shard i's gradient anchor (a scalar variable) is created first, so the active device
  function places it (tf.compat.v1.train.replica_device_setter puts variables round robin on the
  PS tasks); the shard's table is then created colocated with its anchor. replica_device_setter
  places only the op types in its ps_ops list, which a table op is not: the anchor carries it.
- Training: each shard's lookups reach its own anchor, so tf_ext.DynamicEmbeddingOptimizer updates
  each shard with the ids of its part, colocated with the shard.
- Checkpoints: each shard streams its own snapshot file, and the table writes a manifest listing
  them where a plain table writes its file (checkpoint.py). A restore reads the manifest and the
  files it needs, keeping each shard's ids, so a checkpoint restores into any number of shards,
  and plain and sharded tables restore from each other's checkpoints.
"""

import warnings

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.trackable import base as trackable

from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import checkpoint, fusion_markers, lifecycle, limits
from tf_ext.dynamic_embedding import variable as variable_lib

MAX_SHARDS = limits.MAX_SHARDS


def shard_name(name, index):
  """The name of shard `index` of the sharded table `name` (as TensorFlow names partitions)."""
  return f"{name}/part_{index}"


def check_num_shards(name, num_shards):
  """num_shards as an int in [1, MAX_SHARDS]; InvalidArgumentError naming the table otherwise."""
  if isinstance(num_shards, bool) or not isinstance(num_shards, int):
    raise variable_lib.invalid_argument(
      name, f"num_shards must be a positive int or None, got {num_shards!r}"
    )
  if not 1 <= num_shards <= MAX_SHARDS:
    raise variable_lib.invalid_argument(
      name, f"num_shards must be in [1, {MAX_SHARDS}], got {num_shards}"
    )
  return num_shards


def shard_of(ids, num_shards):
  """The shard (int32, the shape of `ids`) of each int64 or string id among `num_shards`."""
  return _ops_loader.load().tf_ext_shard_of(ids, num_shards=num_shards)


def distinct_by_shard(ids, num_shards):
  """(distinct, positions, counts) of the 1-D int64 or string `ids`: the distinct ids grouped by
  shard (shard 0's first; each shard's in order of first occurrence), each id's index in
  `distinct` (int32), and each shard's number of distinct ids (int32 [num_shards])."""
  return _ops_loader.load().tf_ext_distinct_by_shard(ids, num_shards=num_shards)


def _colocated_with(variable):
  """Places what is created inside with `variable` (graph mode), or on its device (eager)."""
  if tf.executing_eagerly():
    return tf.device(variable.device)
  return ops.colocate_with(variable.op)


def _anchor(name, trainable):
  """A shard's gradient anchor. Always 0, so never saved: in a graph it is a local variable (out
  of tf.compat.v1.train.Saver's default list), so a checkpoint restores into more shards, whose
  anchors it cannot hold (ShardedTableSaveable saves one for the plain table of the same name)."""
  if tf.executing_eagerly():
    return tf.Variable(0.0, trainable=trainable, dtype=tf.float32, name=name)
  collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
  if trainable:
    collections.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
  return tf.compat.v1.Variable(
    0.0, trainable=trainable, dtype=tf.float32, name=name, collections=collections
  )


class ShardedDynamicEmbeddingVariable(
  variable_lib.TableFacts, trackable.Trackable, metaclass=variable_lib.ServedByName
):
  """A dynamic embedding table split by id into `num_shards` DynamicEmbeddingVariables.

  It has the table API of DynamicEmbeddingVariable (lookup, insert, remove, size, export, ...),
  so tf_ext.embedding_lookup, the feature columns and the Keras layer take it as they take a
  table. `shards` are the tables themselves, named `<name>/part_<i>`: hooks and callbacks that
  work on every table (eviction, delta checkpoints, statistics) see each shard. Create it with
  `tf_ext.get_dynamic_embedding_variable(..., num_shards=N)`.
  """

  _TF_EXT_SHARDED = True  # checkpoint.py's registered saver saves these, not their shards

  def __init__(
    self,
    name,
    dim,
    num_shards,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    initializer=None,
    trainable=True,
    gradient_anchors=None,
    admission=None,
    eviction=None,
  ):
    num_shards = check_num_shards(name, num_shards)
    if gradient_anchors is not None and len(gradient_anchors) != num_shards:
      raise variable_lib.invalid_argument(
        name, f"{len(gradient_anchors)} gradient anchors given for {num_shards} shards"
      )
    self._name = name
    # The shards' checks, with errors that name this table.
    variable_lib.DynamicEmbeddingVariable._validate(self, dim, key_dtype, value_dtype)  # pylint: disable=protected-access
    self._dim = dim
    self._key_dtype = tf.as_dtype(key_dtype)
    self._shards = []
    self._anchors = []
    with tf.init_scope():
      for index in range(num_shards):
        part = shard_name(name, index)
        anchor = gradient_anchors[index] if gradient_anchors else None
        if anchor is None:
          # Created first and alone, so that the device function places it (round robin over
          # the PS tasks for replica_device_setter); the shard's table follows it.
          with tf.compat.v1.name_scope(None):
            anchor = _anchor(f"{part}/gradient_anchor", trainable)
          # Tracked, so that tf.saved_model.save can export functions that look the table up.
          self._track_trackable(anchor, f"part_{index}_gradient_anchor")
        with _colocated_with(anchor):
          table = variable_lib.DynamicEmbeddingVariable(
            part,
            dim,
            key_dtype,
            value_dtype,
            initializer,
            trainable,
            gradient_anchor=anchor,
            admission=admission,
            eviction=eviction,
          )
        table._tf_ext_shard_of = name  # pylint: disable=protected-access
        self._shards.append(table)
        self._anchors.append(anchor)
        self._track_trackable(table, f"part_{index}")
      # (A serving export may replace the shards by tables of its own, saved their own way.)
      tables = all(isinstance(t, variable_lib.DynamicEmbeddingVariable) for t in self._shards)
      if tables and not tf.executing_eagerly():
        # One saveable for the whole table instead of one per shard: a checkpoint restores
        # into any number of shards (checkpoint.ShardedTableSaveable).
        saveables = ops.get_collection_ref(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        saveables[:] = [s for s in saveables if getattr(s, "op", None) not in self._shards]
        saveables.append(checkpoint.ShardedTableSaveable(self, name))
    self._warn_if_tasks_shared()

  def _gather_saveables_for_checkpoint(self):
    # One saveable for the whole table, as the default list has (the shards' graph is its own).
    graph = getattr(self._shards[0], "saver_graph", None)  # a serving export's stand-ins: none
    return checkpoint.saver_list_saveables(self, graph, checkpoint.ShardedTableSaveable)

  def _warn_if_tasks_shared(self):
    devices = [anchor.device for anchor in self._anchors]
    # Only devices of a cluster's tasks: unplaced (graph) and local (eager) shards are fine.
    tasks = {device for device in devices if "/job:" in device and "/job:localhost" not in device}
    if tasks and len(set(devices)) < len(self._shards):
      warnings.warn(
        f"dynamic embedding table '{self._name}': {len(self._shards)} shards on "
        f"{len(set(devices))} devices ({', '.join(sorted(set(devices)))}): several shards share "
        "a parameter-server task (more shards than PS tasks); it works, but those shards add no "
        "memory or bandwidth",
        UserWarning,
        stacklevel=3,
      )

  # ---- properties ---------------------------------------------------------------------------

  @property
  def num_shards(self):
    return len(self._shards)

  @property
  def shards(self):
    """The shards, DynamicEmbeddingVariables named `<name>/part_<i>`, in shard order."""
    return list(self._shards)

  @property
  def trainable(self):
    return self._shards[0].trainable

  @property
  def initializer_spec(self):
    return self._shards[0].initializer_spec

  @property
  def admission(self):
    return self._shards[0].admission

  @property
  def eviction(self):
    return self._shards[0].eviction

  @property
  def gradient_anchors(self):
    """The shards' gradient anchors: the variables an optimizer must see to train the table."""
    return list(self._anchors)

  @property
  def devices(self):
    """Each shard's device, in shard order."""
    return [shard.device for shard in self._shards]

  def __repr__(self):
    return (
      f"<tf_ext.ShardedDynamicEmbeddingVariable '{self._name}' dim={self._dim} "
      f"key_dtype={self._key_dtype.name} num_shards={len(self._shards)}>"
    )

  # ---- routing ------------------------------------------------------------------------------

  def _check_keys(self, keys, what="ids"):
    # The shards' check, with errors that name this table.
    return variable_lib.DynamicEmbeddingVariable._check_keys(self, keys, what)  # pylint: disable=protected-access

  def _partition(self, flat_keys, *others):
    """[per-shard keys], [per-shard positions in flat_keys], and each of `others` partitioned."""
    parts = shard_of(flat_keys, len(self._shards))
    n = len(self._shards)
    positions = tf.dynamic_partition(tf.range(tf.size(flat_keys)), parts, n)
    return (
      tf.dynamic_partition(flat_keys, parts, n),
      positions,
      *(tf.dynamic_partition(other, parts, n) for other in others),
    )

  def shard_of(self, ids):
    """Each id's shard (int32, the shape of ids)."""
    return shard_of(self._check_keys(ids), len(self._shards))

  # ---- table operations ---------------------------------------------------------------------

  def lookup(self, ids, name=None):
    """Rows for `ids` (any shape): float32 of shape ids.shape + [dim]; never inserts."""
    served = variable_lib.serving_replacement(self)
    if served is not None:  # tf_ext.saved_model.export_for_serving is tracing
      return served.lookup(ids, name)
    ids = self._check_keys(ids)
    with tf.name_scope(name or f"{self._name}_lookup"):
      if len(self._shards) == 1:
        return self._shards[0].lookup(ids)
      flat = tf.reshape(ids, [-1])
      keys, positions = self._partition(flat)
      # Each shard's rows are a field of their own for the embedding fusion pass (one row per id):
      # the shards' finds and updates fuse; the partition, stitch and combiner stay.
      rows = [
        fusion_markers.marked_rows(shard, shard.lookup(part))
        for shard, part in zip(self._shards, keys)
      ]
      stitched = tf.dynamic_stitch(positions, rows)
      out = tf.reshape(stitched, tf.concat([tf.shape(ids), [self._dim]], 0))
      out.set_shape(ids.shape.concatenate([self._dim]))
      return out

  def insert(self, keys, values, name=None):
    """Sets the rows of `keys` (any shape) to `values` (keys.shape + [dim])."""
    keys = self._check_keys(keys, "keys")
    values = variable_lib.DynamicEmbeddingVariable._check_rows(self, keys, values)  # pylint: disable=protected-access
    with tf.name_scope(name or f"{self._name}_insert"):
      flat_keys, _, flat_values = self._partition(
        tf.reshape(keys, [-1]), tf.reshape(values, [-1, self._dim])
      )
      return tf.group(*(s.insert(k, v) for s, k, v in zip(self._shards, flat_keys, flat_values)))

  def remove(self, keys, name=None):
    """Removes `keys`; missing keys are ignored."""
    keys = self._check_keys(keys, "keys")
    with tf.name_scope(name or f"{self._name}_remove"):
      parts, _ = self._partition(tf.reshape(keys, [-1]))
      return tf.group(*(shard.remove(part) for shard, part in zip(self._shards, parts)))

  def size(self, name=None):
    """Number of ids in all shards (int64 scalar)."""
    with tf.name_scope(name or f"{self._name}_size"):
      return tf.add_n([shard.size() for shard in self._shards])

  def memory_bytes(self, name=None):
    """Bytes all shards hold for their entries and index (int64 scalar)."""
    with tf.name_scope(name or f"{self._name}_memory_bytes"):
      return tf.add_n([shard.memory_bytes() for shard in self._shards])

  def clear(self, name=None):
    with tf.name_scope(name or f"{self._name}_clear"):
      return tf.group(*(shard.clear() for shard in self._shards))

  def evict(self, step=None, name=None):
    """Evicts in every shard (each on its own device); returns how many rows went."""
    if self.eviction is None:
      self._shards[0].evict(step)  # raises the error of a table without a policy
    with tf.name_scope(name or f"{self._name}_evict"):
      return tf.add_n([shard.evict(step) for shard in self._shards])

  def statistics(self, name=None):
    """The shards' statistics summed (lookup_hit_rate recomputed from the sums)."""
    with tf.name_scope(name or f"{self._name}_statistics"):
      per_shard = [shard.statistics() for shard in self._shards]
      return lifecycle.statistics_dict(
        [tf.add_n([stats[key] for stats in per_shard]) for key in lifecycle.STATISTICS]
      )

  def export(self, name=None):
    """(keys, values) of every shard, concatenated in shard order."""
    keys, values, *_ = self.export_with_slots(name)
    return keys, values

  def export_with_slots(self, name=None):
    """TfExtTableExport's outputs over all shards: keys, values, slots, update_counts and
    last_steps concatenated; slot_initial_values of shard 0 (an optimizer step gives every shard
    the same slots)."""
    with tf.name_scope(name or f"{self._name}_export"):
      exports = [shard.export_with_slots() for shard in self._shards]
      return (*(tf.concat([e[i] for e in exports], 0) for i in range(5)), exports[0][5])

  def import_with_slots(
    self, keys, values, slots, update_counts, last_steps, slot_initial_values, name=None
  ):
    """Replaces the content of every shard with its ids of the given snapshot."""
    keys = self._check_keys(keys, "keys")
    with tf.name_scope(name or f"{self._name}_import"):
      flat_keys, _, *parts = self._partition(
        tf.reshape(keys, [-1]),
        tf.convert_to_tensor(values, tf.float32),
        tf.convert_to_tensor(slots, tf.float32),
        tf.convert_to_tensor(update_counts, tf.int64),
        tf.convert_to_tensor(last_steps, tf.int64),
      )
      return tf.group(
        *(
          shard.import_with_slots(flat_keys[i], *(p[i] for p in parts), slot_initial_values)
          for i, shard in enumerate(self._shards)
        )
      )

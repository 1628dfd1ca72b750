"""A Variable's shards: the devices they are on, the partitioner that routes keys to them, and
the gradient target that splits a lookup's gradient among them."""

import weakref

import tensorflow as tf


def default_partition_fn(keys, shard_num):
  """TFRA's default: int keys by `key mod shard_num`, strings by their fast hash."""
  if shard_num <= 1:
    return tf.zeros(tf.shape(keys), tf.int32)
  keys = tf.convert_to_tensor(keys)
  if keys.dtype == tf.string:
    ids = tf.strings.to_hash_bucket_fast(keys, shard_num)
    return tf.cast(tf.bitwise.bitwise_and(ids, 0x7FFFFFFF), tf.int32)
  return tf.cast(tf.math.floormod(keys, shard_num), tf.int32)


def check_devices(name, devices):
  """The devices as a list; ValueError for one this process does not have (eagerly: a CPU it does
  not have is its first CPU, as TensorFlow's soft placement places it)."""
  if devices is None:
    gpus = tf.config.list_logical_devices("GPU")
    return [gpus[0].name if gpus else "/CPU:0"]
  devices = list(devices) if isinstance(devices, (list, tuple)) else [devices]
  if not devices:
    raise ValueError(f"tf_ext.tfra Variable '{name}': devices is an empty list")
  if not tf.executing_eagerly():  # a session's config may add devices (device_count)
    return devices
  local = {
    (d.device_type, tf.DeviceSpec.from_string(d.name).device_index)
    for d in tf.config.list_logical_devices()
  }
  placed = []
  for device in devices:
    spec = tf.DeviceSpec.from_string(device)
    # A device of another task (a parameter server) is checked when the session places it.
    if spec.job is None and spec.device_type is not None:
      if (spec.device_type.upper(), spec.device_index or 0) not in local:
        # TFRA spreads shards over "/CPU:0", "/CPU:1", ...: with soft placement on, a CPU this
        # process does not have is its CPU; a missing GPU is refused.
        if spec.device_type.upper() != "CPU" or not tf.config.get_soft_device_placement():
          raise ValueError(
            f"tf_ext.tfra Variable '{name}': devices names {device!r}, which this process does "
            f"not have (it has {sorted(d.name for d in tf.config.list_logical_devices())})"
          )
        device = spec.replace(device_index=0).to_string()
    placed.append(device)
  return placed


class ShardedTarget:
  """What a wrapper of a Variable of several tables names as its table: the optimizer hands it the
  lookup's gradient, and it gives each table the part of its keys (TablesStage, optimizer.py)."""

  def __init__(self, variable):
    self._variable = weakref.ref(variable)

  @property
  def name(self):
    return self._variable().name

  def split_gradient(self, gradient):
    """[(table, IndexedSlices of its keys)] of a gradient keyed by stored keys."""
    variable = self._variable()
    parts = variable.partition(gradient.indices)
    values = tf.dynamic_partition(gradient.values, parts, variable.shard_num)
    keys = tf.dynamic_partition(gradient.indices, parts, variable.shard_num)
    return [
      (table, tf.IndexedSlices(v, k, gradient.dense_shape))
      for table, k, v in zip(variable.tables, keys, values)
    ]

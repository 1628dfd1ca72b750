"""TFRA's `dynamic_embedding.Variable` and `get_variable`, each a group of tf_ext tables.

A Variable holds one tf_ext table per device of `devices` (TFRA's shards), named as TFRA names its
tables (`<name>_mht_<i>of<n>`), and routes keys to them with TFRA's `partitioner`. Training goes
through tf_ext: a lookup's gradient reaches the scalar TrainableWrapper (or ShadowVariable) that
the lookup read, keyed by the looked-up ids, and the optimizer wrapped by
`de.DynamicEmbeddingOptimizer` updates the rows and their slots inside the table
(tf_ext/dynamic_embedding/optimizer.py). Updates are applied as deltas inside the table, so TFRA's
`bp_v2=True` semantics hold either way.
"""

import functools
import weakref

import tensorflow as tf
from tensorflow.python.eager import record as gradient_record
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops, variable_scope
from tensorflow.python.platform import tf_logging
from tensorflow.python.trackable import base as trackable
from tensorflow.python.trackable import data_structures

from tf_ext import _ops_loader, rank_local_gradients
from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import variable as table_lib
from tf_ext.dynamic_embedding.tfra import creators, dtypes, file_system, initial_rows, string_rows


class GraphKeys:
  """TFRA's (deprecated) collection names; Variables are not added to them, as in TFRA."""

  DYNAMIC_EMBEDDING_VARIABLES = "dynamic_embedding_variables"
  TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = "trainable_dynamic_embedding_variables"


class ModelMode:
  """TFRA's model mode. tf_ext lookups never insert in either mode (a missing key reads its
  initial row; only optimizer updates create rows), so the mode only records the choice."""

  TRAIN = "train"
  INFERENCE = "inference"
  CURRENT_SETTING = TRAIN


def get_model_mode():
  return ModelMode.CURRENT_SETTING


def enable_train_mode():
  ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def enable_inference_mode():
  ModelMode.CURRENT_SETTING = ModelMode.INFERENCE


def default_partition_fn(keys, shard_num):
  """TFRA's default: int keys by `key mod shard_num`, strings by their fast hash."""
  if shard_num <= 1:
    return tf.zeros(tf.shape(keys), tf.int32)
  keys = tf.convert_to_tensor(keys)
  if keys.dtype == tf.string:
    ids = tf.strings.to_hash_bucket_fast(keys, shard_num)
    return tf.cast(tf.bitwise.bitwise_and(ids, 0x7FFFFFFF), tf.int32)
  return tf.cast(tf.math.floormod(keys, shard_num), tf.int32)


def _check_devices(name, devices):
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


class _ShardedTarget:
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


class Variable(trackable.Trackable):
  """TFRA's dynamic embedding Variable: rows of `dim` values for keys of `key_dtype`."""

  def __init__(
    self,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    dim=1,
    devices=None,
    partitioner=default_partition_fn,
    shared_name=None,
    name="DynamicEmbedding_Variable",
    initializer=None,
    trainable=True,
    checkpoint=True,
    init_size=0,
    kv_creator=None,
    restrict_policy=None,
    bp_v2=False,
    distribution=None,
  ):
    self.name = name
    self.key_dtype = tf.as_dtype(key_dtype)
    self.value_dtype = tf.as_dtype(value_dtype)
    self._stored_key_dtype = dtypes.stored_key_dtype(name, key_dtype, value_dtype)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
      raise ValueError(f"tf_ext.tfra Variable '{name}': dim must be a positive int, got {dim!r}")
    self.dim = dim
    if not callable(partitioner):
      raise TypeError(f"tf_ext.tfra Variable '{name}': partitioner must be callable")
    self.partition_fn = partitioner
    self.kv_creator = kv_creator if kv_creator is not None else creators.CuckooHashTableCreator()
    if not isinstance(self.kv_creator, creators.KVCreator):
      raise TypeError(
        f"tf_ext.tfra Variable '{name}': kv_creator must be a KVCreator "
        f"(CuckooHashTableCreator or HkvHashTableCreator), got {type(self.kv_creator).__name__}"
      )
    self.kv_creator.check(name)
    self.devices = _check_devices(name, devices)
    self.shard_num = len(self.devices)
    self.shared_name = shared_name or f"shared_name.{name}"
    self.trainable = trainable
    self.checkpoint = checkpoint
    self.init_size = int(init_size)
    self.bp_v2 = bp_v2
    self.initializer = initializer
    self._codec = dtypes.RowCodec(self.value_dtype, dim)
    self._string_rows = self.value_dtype == tf.string
    if self._string_rows:
      _check_string_rows(name, distribution, restrict_policy, self.kv_creator)
      self._initializer_spec, self._default_rows = None, None
    else:
      self._initializer_spec, self._default_rows = initial_rows.plan(
        initializer,
        name,
        dim,
        self._codec,
        # A split table reads its rows on their owners: float32 rows there.
        per_lookup=initial_rows.drawn_per_lookup()
        and (distribution is None or self.value_dtype == tf.float32),
      )
    trainable = trainable and dtypes.trainable_rows(self.value_dtype)
    self._trainable_store = {}
    self.distribution = alltoall.check_distribution(name, distribution)
    split_default_rows = distribution is not None and self._default_rows is not None
    if split_default_rows and self._default_rows.initializer is None:
      raise ValueError(
        f"tf_ext.tfra Variable '{name}': a table split across Horovod ranks computes its initial "
        "rows itself: give a number, Zeros, Ones, Constant or a random initializer (float rows)"
      )
    if distribution is not None and self.shard_num != 1:
      raise ValueError(
        f"tf_ext.tfra Variable '{name}': a table split across Horovod ranks takes one device, "
        f"got {self.devices}"
      )
    table_class = table_lib.DynamicEmbeddingVariable
    if distribution == alltoall.ALLTOALL:
      table_class = alltoall.AllToAllDynamicEmbeddingVariable
      if split_default_rows:
        table_class = functools.partial(
          _AllToAllTableOfInitialRows,
          default_rows=self._default_rows,
          partition_fn=self.partition_fn,
          key_dtype_of_ids=self.key_dtype,
        )
    if self._string_rows:
      string_default = string_rows.default_row(name, initializer, dim)
    self._tables = data_structures.ListWrapper([])
    for index, device in enumerate(self.devices):
      with tf.device(device):
        table_name = self._make_name(index)
        if self._string_rows:
          self._tables.append(
            string_rows.StringRowsTable(table_name, dim, self._stored_key_dtype, string_default)
          )
          continue
        # Lookups train through the wrappers; a table's own anchor only serves the all-to-all
        # exchange, which trains it (HvdAllToAllEmbedding's weight).
        own_anchor = None if distribution else _idle_anchor(table_name)
        self._tables.append(
          table_class(
            table_name,
            self._codec.stored_dim,
            key_dtype=self._stored_key_dtype,
            initializer=self._initializer_spec,
            trainable=trainable,
            gradient_anchor=own_anchor,
          )
        )
    for table in () if self._string_rows else self._tables:  # TFRA's file system methods
      file_system.attach(table, self.key_dtype, self._codec)
    self._table_group = None
    if checkpoint:
      # Under a name of its own (TFRA's is "tables_of_<name>"), so that a checkpoint restores
      # into a Variable, layer or model of another name as well.
      self._track_trackable(self._tables, "tables", overwrite=True)
      if file_system.saves_as_group(self.kv_creator, distribution):
        # FileSystemSaver: the tables are saved together, to restore into any number of tables.
        self._table_group = file_system.TableGroup(self)
        self._track_trackable(self._table_group, "table_group", overwrite=True)
    else:
      _drop_from_saver(self._tables)
    self._gradient_target = self._tables[0] if self.shard_num == 1 else _ShardedTarget(self)
    self._restrict_policy = None
    if restrict_policy is not None:
      if not (isinstance(restrict_policy, type) and hasattr(restrict_policy, "apply_restriction")):
        raise TypeError("restrict_policy must be subclass of RestrictPolicy.")
      self._restrict_policy = restrict_policy(self)
      status = self._restrict_policy.status
      if checkpoint and isinstance(status, Variable):
        self._track_trackable(status, "restrict_status", overwrite=True)

  def _gather_saveables_for_checkpoint(self):
    """tf.compat.v1.train.Saver(var_list=[variable, ...]) saves each of its tables (in a graph;
    tf.train.Checkpoint reaches the tables as the Variable's children); with FileSystemSaver,
    their group."""
    if self._table_group is not None:
      return self._table_group._gather_saveables_for_checkpoint()  # noqa: SLF001
    factories = {}
    for index, table in enumerate(self._tables if self.checkpoint else ()):
      for factory in table._gather_saveables_for_checkpoint().values():  # noqa: SLF001
        factories[f"table_{index}"] = factory
    return factories

  def _make_name(self, index):
    return "{}_mht_{}of{}".format(self.name.replace("/", "_"), index + 1, self.shard_num)

  # ---- properties ---------------------------------------------------------------------------

  @property
  def tables(self):
    """The tf_ext tables (tf_ext.DynamicEmbeddingVariable), one per device."""
    return self._tables

  @property
  def restrict_policy(self):
    return self._restrict_policy

  @property
  def reads_default_rows(self):
    """Whether missing keys read rows the Variable adds outside the table (initial_rows.py):
    TFRA's initializer called per lookup, or rows the table cannot compute."""
    return self._default_rows is not None

  @property
  def trainable_store(self):
    """{name: TrainableWrapper or ShadowVariable} of the lookups made so far."""
    return self._trainable_store

  def get_trainable_by_name(self, name):
    if not isinstance(name, str):
      raise TypeError("name should be a string")
    return self._trainable_store.get(name, None)

  def __repr__(self):
    return (
      f"<tf_ext.tfra.Variable '{self.name}' dim={self.dim} key_dtype={self.key_dtype.name} "
      f"value_dtype={self.value_dtype.name} shards={self.shard_num}>"
    )

  # ---- keys and partitions ------------------------------------------------------------------

  def _stored_keys(self, keys):
    # Lists and arrays take the key dtype (as TFRA converts them); a tensor must have it.
    keys = tf.convert_to_tensor(keys, None if tf.is_tensor(keys) else self.key_dtype)
    if keys.dtype != self.key_dtype:  # ValueError, as TFRA's table ops raise
      raise ValueError(
        f"tf_ext.tfra Variable '{self.name}': keys must be {self.key_dtype.name}, got "
        f"{keys.dtype.name}"
      )
    return dtypes.to_stored(keys, self._stored_key_dtype)

  def partition(self, stored_keys):
    """The shard (int32) of each stored key, by the Variable's partitioner."""
    if self.shard_num == 1:
      return tf.zeros(tf.shape(stored_keys), tf.int32)
    keys = dtypes.to_stored(stored_keys, self.key_dtype)
    return tf.cast(self.partition_fn(keys, self.shard_num), tf.int32)

  def _per_shard(self, flat_keys, each):
    """Runs each(table, keys) per shard on 1-D stored keys and stitches the results in order (a
    tuple of results: each stitched)."""
    if self.shard_num == 1:
      with self._tables[0].colocated():
        return each(self._tables[0], flat_keys)
    parts = self.partition(flat_keys)
    positions = tf.dynamic_partition(tf.range(tf.size(flat_keys)), parts, self.shard_num)
    keys = tf.dynamic_partition(flat_keys, parts, self.shard_num)
    results = []
    for table, shard_keys in zip(self._tables, keys):
      with table.colocated():
        results.append(each(table, shard_keys))
    if isinstance(results[0], tuple):
      return tuple(tf.dynamic_stitch(positions, list(r)) for r in zip(*results))
    return tf.dynamic_stitch(positions, results)

  def _each_shard(self, keys, action, values=None):
    """Groups action(table, keys[, values]) over the shards (for writes, which return an op)."""
    if self.shard_num == 1:
      return (
        action(self._tables[0], keys) if values is None else action(self._tables[0], keys, values)
      )
    parts = self.partition(keys)
    key_parts = tf.dynamic_partition(keys, parts, self.shard_num)
    if values is None:
      ops_ = [action(t, k) for t, k in zip(self._tables, key_parts)]
    else:
      value_parts = tf.dynamic_partition(values, parts, self.shard_num)
      ops_ = [action(t, k, v) for t, k, v in zip(self._tables, key_parts, value_parts)]
    return tf.group(ops_)

  # ---- reads --------------------------------------------------------------------------------

  def read_rows(self, keys, anchor=None, return_exists=False):
    """Rows of `keys` (any shape) as keys.shape + [dim] in value_dtype (and, with
    `return_exists`, whether each key had a row). With `anchor` (a wrapper variable), the rows'
    gradient reaches it, keyed by the stored keys."""
    stored = self._stored_keys(keys)
    if self.distribution is not None:  # the exchange trains the table's own anchor
      if return_exists:
        raise NotImplementedError(
          f"tf_ext.tfra Variable '{self.name}': return_exists is not offered for a table split "
          "across Horovod ranks"
        )
      return self._codec.decode(self._tables[0].lookup(stored))
    flat = tf.reshape(stored, [-1])
    if self._string_rows:
      if anchor is not None:
        raise TypeError(
          f"tf_ext.tfra Variable '{self.name}': string rows are not trained; read them with "
          "Variable.lookup"
        )
      rows, present = self._per_shard(flat, lambda table, shard_keys: table.find(shard_keys))
      rows, exists = _shaped_as(stored, rows, self.dim), _shaped_as(stored, present)
      return (rows, exists) if return_exists else rows
    anchor_value = anchor.read_for_lookup() if anchor is not None else tf.constant(0.0)
    library = _ops_loader.load()
    width = self._codec.stored_dim
    defaults = self._default_rows
    with_presence = return_exists or defaults is not None

    def find(table, shard_keys):
      if not with_presence:
        return library.tf_ext_table_find(table.resource_handle, shard_keys, anchor_value, dim=width)
      rows, present = library.tf_ext_table_find_with_presence(
        table.resource_handle, shard_keys, anchor_value, dim=width
      )
      if defaults is None:
        return rows, present
      # Drawn per shard for the shard's keys, as TFRA calls its initializer.
      return rows, present, defaults.rows(tf.shape(shard_keys))

    found = self._per_shard(flat, find)
    if with_presence:
      found, present, *default = found
    rows = self._codec.decode(_shaped_as(stored, found, width))
    if not with_presence:
      return rows
    exists = _shaped_as(stored, present)
    if defaults is not None:
      differentiable = self.value_dtype.is_floating and not self._codec.bitwise
      rows = _with_default_rows(
        rows, exists, tf.reshape(default[0], tf.shape(rows)), differentiable
      )
      if anchor is not None:
        _keep_default_rows(anchor, flat, present, default[0])
    return (rows, exists) if return_exists else rows

  def write_default_rows(self, keys, anchor=None):
    """Inserts the default row of each of `keys` (1-D, key_dtype) that has no row, so that an
    update starts from it (de.DynamicEmbeddingOptimizer calls it before a step trains `keys`
    through `anchor`): the rows the lookups through `anchor` read, where they are reachable
    here, else rows drawn now. None when the table computes its initial rows itself."""
    if self._default_rows is None:
      return None
    read = _default_rows_read_through(anchor)
    if read is not None:  # stored keys and value_dtype rows
      read_keys, read_rows = read
      return self._each_shard(
        read_keys, lambda t, k, v: t.insert(k, v), self._codec.encode(read_rows)
      )
    keys = tf.unique(tf.reshape(keys, [-1]))[0]
    rows, exists = self.read_rows(keys, return_exists=True)
    missing = tf.logical_not(exists)
    return self.upsert(tf.boolean_mask(keys, missing), tf.boolean_mask(rows, missing))

  def lookup(self, keys, return_exists=False, name=None):
    """Rows of `keys`: keys.shape + [dim]; a missing key reads its initial row. With
    `return_exists`, (rows, exists): whether each key had a row."""
    with tf.name_scope(name or f"{self._scope_name()}_lookup"):
      return self.read_rows(keys, return_exists=return_exists)

  def embedding_lookup(self, ids, name=None, max_norm=None):
    """(rows, wrapper) of `ids`, as de.embedding_lookup(self, ids, return_trainable=True) with the
    name `<name>/embedding_lookup`."""
    return embedding_lookup(
      self,
      ids,
      name=f"{name}/embedding_lookup" if name else None,
      max_norm=max_norm,
      return_trainable=True,
    )

  def size(self, index=None, name=None):
    """The number of keys in table `index`, or in all of them (int64 scalar). In a TF1 graph
    the ops are made once per graph and reused, as TFRA does, so that a finalized graph
    (MonitoredTrainingSession) still answers."""
    if tf.executing_eagerly() or ops.inside_function():
      sizes = [table.size(name=name) for table in self._tables]
      return sizes[index] if index is not None else tf.add_n(sizes)
    graph = ops.get_default_graph()
    cache = self.__dict__.setdefault("_size_ops", weakref.WeakKeyDictionary())
    if graph not in cache:
      sizes = [table.size(name=name) for table in self._tables]
      cache[graph] = (sizes, tf.add_n(sizes))
    sizes, total = cache[graph]
    return sizes[index] if index is not None else total

  def export(self, name=None):
    """(keys, values) of every row, in key_dtype and value_dtype."""
    keys, values = [], []
    for table in self._tables:
      k, v = table.export(name=name)
      keys.append(k)
      values.append(v)
    keys = tf.concat(keys, 0) if len(keys) > 1 else keys[0]
    values = tf.concat(values, 0) if len(values) > 1 else values[0]
    return dtypes.to_stored(keys, self.key_dtype), self._codec.decode(values)

  # ---- writes -------------------------------------------------------------------------------

  def _rows(self, keys, values):
    """`values` (keys.shape + [dim]) as [n, dim] of value_dtype (lists and arrays converted, as
    TFRA converts them); InvalidArgumentError for another shape."""
    try:
      values = tf.convert_to_tensor(values, None if tf.is_tensor(values) else self.value_dtype)
    except (TypeError, ValueError) as error:
      raise ValueError(f"tf_ext.tfra Variable '{self.name}': bad values: {error}") from None
    if values.dtype != self.value_dtype:
      raise ValueError(
        f"tf_ext.tfra Variable '{self.name}': values must be {self.value_dtype.name}, got "
        f"{values.dtype.name}"
      )
    expected = keys.shape.concatenate([self.dim])
    if not values.shape.is_compatible_with(expected):
      raise tf.errors.InvalidArgumentError(
        None,
        None,
        f"tf_ext.tfra Variable '{self.name}': Expected shape {expected} for values, "
        f"got {values.shape}",
      )
    if not values.shape.is_fully_defined() or not keys.shape.is_fully_defined():
      check = tf.debugging.assert_equal(
        tf.shape(values),
        tf.concat([tf.shape(keys), [self.dim]], 0),
        message=f"tf_ext.tfra Variable '{self.name}': Expected shape keys.shape + [dim] for values",
      )
      with tf.control_dependencies([check]):
        values = tf.identity(values)
    return tf.reshape(values, [-1, self.dim])

  def upsert(self, keys, values, name=None):
    """Sets the rows of `keys` to `values` (keys.shape + [dim]), inserting missing keys."""
    keys = self._stored_keys(keys)
    values = self._codec.encode(self._rows(keys, values))
    keys = tf.reshape(keys, [-1])
    return self._each_shard(keys, lambda t, k, v: t.insert(k, v, name=name), values)

  def accum(self, keys, old_values, new_values, exists, name=None):
    """TFRA's update for asynchronous training, by what `exists` says a lookup found: a key that
    existed and still has a row gets `new_values - old_values` added; a key that did not exist
    and still has none gets `new_values`; the others (removed or inserted by another writer since
    the lookup) are left as they are. Not atomic against concurrent writers of the same keys: a
    read and an insert."""
    del name
    if self._string_rows:
      raise TypeError(f"tf_ext.tfra Variable '{self.name}': accum adds rows; these are strings")
    keys = self._stored_keys(keys)
    old, new = self._rows(keys, old_values), self._rows(keys, new_values)
    keys = tf.reshape(keys, [-1])
    existed = tf.reshape(tf.convert_to_tensor(exists, tf.bool), [-1])
    current, present = self.read_rows(dtypes.to_stored(keys, self.key_dtype), return_exists=True)
    current = tf.reshape(current, [-1, self.dim])
    write = tf.equal(existed, present)
    rows = tf.where(existed[:, None], current + (new - old), new)
    rows = self._codec.encode(tf.boolean_mask(rows, write))
    return self._each_shard(tf.boolean_mask(keys, write), lambda t, k, v: t.insert(k, v), rows)

  def remove(self, keys, name=None):
    """Removes `keys` (missing ones are ignored)."""
    keys = tf.reshape(self._stored_keys(keys), [-1])
    return self._each_shard(keys, lambda t, k: t.remove(k, name=name))

  def clear(self, name=None):
    """Removes every key."""
    return tf.group([table.clear(name=name) for table in self._tables])

  def restrict(self, num_reserved, **kwargs):
    """Keeps at most `num_reserved` rows, chosen by the Variable's restrict policy (None and a
    warning without one, as in TFRA)."""
    if self._restrict_policy is None:
      tf_logging.warning("Call restrict without setting restrict policy.")
      return None
    return self._restrict_policy.apply_restriction(num_reserved, **kwargs)

  def save_to_file_system(
    self,
    dirpath,
    proc_size=1,
    proc_rank=0,
    file_name_list=None,
    dirpath_env=file_system.DIRPATH_ENV,
    append_to_file=False,
    buffer_size=file_system.DEFAULT_BUFFER_SIZE,
    name=None,
  ):
    """Writes each table's keys and rows as TFRA's key and value files in `dirpath`, table i of n
    as `<its name, _mht_<i>of<n>_rank<proc_rank>_size<proc_size>>-keys` and `-values` (or the
    names of `file_name_list`). Rows only: a checkpoint keeps the optimizer's slots too."""
    return file_system.save_variable(
      self,
      dirpath,
      proc_size,
      proc_rank,
      file_name_list,
      dirpath_env=dirpath_env,
      append_to_file=append_to_file,
      buffer_size=buffer_size,
      name=name,
    )

  def load_from_file_system(
    self,
    dirpath,
    proc_size=1,
    proc_rank=0,
    file_name_list=None,
    dirpath_env=file_system.DIRPATH_ENV,
    load_entire_dir=False,
    buffer_size=file_system.DEFAULT_BUFFER_SIZE,
    name=None,
  ):
    """Sets the rows of the keys in the files save_to_file_system writes (with the same
    arguments), each table from its own; other keys keep their rows."""
    return file_system.load_variable(
      self,
      dirpath,
      proc_size,
      proc_rank,
      file_name_list,
      dirpath_env=dirpath_env,
      load_entire_dir=load_entire_dir,
      buffer_size=buffer_size,
      name=name,
    )

  def load_from_file_system_with_restore_function(
    self, dirpath, proc_size=1, proc_rank=0, buffer_size=file_system.DEFAULT_BUFFER_SIZE
  ):
    """Sets the rows of every key in this Variable's files in `dirpath` (of any number of tables,
    ranks and sizes) that its partitioner gives `proc_rank` of `proc_size`, each in the table its
    partitioner gives it now."""
    del buffer_size
    return file_system.load_variable_files(self, dirpath, proc_size, proc_rank)

  def get_slot_variables(self, optimizer):
    """TFRA returns the optimizer's slot Variables. tf_ext keeps a row's slots in the row's own
    table entry (exported with `tables[i].export_with_slots()`), so there are none to return."""
    del optimizer
    return []

  def _scope_name(self):
    return self.name.split("/")[-1]


# Eagerly, a wrapper keeps what its lookups read for their missing keys until the next update;
# lookups under a tape that are never trained keep at most this many.
_MAX_EAGER_DEFAULT_ROWS = 64


def _shaped_as(keys, flat, width=None):
  """`flat` (one value, or one row of `width`, per key of the flattened `keys`) in keys' shape
  (+ [width]), with the static shape kept."""
  tail = [] if width is None else [width]
  shaped = tf.reshape(flat, tf.concat([tf.shape(keys), tail], 0))
  shaped.set_shape(keys.shape.concatenate(tail))
  return shaped


def _with_default_rows(rows, exists, default, differentiable):
  """`rows` with `default`'s row where a key is missing (the table gave it zeros). Differentiable
  (float) rows keep their gradient for every key, missing ones too."""
  if not differentiable:
    return tf.where(exists[..., None], rows, default)
  return rows + tf.stop_gradient(tf.where(exists[..., None], tf.zeros_like(rows), default))


def _keep_default_rows(anchor, keys, present, rows):
  """Keeps the rows ([n, dim]) that a lookup through `anchor` read for its 1-D `keys` that were
  not `present`, for the next update to write: per graph in a graph (while the graph lives),
  eagerly only under a gradient tape, until the next update."""
  if tf.executing_eagerly() and not gradient_record.could_possibly_record():
    return
  missing = tf.logical_not(present)
  entry = (tf.boolean_mask(keys, missing), tf.boolean_mask(rows, missing))
  if tf.executing_eagerly():
    eager = anchor.__dict__.setdefault("_tfra_eager_default_rows", [])
    eager.append(entry)
    del eager[:-_MAX_EAGER_DEFAULT_ROWS]
    return
  per_graph = anchor.__dict__.setdefault("_tfra_default_rows", weakref.WeakKeyDictionary())
  per_graph.setdefault(ops.get_default_graph(), []).append(entry)


def _default_rows_read_through(anchor):
  """(keys, rows) that lookups through `anchor` read for missing keys and that the current graph
  can use (its own, or an enclosing graph's); eagerly, those since the last update (taken). None
  when there are none."""
  if anchor is None:
    return None
  if tf.executing_eagerly():
    read = anchor.__dict__.pop("_tfra_eager_default_rows", [])
  else:
    read, per_graph = [], anchor.__dict__.get("_tfra_default_rows")
    graph = ops.get_default_graph()
    while per_graph is not None and graph is not None and not read:
      read = per_graph.get(graph, [])
      graph = getattr(graph, "outer_graph", None)
  if not read:
    return None
  return tf.concat([k for k, _ in read], 0), tf.concat([r for _, r in read], 0)


class _AllToAllTableOfInitialRows(alltoall.AllToAllDynamicEmbeddingVariable):
  """The table of a Variable split across Horovod ranks whose initial rows TFRA's initializer
  draws (HvdAllToAllEmbedding): as TFRA's, the Variable's partitioner names each id's rank, and
  an owner reads the distinct ids it received and gives each missing one the initializer's row
  at its position (so every id starts from the row it gets in TFRA); an update first writes
  those rows."""

  def __init__(self, *args, default_rows, partition_fn, key_dtype_of_ids, **kwargs):
    self._default_rows = default_rows
    self._partition_fn, self._key_dtype_of_ids = partition_fn, key_dtype_of_ids
    super().__init__(*args, **kwargs)

  def owner_of(self, ids):
    keys = dtypes.to_stored(ids, self._key_dtype_of_ids)
    return tf.cast(self._partition_fn(keys, self.ranks), tf.int32)

  def distinct_by_owner(self, flat_ids):
    distinct, positions = tf.unique(flat_ids)
    owners = self.owner_of(distinct)
    order = tf.argsort(owners, stable=True)
    counts = tf.math.bincount(owners, minlength=self.ranks, maxlength=self.ranks, dtype=tf.int32)
    grouped_index = tf.math.invert_permutation(order)
    return tf.gather(distinct, order), tf.gather(grouped_index, positions), counts

  def owned_rows(self, received):
    distinct, positions = tf.unique(received)
    self.mark_owned(distinct)
    anchor = self.gradient_anchor.value() if self.trainable else tf.constant(0.0)
    with self.colocated():
      rows, present = _ops_loader.load().tf_ext_table_find_with_presence(
        self.resource_handle, distinct, anchor, dim=self.dim
      )
    default = self._default_rows.rows(tf.shape(distinct))
    rows = _with_default_rows(rows, present, default, differentiable=True)
    if self.trainable:
      _keep_default_rows(self.gradient_anchor, distinct, present, default)
    return tf.gather(rows, positions)

  def write_default_rows(self):
    """Writes the rows this rank's lookups read for its missing ids (into its own part), so
    that the update starts from them; None when there are none."""
    read = _default_rows_read_through(self.gradient_anchor)
    return None if read is None else table_lib.DynamicEmbeddingVariable.insert(self, *read)


def _check_string_rows(name, distribution, restrict_policy, kv_creator):
  """String rows live in TensorFlow's MutableHashTable, in this process, whole."""
  refused = [
    (distribution is not None, "distribution (a table split across Horovod ranks)"),
    (restrict_policy is not None, "restrict_policy"),
    (file_system.saves_as_group(kv_creator, None), "a FileSystemSaver kv_creator"),
  ]
  for is_asked, what in refused:
    if is_asked:
      raise ValueError(
        f"tf_ext.tfra Variable '{name}': string rows (value_dtype=tf.string) are held in "
        f"TensorFlow's MutableHashTable, in this process: {what} is not offered for them; use "
        "numeric rows for it"
      )


def _idle_anchor(table_name):
  """A table's own gradient anchor where no lookup reads it: not trainable and, in a graph, local,
  so that neither optimizers nor Saver see it (a TFRA checkpoint has no such variable)."""
  with tf.init_scope(), tf.compat.v1.name_scope(None):
    if tf.executing_eagerly():
      return tf.Variable(0.0, trainable=False, name=f"{table_name}/gradient_anchor")
    return tf.compat.v1.Variable(
      0.0,
      trainable=False,
      name=f"{table_name}/gradient_anchor",
      collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
    )


def _drop_from_saver(tables):
  """checkpoint=False: the tables leave the graph's saveable objects (tf_ext adds them there)."""
  if tf.executing_eagerly():
    return
  saveables = ops.get_collection_ref(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
  names = {table.name for table in tables}
  saveables[:] = [s for s in saveables if getattr(s, "name", None) not in names]


def get_variable(
  name,
  key_dtype=tf.int64,
  value_dtype=tf.float32,
  dim=1,
  devices=None,
  partitioner=default_partition_fn,
  shared_name="get_variable",
  initializer=None,
  trainable=True,
  checkpoint=True,
  init_size=0,
  kv_creator=None,
  restrict_policy=None,
  bp_v2=False,
  distribution=None,
):
  """The Variable `name` of the current variable scope, created when it does not exist; with
  `reuse=False` scopes, a second creation raises ValueError, as TFRA's does.

  `distribution="alltoall"` (tf_ext's, not TFRA's) splits the table across the Horovod ranks
  (HvdAllToAllEmbedding's storage)."""
  scope = tf.compat.v1.get_variable_scope()
  # TF's variable store of the graph, where TFRA keeps its Variables too.
  store = variable_scope._get_default_variable_store()._vars  # noqa: SLF001
  full_name = f"{scope.name}/{name}" if scope.name else name
  if full_name in store:
    if scope.reuse is False:
      raise ValueError(
        f"Variable {full_name} already exists, disallowed. Did you mean to set reuse=True or "
        "reuse=tf.AUTO_REUSE in VarScope?"
      )
    return store[full_name]
  variable = Variable(
    key_dtype=key_dtype,
    value_dtype=value_dtype,
    dim=dim,
    devices=devices,
    partitioner=partitioner,
    shared_name=shared_name,
    name=full_name,
    initializer=initializer,
    trainable=trainable,
    checkpoint=checkpoint,
    init_size=init_size,
    kv_creator=kv_creator,
    restrict_policy=restrict_policy,
    bp_v2=bp_v2,
    distribution=distribution,
  )
  store[full_name] = variable
  return variable


class TrainableWrapper(resource_variable_ops.ResourceVariable):
  """What `de.embedding_lookup(..., return_trainable=True)` returns for the optimizer's var_list:
  a scalar variable whose gradient is the lookup's, keyed by the looked-up ids, and which names the
  Variable's table to `de.DynamicEmbeddingOptimizer`."""

  @classmethod
  def _variable_call(cls, *args, **kwargs):
    """Constructs like any class (tf.Variable's metaclass would bind positional arguments to
    tf.Variable's own parameters first)."""
    del args, kwargs

  def __init__(
    self,
    params,
    ids=None,
    max_norm=None,
    trainable=True,
    name="TrainableWrapper",
    model_mode=None,
    **kwargs,
  ):
    del kwargs  # TFRA's initial_value, dtype, collections: the wrapper holds no rows here
    self.params = params
    self._ids = ids
    self.max_norm = max_norm
    self.model_mode = model_mode or ModelMode.CURRENT_SETTING
    # Out of Saver's default list (a TFRA checkpoint has no wrappers, nor need ours): local.
    collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
    if trainable:
      collections.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    with tf.init_scope():
      super().__init__(
        initial_value=0.0, trainable=trainable, dtype=tf.float32, name=name, collections=collections
      )
    setattr(self, table_lib.TABLE_OF_ANCHOR, weakref.ref(params._gradient_target))  # noqa: SLF001
    # Horovod's reductions leave a wrapper's gradient on its rank, as TFRA registers its wrappers
    # as local variables of Horovod's optimizers.
    rank_local_gradients.mark(self)

  def read_for_lookup(self):
    """The wrapper's value (always 0), read so that the lookup's gradient reaches it. In a graph
    the read assigns it first, as TFRA's wrapper does, so a session need not initialize it."""
    if tf.executing_eagerly() or ops.inside_function():
      return resource_variable_ops.ResourceVariable.value(self)
    assign = gen_resource_variable_ops.assign_variable_op(self.handle, tf.constant(0.0))
    with tf.control_dependencies([assign]):
      # The variable's own read: a gradient tape (Keras' minimize in a graph) sees the access.
      return self._read_variable_op()  # noqa: SLF001

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    """Used as a tensor, a lookup's wrapper is its rows, as TFRA's wrapper holds them ([ids,
    dim]; the gradient reaches this wrapper). A ShadowVariable is the scalar it holds."""
    if self._ids is None or as_ref:
      return super()._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)
    return self.lookup(tf.reshape(self._ids, [-1]))

  @property
  def ids(self):
    """The ids of the wrapper's lookup; for a ShadowVariable, those of its last eager lookup (an
    empty tensor of the key dtype before one), as TFRA's ShadowVariable holds them."""
    if self._ids is not None:
      return self._ids
    last = getattr(self, "_last_ids", None)
    if last is None:
      return tf.zeros([0], self.params.key_dtype)
    return tf.reshape(tf.convert_to_tensor(last, self.params.key_dtype), [-1])

  def value(self):
    """As a tensor: a lookup's wrapper is its rows (so `wrapper * wrapper` multiplies rows, as
    with TFRA's wrapper), a ShadowVariable its scalar."""
    if self._ids is None:
      return super().value()
    return self._dense_var_to_tensor()

  def read_value(self, do_prefetch=True):
    """The rows of the wrapper's ids (TFRA's wrapper holds them): for a ShadowVariable, of its
    last eager lookup, none ([0, dim] of the value dtype) before one or after a checkpoint saved
    it, as TFRA's ShadowVariable holds them."""
    del do_prefetch
    ids = self._ids if self._ids is not None else getattr(self, "_last_ids", None)
    if ids is None:
      return tf.zeros([0, self.params.dim], self.params.value_dtype)
    return self.lookup(tf.reshape(ids, [-1]))

  def size(self):
    """The number of keys of the wrapper's Variable (int64 scalar)."""
    return self.params.size()

  def update_op(self, v0=None):
    """Writes the rows this wrapper's lookup read (`v0`, or read now, max_norm applied) into the
    table, as TFRA's does: its keys get rows. Training needs no such call: tf_ext's optimizer
    updates the table itself."""
    if self._ids is None:
      return tf.no_op()
    return self.params.upsert(self._ids, self.lookup(self._ids) if v0 is None else v0)

  def prefetch_values(self, update=False):
    """TFRA's read of the wrapper's rows from its table: the rows of the wrapper's ids."""
    del update
    return self.lookup(self._ids)

  def embedding_lookup(self, ids, name=None, max_norm=None):
    """(rows of `ids`, this wrapper): TFRA's lookup through an existing wrapper."""
    del name, max_norm
    return self.lookup(ids), self

  def lookup(self, ids):
    """The rows of `ids` through this wrapper (its max_norm applied). Eagerly, a
    ShadowVariable remembers the ids, as TFRA's does (its read_value gives their rows)."""
    if self._ids is None and tf.executing_eagerly():
      self._last_ids = ids
    rows = self.params.read_rows(ids, anchor=self)
    if self.max_norm is not None:
      rows = tf.clip_by_norm(rows, self.max_norm, axes=[-1])
    return rows


class _AsScalarVariable:
  """Within it, a ShadowVariable is the float32 scalar variable it is to TensorFlow's checkpoint,
  SavedModel and tf.function code (its dtype, and read_value), not the rows it stands for."""

  def __init__(self, shadow):
    self._shadow = shadow

  def __enter__(self):
    vars(self._shadow)["_tfra_as_variable"] = vars(self._shadow).get("_tfra_as_variable", 0) + 1

  def __exit__(self, *exc):
    vars(self._shadow)["_tfra_as_variable"] -= 1


class ShadowVariable(TrainableWrapper):
  """The trainable handle of `params` under `name`: Keras layers hold one as their weight, and the
  optimizer's var_list takes it. Lookups through it (`de.shadow_ops.embedding_lookup`) train
  `params`' rows.

  As TFRA's, its `dtype` is the rows' (`params.value_dtype`) and `read_value()` the rows of its
  last eager lookup; the variable itself is a float32 scalar (the lookups' gradient anchor), and
  TensorFlow's checkpoints, SavedModel and tf.function see it as such."""

  def __init__(
    self,
    params,
    name="ShadowVariable",
    max_norm=None,
    trainable=True,
    distribute_strategy=None,
    **kwargs,
  ):
    del distribute_strategy, kwargs
    if not isinstance(params, Variable):
      raise TypeError(f"params must be a de.Variable, got {type(params).__name__}")
    with _AsScalarVariable(self):
      super().__init__(
        params, max_norm=max_norm, trainable=trainable and params.trainable, name=name
      )
    params.trainable_store[name] = self

  @property
  def dtype(self):
    """The dtype of the rows (of params), as TFRA's ShadowVariable holds them."""
    if vars(self).get("_tfra_as_variable"):
      return self._dtype
    return self.params.value_dtype

  def read_value(self, do_prefetch=True):
    if vars(self).get("_tfra_as_variable"):
      return resource_variable_ops.ResourceVariable.read_value(self)
    return super().read_value(do_prefetch)

  read_value.__doc__ = TrainableWrapper.read_value.__doc__

  def _serialize_to_tensors(self):
    """A checkpoint saves the scalar; the rows of the last lookup are let go, as TFRA's
    ShadowVariable clears the rows it holds when it is saved."""
    self._last_ids = None
    with _AsScalarVariable(self):
      return super()._serialize_to_tensors()

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    with _AsScalarVariable(self):
      return super()._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)

  def __tf_tracing_type__(self, signature_context):
    with _AsScalarVariable(self):
      return super().__tf_tracing_type__(signature_context)

  @property
  def _type_spec(self):
    with _AsScalarVariable(self):
      return resource_variable_ops.VariableSpec.from_value(self)

  def _write_object_proto(self, proto, options):
    with _AsScalarVariable(self):
      return super()._write_object_proto(proto, options)

  def _export_to_saved_model_graph(self, *args, **kwargs):
    with _AsScalarVariable(self):
      return super()._export_to_saved_model_graph(*args, **kwargs)

  def _copy_trackable_to_cpu(self, object_map):
    with _AsScalarVariable(self):
      return super()._copy_trackable_to_cpu(object_map)


def _wrapper_for(params, ids, name, max_norm):
  """The wrapper a lookup named `name` trains through: in a TF1 graph a new TrainableWrapper per
  lookup (as TFRA makes one), placed with the ids; eagerly and in tf.function one ShadowVariable
  per name."""
  if not tf.executing_eagerly() and not ops.inside_function():
    if name is None:
      name = ops.get_default_graph().unique_name("_anonymous_trainable_store_key")
    with ops.colocate_with(ids, ignore_existing=True):
      wrapper = TrainableWrapper(
        params, ids, max_norm=max_norm, trainable=params.trainable, name=name
      )
    params.trainable_store[name] = wrapper
    return wrapper
  shadow = params.trainable_store.get(name)
  if shadow is None:
    shadow = ShadowVariable(params, name=name, max_norm=max_norm)
  return shadow


def single_params(params):
  """The one Variable (or wrapper) a lookup's `params` names, as TFRA checks it."""
  if isinstance(params, (list, tuple)):
    if len(params) > 1:
      raise ValueError("Only one params is allowed.")
    params = params[0]
  if not isinstance(params, (Variable, TrainableWrapper)):
    raise TypeError("params should be a Variable instance.")
  return params


def embedding_lookup(
  params,
  ids,
  partition_strategy=None,
  name=None,
  validate_indices=None,
  max_norm=None,
  return_trainable=False,
):
  """The rows of `ids` in the Variable `params`: ids.shape + [dim], trainable through the
  returned wrapper (`return_trainable=True`), which goes into the optimizer's var_list. Ops are
  named as TFRA names them: under `<variable scope>/<name>/`, the wrapper `<name>`."""
  del partition_strategy, validate_indices
  params = single_params(params)
  if isinstance(params, TrainableWrapper):
    rows = params.lookup(ids)
    return (rows, params) if return_trainable else rows
  ids = tf.convert_to_tensor(ids, None if tf.is_tensor(ids) else params.key_dtype, name="ids")
  if params.key_dtype != ids.dtype:
    raise TypeError(
      "params.key_dtype should be same with ids.dtype: {} vs. {}".format(
        params.key_dtype, ids.dtype
      )
    )
  if tf.executing_eagerly() and name is None:
    raise ValueError(
      "Must specify a name for dynamic_embedding.embedding_lookup when running eagerly. "
      "The `de.shadow_ops.embedding_lookup` is recommended in eager case."
    )
  scope = tf.compat.v1.get_variable_scope().name
  full_name = (f"{scope}/" if scope else "") + (f"{name}/" if name else "embedding_lookup/")
  with tf.compat.v1.name_scope(full_name):
    wrapper = _wrapper_for(params, ids, name, max_norm)
    rows = wrapper.lookup(ids)
  return (rows, wrapper) if return_trainable else rows

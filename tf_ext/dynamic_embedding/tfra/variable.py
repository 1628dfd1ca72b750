"""TFRA's `dynamic_embedding.Variable` and `get_variable`, each a group of tf_ext tables.

A Variable holds one tf_ext table per device of `devices` (TFRA's shards), named as TFRA names its
tables (`<name>_mht_<i>of<n>`), and routes keys to them with TFRA's `partitioner`. Training goes
through tf_ext: a lookup's gradient reaches the scalar TrainableWrapper (or ShadowVariable) that
the lookup read, keyed by the looked-up ids, and the optimizer wrapped by
`de.DynamicEmbeddingOptimizer` updates the rows and their slots inside the table
(tf_ext/dynamic_embedding/optimizer.py). Updates are applied as deltas inside the table, so TFRA's
`bp_v2=True` semantics hold either way.

Its reads are in variable_reads.py, its writes in variable_writes.py, its shards' devices and
partitioner in shards.py.
"""

import functools

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops, variable_scope
from tensorflow.python.trackable import base as trackable
from tensorflow.python.trackable import data_structures

from tf_ext.dynamic_embedding import alltoall
from tf_ext.dynamic_embedding import variable as table_lib
from tf_ext.dynamic_embedding.tfra import creators, dtypes, file_system, initial_rows, string_rows
from tf_ext.dynamic_embedding.tfra.model_mode import ModelMode as ModelMode
from tf_ext.dynamic_embedding.tfra.model_mode import enable_inference_mode as enable_inference_mode
from tf_ext.dynamic_embedding.tfra.model_mode import enable_train_mode as enable_train_mode
from tf_ext.dynamic_embedding.tfra.model_mode import get_model_mode as get_model_mode
from tf_ext.dynamic_embedding.tfra.shards import ShardedTarget, check_devices, default_partition_fn
from tf_ext.dynamic_embedding.tfra.trainable_wrapper import TrainableWrapper
from tf_ext.dynamic_embedding.tfra.variable_reads import AllToAllTableOfInitialRows, VariableReads
from tf_ext.dynamic_embedding.tfra.variable_writes import VariableWrites


class GraphKeys:
  """TFRA's (deprecated) collection names; Variables are not added to them, as in TFRA."""

  DYNAMIC_EMBEDDING_VARIABLES = "dynamic_embedding_variables"
  TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = "trainable_dynamic_embedding_variables"


class Variable(VariableReads, VariableWrites, trackable.Trackable):
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
    self.devices = check_devices(name, devices)
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
          AllToAllTableOfInitialRows,
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
    self._gradient_target = self._tables[0] if self.shard_num == 1 else ShardedTarget(self)
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

  # ---- reads (the others: VariableReads) ---------------------------------------------------

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

  def get_slot_variables(self, optimizer):
    """TFRA returns the optimizer's slot Variables. tf_ext keeps a row's slots in the row's own
    table entry (exported with `tables[i].export_with_slots()`), so there are none to return."""
    del optimizer
    return []

  def _scope_name(self):
    return self.name.split("/")[-1]


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

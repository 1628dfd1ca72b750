"""TFRA's FileSystemSaver over tf_ext tables: key and value files, and checkpoints that restore into
any number of shards.

Key and value files (`save_to_file_system` / `load_from_file_system` of a Variable's table or of
the Variable) are TFRA's: `<dirpath>/<file name>-keys` holds the keys and `-values` the rows,
raw, in the Variable's key and value dtypes and little-endian, row after row; a Variable's table
i of n is `<its name, _mht_<i>of<n>_rank<r>_size<s>>`. TFRA and `de.restore_from_tfra` read what
is written here, and these read theirs. The files hold keys and rows only, as a TFRA table does
(TFRA keeps an optimizer's slots in slot Variables of their own, tf_ext in each row's table
entry): a checkpoint keeps the slots too. Unlike TFRA's kernels, a table is exported whole before
it is written, files are read whole (`buffer_size` is accepted and unused), `dirpath_env` is read
when the op is made, and string keys are refused (TFRA's files of string keys hold its kernels'
in-memory strings).

A Variable created with `kv_creator=...Creator(saver=FileSystemSaver())` is checkpointed as one
group of tables (TableGroup): tf.compat.v1.train.Saver writes `<name, "/" as "_">_mht-slot_
initial_values` in the index, tf.train.Checkpoint, Keras and SavedModel the Variable's
`table_group`; each table streams into its snapshot file beside the checkpoint (rows, slots,
update counts), with a manifest that lists them. A Variable of as many tables restores each file
into its table; one of another number (or a FileSystemSaver of proc_size > 1, which keeps the keys
its partitioner gives proc_rank) restores every file into its first table and splits the rows and
their slots among its tables by its partitioner, as TFRA re-partitions its files: that split holds
the Variable's rows in memory once.
"""

import functools
import os
import re
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.saved_model import registration
from tensorflow.python.trackable import autotrackable, resource
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object

from tf_ext.dynamic_embedding import checkpoint as table_checkpoint
from tf_ext.dynamic_embedding.tfra import creators, dtypes

DIRPATH_ENV = "TFRA_SAVED_KV"
DEFAULT_BUFFER_SIZE = 4194304
KEYS_SUFFIX, VALUES_SUFFIX = "-keys", "-values"
_SHARD_PART = re.compile(r"_mht_([^/]*)of([^/]*)")
# The registered saver of table groups (tf.train.Checkpoint, Keras, SavedModel).
SAVER_NAME = "TfraTableGroup"


# ---- key and value files ------------------------------------------------------------------------


def _directory(dirpath, dirpath_env):
  """The directory: `dirpath_env`'s value where that environment variable is set, as TFRA's
  kernels read it (here when the op is made), else `dirpath`."""
  from_env = os.environ.get(dirpath_env) if dirpath_env else None
  return tf.convert_to_tensor(from_env if from_env else dirpath, tf.string)


def _path(directory, file_name):
  return tf.strings.join([tf.strings.regex_replace(directory, "/+$", ""), "/", file_name])


def _check_key_dtype(owner, key_dtype):
  if key_dtype == tf.string:
    raise TypeError(
      f"tf_ext.tfra {owner}: key and value files hold keys of a fixed size, and TFRA's files of "
      "string keys its kernels' in-memory strings; save a Variable of string keys with a "
      "checkpoint (tf.train.Checkpoint, tf.compat.v1.train.Saver) instead"
    )


def _write_files(paths, arrays, append):
  """Writes each array's bytes (little-endian) to its path, beside a temporary file renamed into
  place once written (appended to the path's current bytes with `append`)."""
  for path, array in zip(paths, arrays):
    path = np.asarray(path).item()
    path = path.decode() if isinstance(path, bytes) else str(path)
    tf.io.gfile.makedirs(os.path.dirname(path) or ".")
    temporary = f"{path}.tmp"
    with tf.io.gfile.GFile(temporary, "wb") as f:
      if append and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path, "rb") as old:
          while chunk := old.read(1 << 24):
            f.write(chunk)
      little = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
      f.write(np.ascontiguousarray(array, little).tobytes())
    tf.io.gfile.rename(temporary, path, overwrite=True)
  return np.int64(len(arrays))


def write_key_value_files(keys_path, values_path, keys, values, append_to_file=False):
  """The op that writes `keys` ([n]) and `values` ([n, dim]) as TFRA's key and value files."""
  written = tf.numpy_function(
    lambda k, v, kp, vp: _write_files([kp, vp], [k, v], append_to_file),
    [keys, values, keys_path, values_path],
    tf.int64,
    stateful=True,
    name="write_key_value_files",
  )
  return written.op if not tf.executing_eagerly() else None


def _item_bytes(dtype):
  return tf.as_dtype(dtype).size


def _decode(contents, dtype):
  """The values of `dtype` whose bytes are `contents` (a scalar string)."""
  dtype = tf.as_dtype(dtype)
  if dtype == tf.bfloat16:  # read as its 16 bits
    return tf.bitcast(tf.io.decode_raw(contents, tf.uint16), tf.bfloat16)
  return tf.io.decode_raw(contents, dtype)


def read_key_value_files(keys_paths, values_paths, key_dtype, value_dtype, dim):
  """(keys [n], values [n, dim]) of pairs of TFRA's key and value files (1-D string tensors, in
  pairs); InvalidArgumentError naming a pair whose sizes disagree."""
  keys_paths = tf.reshape(tf.convert_to_tensor(keys_paths, tf.string), [-1])
  values_paths = tf.reshape(tf.convert_to_tensor(values_paths, tf.string), [-1])
  read = lambda path: tf.io.read_file(path)  # noqa: E731
  key_contents = tf.map_fn(read, keys_paths, fn_output_signature=tf.string)
  value_contents = tf.map_fn(read, values_paths, fn_output_signature=tf.string)
  key_item, row_bytes = _item_bytes(key_dtype), _item_bytes(value_dtype) * dim
  key_bytes = tf.strings.length(key_contents)
  value_bytes = tf.strings.length(value_contents)
  whole = tf.logical_and(
    tf.equal(key_bytes % key_item, 0), tf.equal(key_bytes // key_item * row_bytes, value_bytes)
  )
  problem = (
    f"tf_ext.tfra: key and value files disagree (a file of {key_dtype.name} keys and one of as "
    f"many rows of {dim} {value_dtype.name} values are expected; truncated or of another dtype or "
    "dim?):"
  )
  bad = tf.where(tf.logical_not(whole))[:, 0]
  if tf.executing_eagerly():
    if bad.shape[0]:
      pairs = zip(tf.gather(keys_paths, bad).numpy(), tf.gather(values_paths, bad).numpy())
      named = "; ".join(f"{k.decode()} and {v.decode()}" for k, v in pairs)
      raise tf.errors.InvalidArgumentError(None, None, f"{problem} {named}")
    check = tf.no_op()
  else:
    data = [problem, tf.gather(keys_paths, bad), tf.gather(values_paths, bad)]
    check = tf.debugging.Assert(tf.reduce_all(whole), data, summarize=8)
  with tf.control_dependencies([check]):
    keys = _decode(tf.strings.reduce_join(key_contents), key_dtype)
    values = _decode(tf.strings.reduce_join(value_contents), value_dtype)
  return keys, tf.reshape(values, [-1, dim])


def shard_file_name(table_name, index, shard_num, proc_rank=0, proc_size=1):
  """TFRA's file name of table `index` of `shard_num` of a Variable on rank proc_rank."""
  return _SHARD_PART.sub(
    f"_mht_{index + 1}of{shard_num}_rank{proc_rank}_size{proc_size}", table_name, count=1
  )


def _save_table(
  table,
  dirpath,
  file_name=None,
  dirpath_env=DIRPATH_ENV,
  append_to_file=False,
  buffer_size=DEFAULT_BUFFER_SIZE,
  name=None,
):
  """Writes the table's keys and rows to `<dirpath>/<file_name>-keys` and `-values` (TFRA's
  files; file_name: the table's name by default), replacing them, or after their bytes with
  `append_to_file`. Returns the op (eagerly: None, once written)."""
  del buffer_size
  key_dtype, codec = table._tfra_file_layout  # noqa: SLF001
  _check_key_dtype(f"table '{table.name}'", key_dtype)
  with tf.name_scope(name or f"{table.name}_save_table"):
    path = _path(_directory(dirpath, dirpath_env), file_name or table.name)
    keys, values = table.export()
    return write_key_value_files(
      tf.strings.join([path, KEYS_SUFFIX]),
      tf.strings.join([path, VALUES_SUFFIX]),
      dtypes.to_stored(keys, key_dtype),
      codec.decode(values),
      append_to_file=append_to_file,
    )


def _load_table(
  table,
  dirpath,
  file_name=None,
  dirpath_env=DIRPATH_ENV,
  load_entire_dir=False,
  buffer_size=DEFAULT_BUFFER_SIZE,
  name=None,
):
  """Sets the rows of the keys in `<dirpath>/<file_name>-keys` and `-values` (as TFRA: other keys
  keep theirs). load_entire_dir: every pair of files in `dirpath` of the Variable whose tables'
  names this file name's `_mht_` ends (all its tables, ranks and sizes), all into this table."""
  del buffer_size
  key_dtype, codec = table._tfra_file_layout  # noqa: SLF001
  _check_key_dtype(f"table '{table.name}'", key_dtype)
  with tf.name_scope(name or f"{table.name}_load_table"):
    directory = _directory(dirpath, dirpath_env)
    file_name = file_name or table.name
    if load_entire_dir:
      cut = file_name.rfind("_mht_")
      stem = file_name[: cut + len("_mht_")] if cut >= 0 else file_name
      keys_paths = tf.io.matching_files(_path(directory, f"{stem}*{KEYS_SUFFIX}"))
    else:
      keys_paths = tf.strings.join([_path(directory, file_name), KEYS_SUFFIX])[None]
    values_paths = tf.strings.regex_replace(keys_paths, f"{KEYS_SUFFIX}$", VALUES_SUFFIX)
    keys, values = read_key_value_files(
      keys_paths, values_paths, key_dtype, codec.value_dtype, codec.dim
    )
    return table.insert(dtypes.to_stored(keys, table.key_dtype), codec.encode(values))


def attach(table, key_dtype, codec):
  """Gives a TFRA Variable's table TFRA's methods for key and value files,
  `table.save_to_file_system(dirpath, file_name=None, dirpath_env="TFRA_SAVED_KV",
  append_to_file=False, buffer_size=4194304, name=None)` and `table.load_from_file_system(dirpath,
  file_name=None, dirpath_env="TFRA_SAVED_KV", load_entire_dir=False, buffer_size=4194304,
  name=None)`: the files hold the keys in `key_dtype` and the rows `codec` decodes."""
  table._tfra_file_layout = (tf.as_dtype(key_dtype), codec)  # noqa: SLF001
  table.save_to_file_system = _method_of(table, _save_table)
  table.load_from_file_system = _method_of(table, _load_table)


def _method_of(table, function):
  """`function` bound to `table` by a weak reference (a bound method would keep the table alive
  in a reference cycle until the garbage collector runs, and with it the table's memory)."""
  table = weakref.ref(table)

  @functools.wraps(function)
  def method(*args, **kwargs):
    return function(table(), *args, **kwargs)

  return method


def _file_names(variable, proc_size, proc_rank, file_name_list):
  if file_name_list is not None:
    if len(file_name_list) != variable.shard_num:
      raise ValueError(
        f"tf_ext.tfra Variable '{variable.name}': file_name_list names {len(file_name_list)} "
        f"files for {variable.shard_num} tables"
      )
    return list(file_name_list)
  return [
    shard_file_name(table.name, index, variable.shard_num, proc_rank, proc_size)
    for index, table in enumerate(variable.tables)
  ]


def save_variable(variable, dirpath, proc_size, proc_rank, file_name_list, **kwargs):
  """Variable.save_to_file_system: each table's files, named by TFRA's rule."""
  names = _file_names(variable, proc_size, proc_rank, file_name_list)
  ops_ = [
    t.save_to_file_system(dirpath, file_name=n, **kwargs) for t, n in zip(variable.tables, names)
  ]
  return None if tf.executing_eagerly() else tf.group(ops_)


def load_variable(variable, dirpath, proc_size, proc_rank, file_name_list, **kwargs):
  """Variable.load_from_file_system: each table from its files, named by TFRA's rule."""
  names = _file_names(variable, proc_size, proc_rank, file_name_list)
  ops_ = [
    t.load_from_file_system(dirpath, file_name=n, **kwargs) for t, n in zip(variable.tables, names)
  ]
  return None if tf.executing_eagerly() else tf.group(ops_)


def variable_files(variable, directory):
  """(keys files, values files) of every table, rank and size of `variable` in `directory`."""
  stem = variable.name.replace("/", "_")
  keys_paths = tf.io.matching_files(_path(directory, f"{stem}_mht_*of*_rank*_size*{KEYS_SUFFIX}"))
  values_paths = tf.strings.regex_replace(keys_paths, f"{KEYS_SUFFIX}$", VALUES_SUFFIX)
  return keys_paths, values_paths


def _own_keys(variable, keys, proc_size, proc_rank):
  """Whether the Variable's partitioner gives each key (key_dtype) to proc_rank of proc_size."""
  if proc_size <= 1:
    return tf.ones(tf.shape(keys), tf.bool)
  ranks = tf.cast(variable.partition_fn(keys, proc_size), tf.int32)
  return tf.equal(ranks, proc_rank)


def load_variable_files(variable, dirpath, proc_size=1, proc_rank=0):
  """Variable.load_from_file_system_with_restore_function: the rows of every file of the Variable
  in `dirpath` (any number of tables, ranks and sizes) that its partitioner gives proc_rank of
  proc_size, set through the Variable, which routes them to its tables."""
  _check_key_dtype(f"Variable '{variable.name}'", variable.key_dtype)
  with tf.name_scope(f"{variable.name.replace('/', '_')}_load_files"):
    keys_paths, values_paths = variable_files(variable, _directory(dirpath, None))
    keys, values = read_key_value_files(
      keys_paths, values_paths, variable.key_dtype, variable.value_dtype, variable.dim
    )
    own = _own_keys(variable, keys, proc_size, proc_rank)
    return variable.upsert(tf.boolean_mask(keys, own), tf.boolean_mask(values, own))


# ---- checkpoints of a FileSystemSaver Variable: one group of tables -----------------------------


def saves_as_group(kv_creator, distribution):
  """Whether a Variable is checkpointed as a TableGroup: its kv_creator's saver is a
  FileSystemSaver (a table split across ranks saves its own part instead)."""
  return distribution is None and isinstance(
    getattr(kv_creator, "saver", None), creators.FileSystemSaver
  )


def _saver_config(variable):
  """(proc_size, proc_rank, save_path) of the Variable's FileSystemSaver ((1, 0, None) without)."""
  saver = getattr(variable.kv_creator, "saver", None)
  if not isinstance(saver, creators.FileSystemSaver):
    return 1, 0, None
  config = saver.config
  return int(config.proc_size), int(config.proc_rank), config.save_path


def restore_group(variable, name, prefix, verify_only=False):
  """The op that restores the group of tables `name` of the checkpoint at `prefix` (saved with
  any number of tables) into `variable`'s tables, then sets the rows of the Variable's key and
  value files beside the checkpoint (TableGroup says which). With verify_only, checks every table
  file in full and changes nothing."""
  tables = list(variable.tables)
  proc_size, _, _ = _saver_config(variable)
  if verify_only:
    return _verify_group(tables, name, prefix)
  manifest = _manifest(name, prefix)

  def each_into_its_table():
    with tf.control_dependencies([_restore_parts(tables, name, prefix)]):
      return tf.constant(True)

  def split_by_partitioner():
    merged = table_checkpoint.restore_snapshot(tables[0], manifest, prefix)
    with tf.control_dependencies([merged]):
      return _split_first_table(variable)

  if proc_size > 1:
    restored = split_by_partitioner()
  else:
    # The manifest's second line is its number of tables.
    count = tf.strings.to_number(tf.strings.split(tf.io.read_file(manifest), "\n")[1], tf.int32)
    restored = tf.cond(tf.equal(count, len(tables)), each_into_its_table, split_by_partitioner)
  with tf.control_dependencies([restored]):
    return _load_files_beside(variable, prefix)


def _manifest(name, prefix):
  return tf.strings.join([prefix, table_checkpoint.snapshot_suffix(name)])


def _verify_group(tables, name, prefix):
  """Checks every file of the group `name` in full (through its manifest); changes nothing."""
  return table_checkpoint.restore_snapshot(
    tables[0], _manifest(name, prefix), prefix, verify_only=True
  )


def _restore_parts(tables, name, prefix):
  """Restores the group's part i into table i (a group saved with as many tables)."""
  return tf.group(
    [
      table_checkpoint.restore_snapshot(
        table,
        tf.strings.join([prefix, table_checkpoint.snapshot_suffix(f"{name}/part_{index}")]),
        prefix,
      )
      for index, table in enumerate(tables)
    ]
  )


def _split_first_table(variable):
  """Replaces each table's content by the rows of the first table (which holds them all) that
  the partitioner gives it (of a FileSystemSaver's proc_rank of proc_size, those of the rank)."""
  tables = list(variable.tables)
  proc_size, proc_rank, _ = _saver_config(variable)
  keys, values, slots, counts, steps, initial = tables[0].export_with_slots()
  entries = [keys, values, slots, counts, steps]
  if proc_size > 1:
    own = _own_keys(variable, dtypes.to_stored(keys, variable.key_dtype), proc_size, proc_rank)
    entries = [tf.boolean_mask(e, own) for e in entries]
  parts = variable.partition(entries[0])
  split = [tf.dynamic_partition(e, parts, len(tables)) for e in entries]
  imported = [
    table.import_with_slots(*[s[index] for s in split], initial)
    for index, table in enumerate(tables)
  ]
  with tf.control_dependencies(imported):
    return tf.constant(True)


def _load_files_beside(variable, prefix):
  """Sets the rows of the rank's keys in the Variable's key and value files beside the checkpoint
  at `prefix` (none there: nothing)."""
  if variable.key_dtype == tf.string:  # TFRA's files of string keys are not read
    return tf.constant(True)
  proc_size, proc_rank, save_path = _saver_config(variable)
  if save_path:
    files = variable_files(variable, tf.constant(save_path))
  else:
    parent = tf.strings.regex_replace(prefix, "/[^/]*$", "")
    step = tf.strings.regex_replace(prefix, "^.*?(-([0-9]+))?$", "\\2")
    stepped = variable_files(variable, tf.strings.join([parent, "/TFRADynamicEmbedding-", step]))
    plain = variable_files(variable, tf.strings.join([parent, "/TFRADynamicEmbedding"]))
    has_step = tf.logical_and(tf.strings.length(step) > 0, tf.size(stepped[0]) > 0)
    files = tf.cond(has_step, lambda: stepped, lambda: plain)
  keys, values = read_key_value_files(
    *files, variable.key_dtype, variable.value_dtype, variable.dim
  )
  own = _own_keys(variable, keys, proc_size, proc_rank)
  upserted = variable.upsert(tf.boolean_mask(keys, own), tf.boolean_mask(values, own))
  with tf.control_dependencies([upserted] if upserted is not None else []):
    return tf.constant(True)


def group_name(variable_name):
  """The name under which a Variable's tables are saved together (its tables' names are
  `<group name>_<i>of<n>`)."""
  return f"{variable_name.replace('/', '_')}_mht"


class TableGroup(trackable.Trackable):
  """The tables of a Variable saved with FileSystemSaver, checkpointed together (so that they
  restore into any number of tables). The tables stay the Variable's children (`tables`) for
  SavedModel exports; tf_ext's table saver leaves them to this group.

  A restore also sets the rows of TFRA's key and value files of the Variable that other ranks
  wrote beside the checkpoint (TFRA's multi-process flow: rank 0 saves the checkpoint, each other
  rank its part with `save_to_file_system(dirpath, proc_size, proc_rank)`), in the directory of
  the FileSystemSaver's `save_path`, else `TFRADynamicEmbedding-<step>` or `TFRADynamicEmbedding`
  beside the checkpoint, as TFRA names it; their rows' slots start at their initial values."""

  def __init__(self, variable):
    self._variable = weakref.ref(variable)
    self._tables = list(variable.tables)
    self.name = group_name(variable.name)
    for index, table in enumerate(self._tables):
      setattr(table, table_checkpoint.SAVED_WITH_GROUP, True)
      # Its children, so that tf.saved_model.load revives the group with its tables.
      self._track_trackable(table, f"part_{index}")
    if not tf.executing_eagerly():
      # One saveable for the group in the graph's default list, instead of one per table.
      saveables = ops.get_collection_ref(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
      saveables[:] = [s for s in saveables if getattr(s, "op", None) not in self._tables]
      saveables.append(GroupSaveable(self, self.name))

  @property
  def tables(self):
    return list(self._tables)

  def _gather_saveables_for_checkpoint(self):
    graph = getattr(self._tables[0], "saver_graph", None)
    return table_checkpoint.saver_list_saveables(self, graph, GroupSaveable)

  def save(self, name, prefix):
    """Streams each table into its file beside the checkpoint at `prefix`, then the manifest;
    [(rows, slot_initial_values)] of each table once written."""
    return table_checkpoint.save_group(self._tables, name, prefix)

  def restore(self, name, prefix, verify_only=False):
    """restore_group of the Variable."""
    return restore_group(self._variable(), name, prefix, verify_only)


class GroupSaveable(saveable_object.SaveableObject):
  """What tf.compat.v1.train.Saver saves of a TableGroup: its one tensor, `<name>-slot_initial_
  values` (computing it streams the tables and writes the manifest); restoring reads the tables
  back into any number of tables, once every file of the Saver's tables is checked."""

  def __init__(self, group, name):
    self._group = group
    self._suffix = table_checkpoint.snapshot_suffix(name)
    self._group_name = name
    tables = group.tables

    def save_tables():
      prefix = table_checkpoint.saver_prefix()
      return group.save(name, prefix)[0][1]

    spec = saveable_object.SaveSpec(
      save_tables, "", f"{name}-slot_initial_values", dtype=tf.float32, device=tables[0].device
    )
    # Named after the first table's op, as tf_ext's table saveables are (an exported meta graph
    # lists its saveables by op name).
    super().__init__(group, [spec], tables[0].resource_handle.op.name)

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes
    return table_checkpoint.restore_beside(
      restored_tensors,
      self._suffix,
      lambda path, prefix, verify_only: self._group.restore(self._group_name, prefix, verify_only),
    )


def _revived_tables(obj):
  """The tables of a TableGroup that tf.saved_model.load revived without tf_ext.tfra's classes
  (an object whose children part_0, part_1, ... are restored tables), or None."""
  if isinstance(obj, TableGroup) or not isinstance(obj, autotrackable.AutoTrackable):
    return None
  if isinstance(obj, resource.RestoredResource):
    return None
  tables = []
  while isinstance(vars(obj).get(f"part_{len(tables)}"), resource.RestoredResource):
    tables.append(vars(obj)[f"part_{len(tables)}"])
  return tables or None


class _RevivedGroup:
  """A revived TableGroup (a loaded SavedModel's): its tables restore from their own files (a
  SavedModel restores into the tables it was saved with)."""

  def __init__(self, tables):
    self.tables = tables

  def save(self, name, prefix):
    return table_checkpoint.save_group(self.tables, name, prefix)

  def restore(self, name, prefix, verify_only=False):
    if verify_only:
      return _verify_group(self.tables, name, prefix)
    return _restore_parts(self.tables, name, prefix)


def _group_of(obj):
  if isinstance(obj, TableGroup):
    return obj
  return _RevivedGroup(_revived_tables(obj))


def _save_groups(trackables, file_prefix):
  """The registered saver: streams each group beside the final checkpoint; a small index shard."""

  def save_one(object_name, group, final_prefix):
    saved = _group_of(group).save(object_name, final_prefix)
    return tf.add_n([table_rows for table_rows, _ in saved])

  return table_checkpoint.write_index_shard(trackables, file_prefix, SAVER_NAME, save_one)


def _restore_groups(trackables, merged_prefix):
  table_checkpoint.restore_verified(
    trackables,
    merged_prefix,
    lambda name, group, prefix, verify_only: _group_of(group).restore(name, prefix, verify_only),
    "tf_ext.tfra: tf.train.Checkpoint cannot restore a FileSystemSaver Variable's tables",
  )


registration.register_checkpoint_saver(
  package=table_checkpoint.SAVER_PACKAGE,
  name=SAVER_NAME,
  predicate=lambda obj: isinstance(obj, TableGroup) or _revived_tables(obj) is not None,
  save_fn=_save_groups,
  restore_fn=_restore_groups,
)

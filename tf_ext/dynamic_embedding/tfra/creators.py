"""TFRA's storage choices (`kv_creator=`) and savers, mapped onto tf_ext's tables.

- CuckooHashTableCreator: tf_ext's CPU table.
- HkvHashTableCreator: tf_ext's GPU table where the Variable's device is a GPU; on a machine without
  one the table stays on the CPU, as TFRA's HKV tables then do.
- RedisTableCreator: refused by name. tf_ext keeps no table in an external store.
- FileSystemSaver: the Variable's tables are checkpointed together, so that they restore into
  any number of tables (file_system.py); TFRA's key and value files are written and read by
  save_to_file_system / load_from_file_system, restore_from_tfra and the converter.
"""

import enum
import warnings

# HKV's defaults in TFRA 0.7.2 (dynamic_embedding_creator.py).
_HKV_INIT_CAPACITY = 1024 * 1024
_HKV_MAX_CAPACITY = 1024 * 1024 * 1024
_HKV_MAX_HBM_FOR_VALUES = 0


class KVCreator:
  """Base of the storage creators a Variable takes as `kv_creator`."""

  def __init__(self, config=None, saver=None):
    if saver is not None and not isinstance(saver, DynamicEmbeddingSaver):
      raise RuntimeError(
        "The initialization argument 'saver' for class KVCreator must be a class inheriting "
        "DynamicEmbeddingSaver."
      )
    self.config = config
    self.saver = saver

  # What the Variable reads: whether its tables belong on a GPU when it has one.
  prefers_gpu = False

  def check(self, variable_name):
    """Raises for a configuration tf_ext cannot honour (by default: none)."""
    del variable_name

  def get_config(self):
    return {"config": self.config}


class CuckooHashTableConfig:
  """TFRA's Cuckoo table takes no settings."""


class CuckooHashTableCreator(KVCreator):
  """tf_ext's CPU table (TFRA's default storage)."""


class HkvEvictStrategy(enum.IntEnum):
  LRU = 0
  LFU = 1
  EPOCHLRU = 2
  EPOCHLFU = 3
  CUSTOMIZED = 4


class HkvHashTableConfig:
  """HierarchicalKV's settings. tf_ext's GPU table grows as needed (init_capacity is a hint) and
  never evicts on insert: `max_capacity` below HKV's default is honoured by eviction, which tf_ext
  runs when asked (Variable.restrict, a table's evict())."""

  def __init__(
    self,
    init_capacity=_HKV_INIT_CAPACITY,
    max_capacity=_HKV_MAX_CAPACITY,
    max_hbm_for_values=_HKV_MAX_HBM_FOR_VALUES,
    evict_strategy=HkvEvictStrategy.LRU,
    step_per_epoch=0,
    gen_scores_fn=None,
    reserved_key_start_bit=0,
  ):
    self.init_capacity = init_capacity
    self.max_capacity = max_capacity
    self.max_hbm_for_values = max_hbm_for_values
    self.evict_strategy = evict_strategy
    self.step_per_epoch = step_per_epoch
    self.gen_scores_fn = gen_scores_fn
    self.reserved_key_start_bit = reserved_key_start_bit


class HkvHashTableCreator(KVCreator):
  """tf_ext's GPU table on a GPU; its CPU table where the Variable is on the CPU."""

  prefers_gpu = True

  def check(self, variable_name):
    config = self.config
    if config is None:
      return
    if config.evict_strategy == HkvEvictStrategy.CUSTOMIZED or config.gen_scores_fn is not None:
      raise NotImplementedError(
        f"tf_ext.tfra Variable '{variable_name}': HkvHashTableConfig with customized scores "
        "(evict_strategy=CUSTOMIZED, gen_scores_fn) is not offered; tf_ext evicts by last update "
        "(Variable.restrict with TimestampRestrictPolicy) or by update count "
        "(FrequencyRestrictPolicy)"
      )
    if config.max_capacity < _HKV_MAX_CAPACITY:
      warnings.warn(
        f"tf_ext.tfra Variable '{variable_name}': HKV evicts on insert past max_capacity="
        f"{config.max_capacity}; a tf_ext table grows past it until Variable.restrict() (or "
        "tf_ext.train.EvictionHook) runs",
        stacklevel=3,
      )


class RedisTableConfig:
  """Accepted so that configuration code imports; a RedisTableCreator is refused."""

  def __init__(self, *args, **kwargs):
    self.args, self.kwargs = args, kwargs


class RedisTableCreator(KVCreator):
  def __init__(self, config=None, saver=None):
    raise NotImplementedError(
      "tf_ext.tfra: RedisTableCreator is not offered: tf_ext keeps no table in Redis. Use the "
      "default CuckooHashTableCreator (a table in this process), parameter-server sharding "
      "(tf_ext.get_dynamic_embedding_variable(..., num_shards=N) under replica_device_setter) or "
      "tables split across Horovod ranks (de.keras.layers.HvdAllToAllEmbedding)"
    )


class DynamicEmbeddingSaver:
  """Base of TFRA's savers."""


class FileSystemSaverConfig:
  def __init__(self, proc_size=None, proc_rank=None, save_path=None, buffer_size=None):
    for name, value in (("proc_size", proc_size), ("proc_rank", proc_rank)):
      if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} of FileSystemSaverConfig must be an int, got {value!r}")
    self.proc_size = proc_size or 1
    self.proc_rank = proc_rank or 0
    self.save_path = save_path
    self.buffer_size = buffer_size or 4194304


class FileSystemSaver(DynamicEmbeddingSaver):
  """`KVCreator(saver=FileSystemSaver(proc_size, proc_rank, save_path))`: the Variable's tables are
  checkpointed together (each streamed into its file beside the checkpoint, with their slots), and
  restore into a Variable of any number of tables, split by its partitioner, as TFRA's files do;
  with proc_size > 1 the Variable keeps the keys its partitioner gives proc_rank. A restore also
  sets the rows of the TFRA key and value files of the Variable that other ranks wrote beside the
  checkpoint with `save_to_file_system` (in `save_path`, else `TFRADynamicEmbedding[-<step>]`).
  tf_ext/dynamic_embedding/tfra/file_system.py says how; buffer_size is accepted and unused."""

  def __init__(self, proc_size=1, proc_rank=0, save_path=None, buffer_size=4194304):
    self.config = FileSystemSaverConfig(proc_size, proc_rank, save_path, buffer_size)

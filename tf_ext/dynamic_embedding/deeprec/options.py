"""DeepRec's EmbeddingVariable options, and what each becomes on a tf_ext table.

DeepRec (Alibaba's TF 1.15 fork) configures an EmbeddingVariable with these classes (there
tf.EmbeddingVariableOption, tf.CounterFilter, ...). They are plain records, as in DeepRec;
`resolve` turns them into a tf_ext.FrequencyAdmission and a tf_ext.EvictionPolicy, raising for
what tf_ext cannot honour, with the argument's name and what to use instead.

- CounterFilter(filter_freq) -> FrequencyAdmission(filter_freq, exact=True).
- CBFFilter(filter_freq, max_element_size=n, false_positive_probability=p) ->
  FrequencyAdmission(filter_freq), a count-min sketch with the counting Bloom filter's counters:
  m = ceil(-n ln p / ln(2)^2) counters and k = round(m / n ln 2) hashes become k rows (at most 16)
  of ceil(m / k) counters, rounded up to a power of two and to at least 1024 per row, 32 bits
  each. Without n and p: tf_ext's default sketch (1 MiB).
- GlobalStepEvict(steps_to_live=s) -> EvictionPolicy(ttl_steps=s + 1): DeepRec removes a row
  when global_step - its last update step > s, tf_ext when now - last update >= ttl.
- L2WeightEvict(l2_weight_threshold=t) -> EvictionPolicy(min_l2_norm=sqrt(2 t)): DeepRec's "L2
  weight" is 0.5 * sum(w^2) < t, tf_ext's test is ||w|| < min_l2_norm.
"""

import collections
import math
import numbers

import tensorflow as tf

from tf_ext.dynamic_embedding import lifecycle

# DeepRec's counter types of a CBFFilter; tf_ext's sketch counts in 32 bits whatever is asked.
_COUNTER_TYPES = (tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.int8, tf.int16, tf.int32, tf.int64)
_SKETCH_COUNTER_BYTES = 4
_MIN_SKETCH_WIDTH = 1024
_MAX_SKETCH_DEPTH = 16
_DEFAULT_STORAGE_SIZE = 1024 * 1024 * 1024


def _is_int(value):
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


class StorageType:
  """DeepRec's storage tiers (tensorflow.embedding.StorageType of its config.proto).

  tf_ext offers DRAM (and DEFAULT, which is DRAM): a table lives in host memory, or, opt-in, in
  GPU memory when created under tf.device("/GPU:0") with TF_EXT_GPU_TABLES=1 set
  (docs/dynamic_embedding.md, GPU tables). The multi-tier ones (PMEM, SSD, LevelDB, HBM caches)
  are not offered: StorageOption raises NotImplementedError for them.
  """

  DEFAULT = 0
  DRAM = 1
  PMEM_MEMKIND = 2
  PMEM_LIBPMEM = 3
  SSDHASH = 4
  LEVELDB = 5
  HBM = 6
  DRAM_PMEM = 11
  DRAM_SSDHASH = 12
  HBM_DRAM = 13
  DRAM_LEVELDB = 14
  DRAM_PMEM_SSDHASH = 101
  HBM_DRAM_SSDHASH = 102

  @classmethod
  def Name(cls, value):  # noqa: N802 (protobuf's enum wrappers spell it so)
    """The name of a storage type's value, as DeepRec's protobuf enum gives it."""
    for name, member in vars(cls).items():
      if name.isupper() and member == value:
        return name
    raise ValueError(f"tf_ext.deeprec: unknown StorageType value {value!r}")


class CacheStrategy:
  """DeepRec's cache strategies between storage tiers (tensorflow.embedding.CacheStrategy)."""

  LRU = 0
  LFU = 1


class StorageOption:
  """Where DeepRec keeps an EmbeddingVariable's rows. Only DRAM (the default) is offered.

  storage_size and cache_strategy size and order DeepRec's tiers; with DRAM alone there is one
  tier holding every row, so they are accepted and unused (bound a table's rows with
  tf_ext.EvictionPolicy(max_size=...)). layout is DeepRec's in-memory row layout, a hint.
  """

  def __init__(
    self,
    storage_type=None,
    storage_path=None,
    storage_size=None,
    cache_strategy=CacheStrategy.LFU,
    layout=None,
  ):
    if storage_type not in (None, StorageType.DEFAULT, StorageType.DRAM):
      raise NotImplementedError(
        f"tf_ext.deeprec: StorageOption storage_type={_storage_name(storage_type)} is not "
        "offered; tf_ext offers StorageType.DRAM (host memory), and GPU memory for a table "
        'created under tf.device("/GPU:0") with TF_EXT_GPU_TABLES=1 (docs/dynamic_embedding.md, '
        "GPU tables); multi-tier storage (PMEM, SSD, LevelDB, HBM caches) is not offered"
      )
    if storage_path is not None:
      raise NotImplementedError(
        f"tf_ext.deeprec: StorageOption storage_path={storage_path!r} is the directory of "
        "DeepRec's SSD or LevelDB tier, which tf_ext does not offer; leave it unset (DRAM)"
      )
    if storage_size is None:
      storage_size = [_DEFAULT_STORAGE_SIZE]
    if not isinstance(storage_size, list):
      raise ValueError(
        f"tf_ext.deeprec: StorageOption storage_size must be a list, got {storage_size!r}"
      )
    if cache_strategy not in (CacheStrategy.LRU, CacheStrategy.LFU):
      raise ValueError(
        "tf_ext.deeprec: StorageOption cache_strategy must be CacheStrategy.LRU or LFU, got "
        f"{cache_strategy!r}"
      )
    self.storage_type = storage_type
    self.storage_path = storage_path
    self.storage_size = storage_size
    self.cache_strategy = cache_strategy
    self.layout = layout


def _storage_name(value):
  try:
    return f"StorageType.{StorageType.Name(value)}"
  except ValueError:
    return repr(value)


class InitializerOption:
  """The initial rows of an EmbeddingVariable.

  Args:
    initializer: used instead of get_embedding_variable's `initializer` when given.
    default_value_dim: DeepRec draws this many initial rows once and gives id i the row
      i mod default_value_dim. tf_ext computes each id's row from (id, seed) instead, so no two
      ids share one; the value is still the fan-in of a variance-scaling initializer (glorot,
      he, lecun), as in DeepRec's [default_value_dim, embedding_dim] matrix.
    default_value_no_permission: the row of an id that the feature filter has not admitted
      yet, read by tf_ext.deeprec's lookups (tf_ext's own lookups read its initial row).
  """

  def __init__(self, initializer=None, default_value_dim=4096, default_value_no_permission=0.0):
    if not _is_int(default_value_dim) or default_value_dim <= 0:
      raise ValueError(
        "tf_ext.deeprec: InitializerOption default_value_dim must be a positive int, got "
        f"{default_value_dim!r}"
      )
    if not _is_number(default_value_no_permission):
      raise ValueError(
        "tf_ext.deeprec: InitializerOption default_value_no_permission must be a number, got "
        f"{default_value_no_permission!r}"
      )
    self.initializer = initializer
    self.default_value_dim = int(default_value_dim)
    self.default_value_no_permission = float(default_value_no_permission)


class GlobalStepEvict:
  """Evict a row not updated for more than `steps_to_live` global steps (None or 0: off)."""

  def __init__(self, steps_to_live=None):
    self.steps_to_live = steps_to_live


class L2WeightEvict:
  """Evict a row whose 0.5 * sum(w^2) is below `l2_weight_threshold` (-1.0: off)."""

  def __init__(self, l2_weight_threshold=-1.0):
    self.l2_weight_threshold = l2_weight_threshold


class CheckpointOption:
  """DeepRec's loading of an EmbeddingVariable from a given checkpoint: not offered.

  get_embedding_variable raises NotImplementedError when an EmbeddingVariableOption carries
  one; restore tables with tf.compat.v1.train.Saver (or tf_ext.deeprec.Saver) instead.
  """

  def __init__(
    self,
    ckpt_to_load_from=None,
    tensor_name_in_ckpt=None,
    always_load_from_specific_ckpt=False,
    init_data_source=None,
  ):
    self.ckpt_to_load_from = ckpt_to_load_from
    self.tensor_name_in_ckpt = tensor_name_in_ckpt
    self.always_load_from_specific_ckpt = always_load_from_specific_ckpt
    self.init_data_source = init_data_source


class CounterFilter:
  """Admit an id at its `filter_freq`-th training update, counted exactly (0: no filter)."""

  def __init__(self, filter_freq=0):
    self.filter_freq = filter_freq


class CBFFilter:
  """Admit an id at its `filter_freq`-th training update, counted in a counting Bloom filter
  sized for `max_element_size` ids at `false_positive_probability` (a count-min sketch here)."""

  def __init__(
    self,
    filter_freq=0,
    max_element_size=0,
    false_positive_probability=-1.0,
    counter_type=tf.uint64,
  ):
    # DeepRec's checks, at construction as there.
    if false_positive_probability != -1.0:
      if not _is_number(false_positive_probability) or not 0.0 < false_positive_probability < 1.0:
        raise ValueError(
          "tf_ext.deeprec: CBFFilter false_positive_probability must be in (0, 1) (or -1.0: "
          f"tf_ext's default sketch), got {false_positive_probability!r}"
        )
      if not _is_int(max_element_size) or max_element_size <= 0:
        raise ValueError(
          "tf_ext.deeprec: CBFFilter max_element_size must be a positive int when "
          f"false_positive_probability is set, got {max_element_size!r}"
        )
    elif max_element_size != 0:
      raise ValueError(
        "tf_ext.deeprec: CBFFilter max_element_size can't be set when "
        "false_positive_probability is -1.0"
      )
    try:
      counter_dtype = tf.as_dtype(counter_type)
    except TypeError:
      counter_dtype = None
    if counter_dtype not in _COUNTER_TYPES:
      raise ValueError(
        "tf_ext.deeprec: CBFFilter counter_type must be an integer dtype (tf.uint64, tf.uint32, "
        f"tf.uint16, tf.uint8, ...), got {counter_type!r}"
      )
    self.filter_freq = filter_freq
    self.max_element_size = max_element_size
    self.false_positive_probability = false_positive_probability
    self.counter_type = counter_dtype


class EmbeddingVariableOption:
  """The options of an EmbeddingVariable; the attributes keep DeepRec's names.

  Args:
    ht_type: DeepRec's hash map implementation; tf_ext tables have their own, so only "" is
      accepted.
    ht_partition_num: the lock partitions of DeepRec's hash map, a hint (tf_ext's table locks
      its own way).
    evict_option: a GlobalStepEvict or L2WeightEvict.
    ckpt: a CheckpointOption: not offered (NotImplementedError at get_embedding_variable).
    filter_option: a CounterFilter or CBFFilter.
    storage_option: a StorageOption (DRAM only).
    init_option: an InitializerOption.
  """

  def __init__(
    self,
    ht_type="",
    ht_partition_num=1000,
    evict_option=None,
    ckpt=None,
    filter_option=None,
    storage_option=None,
    init_option=None,
  ):
    self.ht_type = ht_type
    self.ht_partition_num = ht_partition_num
    self.evict = evict_option
    self.ckpt = ckpt
    self.filter_strategy = filter_option
    self.storage_option = storage_option if storage_option is not None else StorageOption()
    self.init = init_option if init_option is not None else InitializerOption()


Resolved = collections.namedtuple(
  "Resolved", ["admission", "eviction", "filtered", "default_value_no_permission", "init"]
)
"""What an EmbeddingVariableOption (and get_embedding_variable's steps_to_live) asks of a table:
its tf_ext.FrequencyAdmission and tf_ext.EvictionPolicy (or None), whether a feature filter is on
(tf_ext.deeprec's lookups then read `default_value_no_permission` for ids not admitted yet), and
the InitializerOption."""


def sketch_of(cbf):
  """FrequencyAdmission's sketch_depth and sketch_bytes for a CBFFilter ({} without sizing)."""
  n, p = cbf.max_element_size, cbf.false_positive_probability
  if p == -1.0:
    return {}
  counters = math.ceil(-n * math.log(p) / math.log(2) ** 2)
  depth = min(max(1, round(counters / n * math.log(2))), _MAX_SKETCH_DEPTH)
  per_row = math.ceil(counters / depth)
  width = max(_MIN_SKETCH_WIDTH, 1 << (per_row - 1).bit_length())
  return {"sketch_depth": depth, "sketch_bytes": width * _SKETCH_COUNTER_BYTES * depth}


def _admission(filter_option, trainable):
  if filter_option is None:
    return None
  if not isinstance(filter_option, (CounterFilter, CBFFilter)):
    raise TypeError(
      "tf_ext.deeprec: EmbeddingVariableOption filter_option must be a CounterFilter or "
      f"CBFFilter, got {type(filter_option).__name__}"
    )
  freq = filter_option.filter_freq
  kind = type(filter_option).__name__
  if not _is_int(freq) or freq < 0:
    raise ValueError(f"tf_ext.deeprec: {kind} filter_freq must be an int >= 0, got {freq!r}")
  if freq == 0:  # DeepRec: a filter of frequency 0 is no filter
    return None
  if not trainable:
    raise ValueError(
      f"tf_ext.deeprec: {kind} admits ids at their training updates, and the EmbeddingVariable "
      "is not trainable (trainable=False); drop filter_option"
    )
  if isinstance(filter_option, CounterFilter):
    return lifecycle.FrequencyAdmission(int(freq), exact=True)
  return lifecycle.FrequencyAdmission(int(freq), **sketch_of(filter_option))


def _steps_to_live(evict_option, steps_to_live):
  """The steps_to_live in force: GlobalStepEvict's wins over the argument, as in DeepRec."""
  if isinstance(evict_option, GlobalStepEvict):
    if steps_to_live is not None and steps_to_live != evict_option.steps_to_live:
      tf.compat.v1.logging.warning(
        "tf_ext.deeprec: steps_to_live is set twice; GlobalStepEvict's (%s) is used",
        evict_option.steps_to_live,
      )
    steps_to_live = evict_option.steps_to_live
  if steps_to_live is None or steps_to_live == 0:
    return None
  if not _is_int(steps_to_live) or steps_to_live < 0:
    raise ValueError(
      f"tf_ext.deeprec: steps_to_live must be a positive int (or None), got {steps_to_live!r}"
    )
  return int(steps_to_live)


def _l2_threshold(evict_option):
  if not isinstance(evict_option, L2WeightEvict):
    return None
  threshold = evict_option.l2_weight_threshold
  if threshold == -1.0:
    return None
  if not _is_number(threshold) or not threshold > 0:
    # DeepRec warns and turns the eviction off; an error says so instead of running without it.
    raise ValueError(
      "tf_ext.deeprec: L2WeightEvict l2_weight_threshold must be > 0 (or -1.0: off), got "
      f"{threshold!r}"
    )
  return float(threshold)


def _eviction(evict_option, steps_to_live, trainable):
  if evict_option is not None and not isinstance(evict_option, (GlobalStepEvict, L2WeightEvict)):
    raise TypeError(
      "tf_ext.deeprec: EmbeddingVariableOption evict_option must be a GlobalStepEvict or "
      f"L2WeightEvict, got {type(evict_option).__name__}"
    )
  live = _steps_to_live(evict_option, steps_to_live)
  threshold = _l2_threshold(evict_option)
  if live is not None and threshold is not None:
    raise ValueError(
      "tf_ext.deeprec: steps_to_live and l2_weight_threshold can't be enabled at the same time"
    )
  if live is not None:
    if not trainable:
      raise ValueError(
        "tf_ext.deeprec: eviction by steps_to_live judges rows by their training updates, and "
        "the EmbeddingVariable is not trainable (trainable=False)"
      )
    return lifecycle.EvictionPolicy(ttl_steps=live + 1)
  if threshold is not None:
    return lifecycle.EvictionPolicy(min_l2_norm=math.sqrt(2.0 * threshold))
  return None


def resolve(ev_option, steps_to_live, trainable):
  """The Resolved options of `ev_option` (None: EmbeddingVariableOption()) for a table."""
  if ev_option is None:
    ev_option = EmbeddingVariableOption()
  if not isinstance(ev_option, EmbeddingVariableOption):
    raise TypeError(
      "tf_ext.deeprec: ev_option must be a tf_ext.deeprec.EmbeddingVariableOption, got "
      f"{type(ev_option).__name__}"
    )
  if ev_option.ht_type not in ("", None):
    raise NotImplementedError(
      f"tf_ext.deeprec: EmbeddingVariableOption ht_type={ev_option.ht_type!r} picks DeepRec's "
      "hash map; tf_ext tables have their own hash table: leave ht_type unset"
    )
  if not _is_int(ev_option.ht_partition_num) or ev_option.ht_partition_num <= 0:
    raise ValueError(
      "tf_ext.deeprec: EmbeddingVariableOption ht_partition_num must be a positive int, got "
      f"{ev_option.ht_partition_num!r}"
    )
  if ev_option.ckpt is not None:
    raise NotImplementedError(
      "tf_ext.deeprec: EmbeddingVariableOption ckpt (CheckpointOption: loading the variable "
      "from a given checkpoint) is not offered; restore tables with tf.compat.v1.train.Saver "
      "(or tf_ext.deeprec.Saver), or insert rows with ev.insert(keys, values)"
    )
  if not isinstance(ev_option.storage_option, StorageOption):
    raise TypeError(
      "tf_ext.deeprec: EmbeddingVariableOption storage_option must be a StorageOption, got "
      f"{type(ev_option.storage_option).__name__}"
    )
  init = ev_option.init
  if not isinstance(init, InitializerOption):
    raise TypeError(
      "tf_ext.deeprec: EmbeddingVariableOption init_option must be an InitializerOption, got "
      f"{type(init).__name__}"
    )
  admission = _admission(ev_option.filter_strategy, trainable)
  eviction = _eviction(ev_option.evict, steps_to_live, trainable)
  return Resolved(
    admission, eviction, admission is not None, init.default_value_no_permission, init
  )

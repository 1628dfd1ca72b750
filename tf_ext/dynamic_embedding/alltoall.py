"""AllToAllDynamicEmbeddingVariable: one table split across Horovod (or tf_ext.lightcc) ranks.

Each rank holds the rows of the ids it owns: rank `TfExtShardOf(id, size)` (the frozen hash of
`num_shards`). It is created with `distribution="alltoall"` after `hvd.init()`.

- Lookup (a collective: every rank looks the table up in the same order): the ids are
  deduplicated and grouped by owner in one op (TfExtDistinctByShard), sent to their owners
  (Horovod's alltoall with splits), looked up there in the owner's local table, and the rows sent
  back (alltoall) and put back in the ids' order. String keys travel as their bytes (a byte
  buffer and each key's length), so keys are compared whole.
- Backward: the gradient of the rows goes back to the owners through the alltoall's gradient; the
  owner's lookup turns it into an IndexedSlices gradient of its anchor (every rank's gradients of
  its ids), which tf_ext.DynamicEmbeddingOptimizer applies with the table's fused update. The
  anchor is rank-local (tf_ext/rank_local_gradients.py): Horovod's and LightCC's reductions leave
  it out and divide it by the number of ranks as they average dense gradients, so N ranks, each
  on its part of a global batch, train as one process on the whole batch.
- Everything else (size, export, statistics, eviction) is this rank's part.
- Checkpoints: every rank saves (each at a prefix of its own, or the same on a shared disk): its
  part's file, and a manifest listing every rank's file by its whole path (checkpoint_files). A
  restore keeps the ids the rank owns (kept_part): from any rank's checkpoint into any number of
  ranks, from one process's table, or into one process's table (which reads every part).
"""

import os
import sys

import tensorflow as tf

from tf_ext import rank_local_gradients
from tf_ext.dynamic_embedding import checkpoint, lifecycle, sharded
from tf_ext.dynamic_embedding import variable as variable_lib

ALLTOALL = "alltoall"
DISTRIBUTIONS = (None, ALLTOALL)
# The Horovod name of the build-time check, the same for every table so that ranks that create
# different tables meet in it (and get an error) instead of waiting for each other.
_CHECK_NAME = "tf_ext_alltoall_table_check"
# The graph collection of the keys that lookups' all-to-alls brought this rank (owned_gradient):
# kept with the graph, so it goes when the graph goes.
_RECEIVED_BY_LOOKUPS = "tf_ext_alltoall_keys_received_by_lookups"


def check_distribution(name, distribution, num_shards=None):
  """ValueError naming the table for an unknown distribution, or alltoall with num_shards."""
  if distribution not in DISTRIBUTIONS:
    raise ValueError(
      f"dynamic embedding table '{name}': distribution must be None or {ALLTOALL!r}, "
      f"got {distribution!r}"
    )
  if distribution == ALLTOALL and num_shards is not None:
    raise ValueError(
      f"dynamic embedding table '{name}': distribution='alltoall' splits the table across the "
      f"Horovod ranks; it cannot be combined with num_shards={num_shards!r} (parameter-server "
      "shards): pass one of them"
    )
  return distribution


def horovod_of(name, needs=None):
  """horovod.tensorflow, once the user initialized it (directly or through tf_ext.lightcc).
  `needs`: what needs it, for the error (default: the table `name` split across ranks)."""
  hvd = sys.modules.get("horovod.tensorflow")
  if hvd is None or not hvd.is_initialized():
    needs = needs or (
      f"dynamic embedding table '{name}': distribution='alltoall' splits the table across "
      "Horovod ranks"
    )
    raise RuntimeError(
      f"{needs}: call hvd.init() (horovod.tensorflow or tf_ext.lightcc) before creating it"
    )
  return hvd


def _allgather_now(hvd, obj):
  """Every rank's `obj`, gathered now: eagerly, or in a session of its own while a graph or a
  tf.function is being built (so it runs at build time, once)."""
  with tf.init_scope():
    if tf.executing_eagerly():
      return hvd.allgather_object(obj, name=_CHECK_NAME)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      return hvd.allgather_object(obj, session=session, name=_CHECK_NAME)


def _check_same_on_every_rank(hvd, name, facts):
  """Raises, naming the table and the ranks that differ, unless every rank gives the same
  `facts` ({what: value}) of the table `name`. All checks meet in one collective, so ranks that
  reach different checks get the error too instead of waiting for each other."""
  mine = (name, tuple(facts.items()))
  everyone = _allgather_now(hvd, mine)
  if any(other != mine for other in everyone):
    ranks = {}
    for rank, other in enumerate(everyone):
      ranks.setdefault(other, []).append(rank)
    described = "; ".join(
      f"ranks {r}: table '{n}' " + " ".join(f"{what} {value}" for what, value in f)
      for (n, f), r in ranks.items()
    )
    raise ValueError(
      f"dynamic embedding table '{name}' (distribution='alltoall'): every rank must build the "
      f"same table with the same {', '.join(facts)}, in the same order; got {described}"
    )


def _allgather_strings(hvd, strings):
  """Every rank's 1-D string tensor `strings`, concatenated in rank order (Horovod's collectives
  carry no strings: their bytes travel, with each string's length)."""
  lengths = hvd.allgather(tf.strings.length(strings))
  flat_bytes = tf.io.decode_raw(tf.strings.reduce_join(strings), tf.uint8)
  return _bytes_to_strings(hvd.allgather(tf.reshape(flat_bytes, [-1])), lengths)


def split_tables(tables):
  """The tables among `tables` that are split across more than one rank."""
  return [t for t in tables if isinstance(t, AllToAllDynamicEmbeddingVariable) and t.ranks > 1]


@tf.custom_gradient
def _gather_rows(rows, positions):
  """tf.gather(rows, positions) whose gradient is dense (it goes through an alltoall)."""

  def gradient(upstream):
    return tf.math.unsorted_segment_sum(upstream, positions, tf.shape(rows)[0]), None

  return tf.gather(rows, positions), gradient


def _bytes_to_strings(flat_bytes, lengths):
  """The strings whose bytes are `flat_bytes` (uint8), one of each length in `lengths`."""
  one_byte_strings = tf.constant([bytes([b]) for b in range(256)])
  characters = tf.gather(one_byte_strings, tf.cast(flat_bytes, tf.int32))
  return tf.strings.reduce_join(tf.RaggedTensor.from_row_lengths(characters, lengths), axis=1)


class AllToAllDynamicEmbeddingVariable(variable_lib.DynamicEmbeddingVariable):
  """A dynamic embedding table whose rows are split by id across the Horovod ranks.

  Create it with `tf_ext.get_dynamic_embedding_variable(..., distribution="alltoall")` (or the
  same argument of tf_ext.dynamic_embedding, the Keras layer and the feature column) after
  `hvd.init()`. lookup, insert and remove are collectives: every rank calls them in the same
  order (with its own ids). size, export, statistics and checkpoints are this rank's part.
  """

  def __init__(self, name, dim, key_dtype=tf.int64, *args, **kwargs):
    self._hvd = horovod_of(name)
    self._rank, self._ranks = self._hvd.rank(), self._hvd.size()
    super().__init__(name, dim, key_dtype, *args, **kwargs)
    rank_local_gradients.mark(self.gradient_anchor)
    _check_same_on_every_rank(
      self._hvd, self._name, {"dim": self._dim, "key_dtype": self._key_dtype.name}
    )
    self._optimizer_checked = False

  @property
  def distribution(self):
    return ALLTOALL

  @property
  def rank(self):
    """This rank: it holds the ids `TfExtShardOf(id, ranks) == rank`."""
    return self._rank

  @property
  def ranks(self):
    return self._ranks

  def __repr__(self):
    return (
      f"<tf_ext.DynamicEmbeddingVariable '{self._name}' dim={self._dim} "
      f"key_dtype={self._key_dtype.name} distribution='alltoall' rank={self._rank}/{self._ranks}>"
    )

  # ---- the exchange -------------------------------------------------------------------------

  def owner_of(self, ids):
    """Each id's rank (int32, the shape of ids)."""
    return sharded.shard_of(ids, self._ranks)

  def distinct_by_owner(self, flat_ids):
    """(distinct, positions, counts) of the 1-D `flat_ids`: the distinct ids grouped by owner
    (rank 0's first, each rank's in order of first occurrence), each id's index in `distinct`,
    and each rank's number of distinct ids (int32)."""
    return sharded.distinct_by_shard(flat_ids, self._ranks)

  def _send(self, keys, *others):
    """Sends each of the flat `keys` (with the rows of `others` along) to its owner. Returns
    (keys received, [others received])."""
    owners = self.owner_of(keys)
    order = tf.argsort(owners, stable=True)
    splits = tf.math.bincount(owners, minlength=self._ranks, maxlength=self._ranks, dtype=tf.int32)
    received, received_others, _ = self._send_grouped(
      tf.gather(keys, order), splits, *[tf.gather(o, order) for o in others]
    )
    return received, received_others

  def _send_grouped(self, keys, splits, *others):
    """Sends the flat `keys`, grouped by owner (`splits[r]` keys for rank r, in rank order), and
    the rows of `others` along, to their owners. Returns (keys received, [others received],
    splits received): what goes back in the received order with the received splits arrives in
    the order of `keys`."""
    received_others = [self._hvd.alltoall(o, splits=splits)[0] for o in others]
    if self._key_dtype != tf.string:
      received, received_splits = self._hvd.alltoall(keys, splits=splits)
      return received, received_others, received_splits
    lengths = tf.strings.length(keys)
    received_lengths, received_splits = self._hvd.alltoall(lengths, splits=splits)
    owners = tf.repeat(tf.range(self._ranks), splits)
    byte_splits = tf.math.unsorted_segment_sum(lengths, owners, self._ranks)
    flat_bytes = tf.io.decode_raw(tf.strings.reduce_join(keys), tf.uint8)
    received_bytes, _ = self._hvd.alltoall(flat_bytes, splits=byte_splits)
    return _bytes_to_strings(received_bytes, received_lengths), received_others, received_splits

  # ---- table operations -------------------------------------------------------------------

  def lookup(self, ids, name=None):
    """Rows for `ids` (any shape): float32 of shape ids.shape + [dim]; never inserts.

    A collective: every rank must look this table up, in the same order as the others."""
    served = variable_lib.serving_replacement(self)
    if served is not None:  # tf_ext.saved_model.export_for_serving is tracing
      return served.lookup(ids, name)
    ids = self._check_keys(ids)
    with tf.name_scope(name or f"{self._name}_lookup"):
      distinct, positions, splits = self.distinct_by_owner(tf.reshape(ids, [-1]))
      received, _, received_splits = self._send_grouped(distinct, splits)
      self.mark_owned(received)
      owned_rows = self.owned_rows(received)
      rows, _ = self._hvd.alltoall(owned_rows, splits=received_splits)  # distinct's rows
      flat = _gather_rows(rows, positions)
      out = tf.reshape(flat, tf.concat([tf.shape(ids), [self._dim]], 0))
      out.set_shape(ids.shape.concatenate([self._dim]))
      return out

  def owned_rows(self, received):
    """The rows of the ids a lookup's all-to-all brought this rank (1-D, its own), read from its
    part: the step of a lookup that a subclass may read otherwise (tf_ext.tfra's initial rows)."""
    return super().lookup(received)

  def mark_owned(self, keys):
    """Marks the graph tensor `keys` as ids this rank owns: the gradients keyed by it are all
    this rank's (owned_gradient keeps them whole)."""
    if not tf.executing_eagerly():
      keys.graph.add_to_collection(_RECEIVED_BY_LOOKUPS, keys)

  def insert(self, keys, values, name=None):
    """Sets the rows of `keys` (any shape) to `values` (keys.shape + [dim]), on their owners."""
    keys = self._check_keys(keys, "keys")
    values = self._check_rows(keys, values)
    with tf.name_scope(name or f"{self._name}_insert"):
      received, (rows,) = self._send(tf.reshape(keys, [-1]), tf.reshape(values, [-1, self._dim]))
      return super().insert(received, rows)

  def remove(self, keys, name=None):
    """Removes `keys` from their owners; missing keys are ignored."""
    keys = self._check_keys(keys, "keys")
    with tf.name_scope(name or f"{self._name}_remove"):
      received, _ = self._send(tf.reshape(keys, [-1]))
      return super().remove(received)

  def statistics(self, name=None, *, aggregate=False):
    """This rank's part's statistics (see DynamicEmbeddingVariable.statistics); with
    aggregate=True the whole table's, summed over the ranks (a collective). Lookups count the ids
    each owner was sent: every rank's distinct ids of a lookup."""
    stats = super().statistics(name)
    if not aggregate:
      return stats
    with tf.name_scope(name or f"{self._name}_statistics"):
      counts = tf.stack([stats[key] for key in lifecycle.STATISTICS])
      summed = self._hvd.allreduce(counts, op=self._hvd.Sum)
      return lifecycle.statistics_dict(tf.unstack(summed, num=len(lifecycle.STATISTICS)))

  def checkpoint_files(self, prefix, name):
    """(this rank's part file, the manifest) of the table saved as `name` in a checkpoint at
    `prefix` (a string tensor), which every rank writes, each at its own prefix: a collective
    (an allgather of the prefixes). The manifest lists every rank's part by its whole path, so
    any rank's checkpoint restores into any number of ranks, or into one process's table."""
    whole = tf.strings.regex_full_match(prefix, r"/.*|[A-Za-z][A-Za-z0-9+.-]*://.*")
    prefix = tf.where(whole, prefix, tf.strings.join([os.getcwd(), "/", prefix]))
    prefixes = _allgather_strings(self._hvd, tf.reshape(prefix, [1]))
    suffixes = [checkpoint.snapshot_suffix(f"{name}/part_{r}") for r in range(self._ranks)]
    files = tf.strings.join([prefixes, suffixes])
    manifest = tf.strings.join(
      [f"{checkpoint.MANIFEST_HEADER}{self._ranks}\n", tf.strings.reduce_join(files + "\n")]
    )
    return files[self._rank], manifest

  def export_whole(self, name=None):
    """(keys, values) of every rank's part, on every rank: a collective."""
    with tf.name_scope(name or f"{self._name}_export_whole"):
      keys, values = self.export()
      if self._key_dtype == tf.string:
        keys = _allgather_strings(self._hvd, keys)
      else:
        keys = self._hvd.allgather(keys)
      return keys, self._hvd.allgather(values)

  def check_optimizer(self, facts):
    """Raises, naming the ranks, unless every rank trains this table with the same optimizer
    (`facts`: {what: value}); checked once, when the first training update is built."""
    if not self._optimizer_checked:
      _check_same_on_every_rank(self._hvd, self._name, facts)
      self._optimizer_checked = True

  @property
  def horovod(self):
    """The horovod.tensorflow module the exchange runs on."""
    return self._hvd

  def kept_part(self):
    """(ranks, rank): a checkpoint restore keeps this rank's ids (checkpoint.py)."""
    return self._ranks, self._rank

  def import_with_slots(
    self, keys, values, slots, update_counts, last_steps, slot_initial_values, name=None
  ):
    """Replaces this rank's part with the ids it owns of the given snapshot (of any part, or of
    the whole table, e.g. from a .keras file); not a collective."""
    keys = self._check_keys(keys, "keys")
    owned = tf.equal(self.owner_of(keys), self._rank)
    kept = [
      tf.boolean_mask(tf.convert_to_tensor(t, dtype), owned)
      for t, dtype in (
        (keys, self._key_dtype),
        (values, tf.float32),
        (slots, tf.float32),
        (update_counts, tf.int64),
        (last_steps, tf.int64),
      )
    ]
    return super().import_with_slots(*kept, slot_initial_values, name=name)

  def owned_gradient(self, gradient):
    """The part of the IndexedSlices `gradient` of this table's anchor that this rank owns: all
    of it, unless a reduction that does not know rank-local gradients (Horovod's own tape, or
    its v1 DistributedOptimizer wrapped around the table's optimizer) allgathered every rank's."""
    source = variable_lib.source_tensor(gradient.indices)
    if source is not None and any(
      keys is source for keys in source.graph.get_collection(_RECEIVED_BY_LOOKUPS)
    ):
      return gradient  # keyed by the ids a lookup's all-to-all brought this rank: all its own
    owned = tf.equal(self.owner_of(gradient.indices), self._rank)
    return tf.IndexedSlices(
      tf.boolean_mask(gradient.values, owned),
      tf.boolean_mask(gradient.indices, owned),
      gradient.dense_shape,
    )

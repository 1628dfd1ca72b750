"""The tables lookup.py compares, made and measured: the ids and their Zipf batches, TFRA's table
with its training-path lookup, and memory per entry against the raw payload (with and without
Adam's slots); progress lines while they fill. Imported as `_lookup_tables`."""

import gc
import sys
import time

import numpy as np
from _common import log, mib, rss_bytes

MEMORY_TARGET = 1.25  # memory_bytes / raw payload of a lookup-only table, at most


# TFRA's training-path lookup, the way TFRA 0.7 documents it for TF2 (tf.function / Keras):
# a `de.shadow_ops.ShadowVariable` (the eager twin of TrainableWrapper: a ResourceVariable
# that holds the looked-up rows so gradients can flow to them) is created once, eagerly,
# outside the tf.function, and `de.shadow_ops.embedding_lookup(shadow, ids)` is called inside
# it. That is what `de.keras.layers.Embedding` does (plus a tf.unique), and what
# `de.embedding_lookup(params=var, ids=ids, name=...)` itself delegates to when traced in a
# tf.function under TF2 (it creates the ShadowVariable in an init_scope on first trace). In
# ModelMode.TRAIN (the default) each call assigns the ids to the shadow's ids variable, runs
# CuckooHashTableFind, assigns the rows to the shadow variable and reads them back.
TFRA_EMBEDDING_API = "de.shadow_ops.ShadowVariable + de.shadow_ops.embedding_lookup"


class Progress:
  """One progress line on stderr: rewritten in place on a terminal, a few lines otherwise."""

  def __init__(self, what, total):
    self.what, self.total, self.start = what, total, time.perf_counter()
    self.tty = sys.stderr.isatty()
    self.next_quarter = 1

  def update(self, done):
    elapsed = time.perf_counter() - self.start
    line = f"[build] {self.what}: {done:,}/{self.total:,} ({elapsed:.1f}s)"
    if self.tty:
      sys.stderr.write("\r" + line + ("\n" if done >= self.total else ""))
      sys.stderr.flush()
    elif done >= self.total or done * 4 >= self.next_quarter * self.total:
      while done * 4 >= self.next_quarter * self.total:
        self.next_quarter += 1
      log(line)


def make_keys(n, rng):
  """n distinct random non-negative 63-bit int64 ids, in random order."""
  keys = np.unique(rng.integers(0, 2**63 - 1, size=n + n // 64 + 16, dtype=np.int64))
  while keys.size < n:  # practically never: 63-bit collisions among ~1M draws
    keys = np.unique(np.concatenate([keys, rng.integers(0, 2**63 - 1, size=n, dtype=np.int64)]))
  keys = keys[:n]
  rng.shuffle(keys)
  return keys


def make_zipf_batches(n, batch, num_batches, s, rng):
  """Row indices [num_batches, batch]: rank k in [1, n] drawn with P ~ 1/k^s (exactly
  normalised over the vocabulary), each rank mapped to a random row."""
  weights = np.arange(1, n + 1, dtype=np.float64) ** -s
  cdf = np.cumsum(weights)
  cdf /= cdf[-1]
  ranks = np.searchsorted(cdf, rng.random((num_batches, batch)), side="right")
  ranks = np.minimum(ranks, n - 1)  # guard against u == 1.0 rounding
  rank_to_row = rng.permutation(n).astype(np.int64)
  return rank_to_row[ranks]


def build_tfra(tf, de, args, keys, rows):
  """TFRA's table of the same rows, and the ShadowVariable of its training-path lookup (created
  eagerly, once, outside the tf.function): (variable, shadow, None), or (None, None, (status,
  short status)) when it cannot be built."""
  n, dim = args.keys, args.dim
  try:
    rss0 = rss_bytes()
    tfra_var = de.get_variable(
      "bench_tfra",
      key_dtype=tf.int64,
      value_dtype=tf.float32,
      dim=dim,
      initializer=tf.keras.initializers.Zeros(),
    )
    progress = Progress("TFRA upsert", n)
    t0 = time.perf_counter()
    for start in range(0, n, args.insert_batch):
      stop = min(n, start + args.insert_batch)
      tfra_var.upsert(tf.constant(keys[start:stop]), tf.constant(rows[start:stop]))
      progress.update(stop)
    tfra_build_s = time.perf_counter() - t0
    gc.collect()
    rss1 = rss_bytes()
    tfra_size = int(tfra_var.size())
    print(
      f"TFRA table   : size {tfra_size:,}, built in {tfra_build_s:.2f}s "
      f"({n / tfra_build_s / 1e6:.2f} M keys/s upsert), RSS growth "
      f"{mib(None if rss0 is None else rss1 - rss0)} (context)"
    )
    # The training-path lookup's trainable: created eagerly, once, outside the tf.function.
    tfra_mode = de.ModelMode.CURRENT_SETTING
    if tfra_mode != de.ModelMode.TRAIN:
      print(
        f"WARNING: TFRA ModelMode is {tfra_mode!r}, not {de.ModelMode.TRAIN!r}: "
        "embedding_lookup would skip the training-path copy"
      )
    tfra_shadow = de.shadow_ops.ShadowVariable(tfra_var, name="bench_tfra_shadow", trainable=True)
    print(
      f"TFRA train   : {TFRA_EMBEDDING_API}; ShadowVariable {tfra_shadow.name!r} "
      f"(trainable={tfra_shadow.trainable}) "
      f"created eagerly before tracing; ModelMode {tfra_mode!r}"
    )
  except Exception as error:  # pylint: disable=broad-except
    print(f"TFRA: failed to build the baseline ({type(error).__name__}: {error}); skipping it")
    return None, None, (f"failed: {type(error).__name__}: {error}", "TFRA baseline failed")
  return tfra_var, tfra_shadow, None


def memory_per_entry(tf, tf_ext, args, keys, table_bytes, results):
  """memory_bytes() per entry against the raw payload: of the lookup table, and of a table after
  one Adam step over every key (two slots per row); fills results["memory"]; the lookup table's
  ratio."""
  n, dim = args.keys, args.dim
  raw_lookup = n * (8 + 4 * dim)
  mem_ratio = table_bytes / raw_lookup
  print()
  print("memory per entry (memory_bytes / raw payload):")
  print(
    f"  lookup table (no slots)  : {table_bytes / n:7.1f} B/entry vs raw {8 + 4 * dim} B "
    f"(key 8 + {dim} x 4)  -> {mem_ratio:.3f}   target <= {MEMORY_TARGET}"
  )
  results["memory"] = {
    "lookup_table_bytes": table_bytes,
    "lookup_bytes_per_entry": table_bytes / n,
    "lookup_raw_bytes_per_entry": 8 + 4 * dim,
    "lookup_ratio": mem_ratio,
  }

  adam_ratio = None
  if not args.no_adam:
    rng_adam = np.random.default_rng(args.seed + 1)
    adam_table = tf_ext.DynamicEmbeddingVariable(
      "bench_adam", dim, key_dtype=tf.int64, initializer="zeros"
    )
    progress = Progress("Adam table insert", n)
    for start in range(0, n, args.insert_batch):
      stop = min(n, start + args.insert_batch)
      adam_table.insert(
        keys[start:stop], rng_adam.standard_normal((stop - start, dim), dtype=np.float32)
      )
      progress.update(stop)
    opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(learning_rate=1e-3))

    @tf.function(
      input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, dim], tf.float32)]
    )
    def adam_step(step_keys, grads):
      return opt.apply_gradients([(tf.IndexedSlices(grads, step_keys), adam_table.gradient_anchor)])

    progress = Progress("Adam step over all keys", n)
    t0 = time.perf_counter()
    for start in range(0, n, args.insert_batch):
      stop = min(n, start + args.insert_batch)
      adam_step(
        tf.constant(keys[start:stop]),
        tf.constant(rng_adam.standard_normal((stop - start, dim), dtype=np.float32)),
      )
      progress.update(stop)
    adam_s = time.perf_counter() - t0
    adam_size = int(adam_table.size())
    adam_bytes = int(adam_table.memory_bytes())
    export = adam_table.export_with_slots()
    slots_shape = list(export[2].shape)
    del export
    raw_adam = n * (8 + 3 * 4 * dim)
    adam_ratio = adam_bytes / raw_adam
    print(
      f"  with Adam slots (m, v)   : {adam_bytes / n:7.1f} B/entry vs raw {8 + 12 * dim} B "
      f"(key 8 + 3 x {dim} x 4) -> {adam_ratio:.3f}   (size {adam_size:,}, "
      f"slots {slots_shape}, Adam over all keys {adam_s:.1f}s)"
    )
    if adam_size != n:
      print(f"WARNING: Adam table size {adam_size} != {n}")
    results["memory"].update(
      {
        "adam_table_bytes": adam_bytes,
        "adam_bytes_per_entry": adam_bytes / n,
        "adam_raw_bytes_per_entry": 8 + 12 * dim,
        "adam_ratio": adam_ratio,
        "adam_slots_shape": slots_shape,
        "adam_apply_s": adam_s,
      }
    )
    del adam_table, adam_step, opt
    gc.collect()
  return mem_ratio

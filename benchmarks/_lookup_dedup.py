"""benchmarks/lookup.py --dedup: does deduplicating the ids of an unfused lookup pay?

For each dim, on Zipf ids, inside tf.functions, interleaved round by round:
  - unfused (the anchor): tf_ext.embedding_lookup as a graph without tf_ext's passes runs it,
    one TfExtTableFind of every id;
  - unfused+dedup: tf.unique, the find of the distinct ids, tf.gather back to every id (the
    candidate; in the training step its gradient reaches the update keyed by the distinct ids,
    duplicates summed by the gather's gradient, so the update skips its own tf.unique);
  - fused (reference): the anchor's graph with tf_ext.graph's embedding fusion on.
Forward: the lookup alone. Train: lookup, loss 0.5 * sum(rows^2), gradient, one SGD update
(each variant trains its own copy of the table). Prints ms per batch and keys/s ratios against
the anchor, per-round medians in brackets.
"""

import statistics
import time

import numpy as np

VARIANTS = ("unfused", "unfused+dedup", "fused")


def _make_table(tf, tf_ext, name, keys, rows, chunk=131_072):
  table = tf_ext.DynamicEmbeddingVariable(name, rows.shape[1], initializer="zeros")
  for start in range(0, keys.size, chunk):
    table.insert(keys[start : start + chunk], rows[start : start + chunk])
  return table


def _lookups(tf, tf_ext):
  def unfused(table, ids):
    return tf_ext.embedding_lookup(table, ids)

  def dedup(table, ids):
    distinct, positions = tf.unique(ids)
    return tf.gather(table.lookup(distinct), positions)

  return {"unfused": unfused, "unfused+dedup": dedup, "fused": unfused}


def _functions(tf, tf_ext, table_of, batch, dim, train):
  """{variant: tf.function(ids)}; `table_of(variant)` gives the variant's table."""
  spec = [tf.TensorSpec([batch], tf.int64)]
  functions = {}
  for variant, lookup in _lookups(tf, tf_ext).items():
    table = table_of(variant)
    if not train:
      functions[variant] = tf.function(
        lambda ids, table=table, lookup=lookup: lookup(table, ids), input_signature=spec
      )
      continue
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1e-3))

    def step(ids, table=table, lookup=lookup, optimizer=optimizer):
      with tf.GradientTape() as tape:
        rows = lookup(table, ids)
        loss = 0.5 * tf.reduce_sum(tf.square(rows))
      anchor = table.gradient_anchor
      optimizer.apply_gradients([(tape.gradient(loss, anchor), anchor)])
      return loss

    functions[variant] = tf.function(step, input_signature=spec)
  return functions


def _switched(tf_ext, variant, fn):
  """fn run with the variant's graph passes (set before each call: TensorFlow may instantiate a
  function again later, with the switches of that moment)."""
  fuse = variant == "fused"

  def run(ids):
    tf_ext.graph.enable(fuse_embeddings=fuse, cluster_dense_for_xla=False)
    return fn(ids)

  return run


def _time(functions, batches, warmup, repeats):
  names = list(functions)
  times = {name: [] for name in names}
  for r in range(warmup + repeats):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      start = time.perf_counter()
      for ids in batches:
        functions[name](ids)
      if r >= warmup:
        times[name].append(time.perf_counter() - start)
  return times


def run(args, tf, tf_ext, key_batches, keys, rng, results):
  """Both modes for each of args.dedup_dims; fills results["dedup"]."""
  batches = [tf.constant(b) for b in key_batches]
  per_batch = len(batches)
  distinct = statistics.mean(np.unique(b).size for b in key_batches) / args.batch
  print(f"dedup mode   : distinct ids per batch {distinct:.1%} (duplicates {1 - distinct:.1%})")
  results["dedup"] = {"distinct_fraction": distinct}
  for dim in args.dedup_dims:
    rows = rng.standard_normal((keys.size, dim), dtype=np.float32)
    for mode in ("forward", "train"):
      tables = {}

      def table_of(variant, dim=dim, mode=mode, rows=rows, tables=tables):
        if mode == "forward":  # a lookup changes nothing: one table serves every variant
          variant = "shared"
        if variant not in tables:
          name = f"bench_dedup_{mode}_{dim}_{variant}".replace("+", "_")
          tables[variant] = _make_table(tf, tf_ext, name, keys, rows)
        return tables[variant]

      functions = _functions(tf, tf_ext, table_of, args.batch, dim, mode == "train")
      functions = {v: _switched(tf_ext, v, f) for v, f in functions.items()}
      if mode == "forward":
        reference = functions["unfused"](batches[0]).numpy()
        for variant in VARIANTS[1:]:
          if not np.array_equal(functions[variant](batches[0]).numpy(), reference):
            print(f"WARNING: dim {dim}: {variant} rows differ from the unfused lookup's")
      times = _time(functions, batches, args.warmup, args.repeats)
      tf_ext.graph.disable()
      anchor = times["unfused"]
      entry = {}
      for variant in VARIANTS:
        ts = times[variant]
        ratio = statistics.median(anchor) / statistics.median(ts)
        per_round = statistics.median(a / t for a, t in zip(anchor, ts))
        ms = statistics.median(ts) / per_batch * 1e3
        entry[variant] = {"ms_per_batch": ms, "ratio_to_unfused": ratio, "round_s": ts}
        print(
          f"dedup {mode:<7} dim {dim:<3} {variant:<14}: {ms:8.2f} ms/batch  "
          f"{ratio:5.2f}x unfused [{per_round:.2f}x]"
        )
      results["dedup"][f"{mode}_dim{dim}"] = entry
      del functions, tables

"""benchmarks/lookup.py --dedup: does the find kernel's deduplication of ids pay?

For each id distribution (the Zipf ids of lookup.py, and uniform ids over the same keys) and each
dim, inside tf.functions, interleaved round by round:
  - unfused, no dedup (the anchor): tf_ext.embedding_lookup as a graph without tf_ext's passes
    runs it, its TfExtTableFind made with TF_EXT_FIND_DEDUP=0: one probe per id, the lookup
    before the kernel deduplicated;
  - unfused (auto): the same graph under the default TF_EXT_FIND_DEDUP=auto: the kernel finds
    each distinct id once where a sample of the batch repeats enough;
  - unfused (always): TF_EXT_FIND_DEDUP=1, every batch deduplicated (what auto spares a batch of
    distinct ids);
  - fused (reference): the anchor's graph with tf_ext.graph's embedding fusion on.
Forward: the lookup alone. Train: lookup, loss 0.5 * sum(rows^2), gradient, one SGD update
(each variant trains its own copy of the table). Prints ms per batch and keys/s ratios against
the anchor (per-round medians in brackets), and the ratio of the process's CPU time.
"""

import os
import statistics

import numpy as np
from _rounds import median_of_ratios, ratio_of_medians, timed_rounds

# variant: (TF_EXT_FIND_DEDUP, embedding fusion on)
VARIANTS = {
  "unfused, no dedup": ("0", False),
  "unfused (auto)": ("auto", False),
  "unfused (always)": ("1", False),
  "fused": ("0", True),
}
_FIND_DEDUP = "TF_EXT_FIND_DEDUP"


def _make_table(tf, tf_ext, name, keys, rows, chunk=131_072):
  table = tf_ext.DynamicEmbeddingVariable(name, rows.shape[1], initializer="zeros")
  for start in range(0, keys.size, chunk):
    table.insert(keys[start : start + chunk], rows[start : start + chunk])
  return table


def _functions(tf, tf_ext, table_of, batch, dim, train):
  """{variant: tf.function(ids)}; `table_of(variant)` gives the variant's table."""
  spec = [tf.TensorSpec([batch], tf.int64)]
  functions = {}
  for variant in VARIANTS:
    table = table_of(variant)
    if not train:
      functions[variant] = tf.function(
        lambda ids, table=table: tf_ext.embedding_lookup(table, ids), input_signature=spec
      )
      continue
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1e-3))

    def step(ids, table=table, optimizer=optimizer):
      with tf.GradientTape() as tape:
        rows = tf_ext.embedding_lookup(table, ids)
        loss = 0.5 * tf.reduce_sum(tf.square(rows))
      anchor = table.gradient_anchor
      optimizer.apply_gradients([(tape.gradient(loss, anchor), anchor)])
      return loss

    functions[variant] = tf.function(step, input_signature=spec)
  return functions


def _switched(tf_ext, variant, fn):
  """fn run with the variant's find setting and graph passes, set before each call: TensorFlow
  may instantiate a function again later, and a find kernel reads the setting when it is made."""
  dedup, fuse = VARIANTS[variant]

  def call(ids):
    os.environ[_FIND_DEDUP] = dedup
    tf_ext.graph.enable(fuse_embeddings=fuse, cluster_dense_for_xla=False)
    return fn(ids)

  return call


def run(args, tf, tf_ext, key_batches, keys, rng, results):
  """Both modes for each of args.dedup_dims, on lookup.py's Zipf ids and on uniform ids; fills
  results["dedup"]."""
  uniform = keys[rng.integers(0, keys.size, size=np.shape(key_batches))]
  results["dedup"] = {}
  previous = os.environ.get(_FIND_DEDUP)
  try:
    for ids_name, id_batches in ((f"zipf{args.zipf:g}", key_batches), ("uniform", uniform)):
      results["dedup"][ids_name] = _run_ids(args, tf, tf_ext, ids_name, id_batches, keys, rng)
  finally:
    os.environ.pop(_FIND_DEDUP, None)
    if previous is not None:
      os.environ[_FIND_DEDUP] = previous


def _run_ids(args, tf, tf_ext, ids_name, key_batches, keys, rng):
  batches = [tf.constant(b) for b in key_batches]
  per_batch = len(batches)
  distinct = statistics.mean(np.unique(b).size for b in key_batches) / args.batch
  print(
    f"dedup {ids_name} ids: distinct ids per batch {distinct:.1%} (duplicates {1 - distinct:.1%})"
  )
  results = {"distinct_fraction": distinct}
  anchor_name = next(iter(VARIANTS))
  for dim in args.dedup_dims:
    rows = rng.standard_normal((keys.size, dim), dtype=np.float32)
    for mode in ("forward", "train"):
      tables = {}

      def table_of(variant, dim=dim, mode=mode, rows=rows, tables=tables):
        if mode == "forward":  # a lookup changes nothing: one table serves every variant
          variant = "shared"
        if variant not in tables:
          tag = "".join(c if c.isalnum() else "_" for c in f"{ids_name}_{mode}_{dim}_{variant}")
          tables[variant] = _make_table(tf, tf_ext, f"bench_dedup_{tag}", keys, rows)
        return tables[variant]

      functions = _functions(tf, tf_ext, table_of, args.batch, dim, mode == "train")
      functions = {v: _switched(tf_ext, v, f) for v, f in functions.items()}
      if mode == "forward":
        reference = functions[anchor_name](batches[0]).numpy()
        for variant in list(VARIANTS)[1:]:
          if not np.array_equal(functions[variant](batches[0]).numpy(), reference):
            print(f"WARNING: dim {dim}: {variant} rows differ from the anchor's")
      methods = {name: (fn, batches) for name, fn in functions.items()}
      times, cpu_times = timed_rounds(methods, args.warmup, args.repeats)
      tf_ext.graph.disable()
      anchor, anchor_cpu = times[anchor_name], cpu_times[anchor_name]
      entry = {}
      for variant in VARIANTS:
        ts, cpus = times[variant], cpu_times[variant]
        ratio = ratio_of_medians(anchor, ts)
        per_round = median_of_ratios(anchor, ts)
        cpu_ratio = ratio_of_medians(anchor_cpu, cpus)
        ms = statistics.median(ts) / per_batch * 1e3
        entry[variant] = {
          "ms_per_batch": ms,
          "ratio_to_anchor": ratio,
          "cpu_ratio_to_anchor": cpu_ratio,
          "round_s": ts,
          "round_cpu_s": cpus,
        }
        print(
          f"dedup {ids_name:<8} {mode:<7} dim {dim:<3} {variant:<17}: {ms:8.2f} ms/batch  "
          f"{ratio:5.2f}x anchor [{per_round:.2f}x]  CPU time {cpu_ratio:5.2f}x"
        )
      results[f"{mode}_dim{dim}"] = entry
      del functions, methods, tables
  return results

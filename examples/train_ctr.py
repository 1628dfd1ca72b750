"""Trains a small CTR model with tf_ext dynamic embeddings on a synthetic click log.

  python examples/train_ctr.py            # ~1M training rows, 1 epoch (`make demo`)
  python examples/train_ctr.py --quick    # tiny sizes: a smoke test in seconds
  python examples/train_ctr.py --amp bfloat16   # with loss-aware mixed precision

The click log has a hidden ground truth: every user, item, category and city has a bias, users
and items have latent factors, and the label is drawn from a logistic function of those plus the
dense features and noise. Ids are Zipf-distributed 64-bit keys (no vocabulary, no hashing into
buckets). The evaluation set comes "later in time": some users and items are new in it. The
dynamic tables must serve those unseen ids (from their initial rows) without inserting them.

Model: one `tf_ext.keras.layers.DynamicEmbedding` per sparse field (int64 ids, string cities and
a ragged list of recently clicked items combined by "mean"), concatenated with the dense
features into an MLP with a sigmoid output, trained by `model.fit` with
`tf_ext.DynamicEmbeddingOptimizer(Adam)`.

Table lifecycle: user and item ids get a row only at their second update
(`tf_ext.FrequencyAdmission(2)`: most Zipf ids are seen once and would cost a row for nothing),
users whose row had a single update and then went idle are evicted during training
(`tf_ext.EvictionPolicy(min_frequency=2)` with the `TableEviction` callback), and every table's
statistics go to TensorBoard (`TableStatistics` callback, `--log-dir`).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a source checkout without installing tf_ext
  sys.path.insert(0, ROOT)

import numpy as np  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position

import tf_ext  # pylint: disable=wrong-import-position

# Vocabulary sizes (ids that exist in the hidden world) and model sizes, full and --quick.
FULL = dict(
  rows=1_000_000,
  users=200_000,
  items=50_000,
  categories=1_000,
  cities=500,
  batch_size=1024,
  eval_fraction=0.1,
)
QUICK = dict(
  rows=20_000,
  users=5_000,
  items=2_000,
  categories=100,
  cities=50,
  batch_size=512,
  eval_fraction=0.2,
)
LATENT = 8  # rank of the hidden user x item interaction
NEW_ID_FRACTION = 0.05  # last 5% of users / items exist only in the eval period
EVAL_NEW_RATE = 0.08  # share of eval rows whose user (resp. item) is such a new id
MAX_RECENT = 6  # recent_items has 0..MAX_RECENT ids per row
NUM_DENSE = 4
SPARSE = ("user_id", "item_id", "category", "city", "recent_items")


# ---- synthetic click log ------------------------------------------------------------------


def _hash_ids(index, salt):
  """Index -> a scattered non-negative int64 key (a bijection on [0, 2**62))."""
  mixed = (index.astype(np.uint64) + np.uint64(salt)) * np.uint64(0x9E3779B97F4A7C15)
  mixed ^= mixed >> np.uint64(29)
  return (mixed & np.uint64((1 << 62) - 1)).astype(np.int64)


class World:
  """The hidden ground truth and a sampler of click-log rows from it."""

  def __init__(self, rng, users, items, categories, cities):
    self.rng = rng
    self.n_users, self.n_items, self.n_cats, self.n_cities = users, items, categories, cities
    self.old_users = int(users * (1 - NEW_ID_FRACTION))
    self.old_items = int(items * (1 - NEW_ID_FRACTION))
    self.user_key = _hash_ids(np.arange(users), 1)
    self.item_key = _hash_ids(np.arange(items), 2)
    # Hidden effects: per-id biases and latent factors.
    self.user_bias = rng.normal(0, 0.6, users)
    self.item_bias = rng.normal(0, 0.6, items)
    self.cat_bias = rng.normal(0, 0.5, categories)
    self.city_bias = rng.normal(0, 0.4, cities)
    scale = 1.5 / np.sqrt(LATENT)
    self.user_vec = rng.normal(0, scale, (users, LATENT))
    self.item_vec = rng.normal(0, scale, (items, LATENT))
    self.item_cat = self._zipf(categories, items, 1.0)  # each item has one category
    self.user_city = self._zipf(cities, users, 1.0)  # and each user a home city
    self.dense_w = np.array([0.4, -0.3, -0.5, 0.0])  # the last dense feature is pure noise

  def _zipf(self, n, size, exponent, offset=0):
    """`size` draws from {offset, .., offset + n - 1}, P(k) ~ 1 / (k + 2) ** exponent."""
    weights = 1.0 / (np.arange(n) + 2.0) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return offset + np.minimum(np.searchsorted(cdf, self.rng.random(size)), n - 1)

  def _ids(self, n_old, n_all, size, exponent, new_rate):
    """Zipf draws over the old ids; a `new_rate` share drawn from the new ids instead."""
    ids = self._zipf(n_old, size, exponent)
    if new_rate:
      new = self.rng.random(size) < new_rate
      ids[new] = self._zipf(n_all - n_old, int(new.sum()), exponent, offset=n_old)
    return ids

  def sample(self, size, new_rate=0.0):
    """`size` rows: (features, labels, truth); truth has the hidden probabilities and indices."""
    rng = self.rng
    users = self._ids(self.old_users, self.n_users, size, 0.9, new_rate)
    items = self._ids(self.old_items, self.n_items, size, 1.0, new_rate)
    cats = self.item_cat[items]
    cities = np.where(
      rng.random(size) < 0.9, self.user_city[users], rng.integers(0, self.n_cities, size)
    )
    lengths = rng.integers(0, MAX_RECENT + 1, size)
    recent = self._zipf(self.old_items, int(lengths.sum()), 1.0)
    # Dense features: hour of day (sin, cos), log price, and a noise feature.
    hour = rng.uniform(0, 2 * np.pi, size)
    dense = np.stack(
      [np.sin(hour), np.cos(hour), rng.normal(0, 1, size), rng.normal(0, 1, size)], axis=1
    )

    # Ground truth: a logistic function of hidden effects, plus noise.
    row_of_recent = np.repeat(np.arange(size), lengths)
    history = np.zeros((size, LATENT))
    np.add.at(history, row_of_recent, self.item_vec[recent])
    history /= np.maximum(lengths, 1)[:, None]
    non_personal = self.item_bias[items] + self.cat_bias[cats] + dense @ self.dense_w
    logit = (
      -1.6
      + non_personal
      + self.user_bias[users]
      + self.city_bias[cities]
      + np.sum(self.user_vec[users] * self.item_vec[items], 1)
      + 1.5 * np.sum(history * self.item_vec[items], 1)
    )
    prob = 1 / (1 + np.exp(-(logit + rng.normal(0, 0.3, size))))
    labels = (rng.random(size) < prob).astype(np.float32)

    features = {
      "user_id": self.user_key[users],
      "item_id": self.item_key[items],
      "category": cats.astype(np.int64),
      "city": np.char.add("city_", cities.astype(str)).astype(object),
      "recent_items": (self.item_key[recent], lengths),
      "dense_features": dense.astype(np.float32),
    }
    truth = {"prob": prob, "non_personal": non_personal, "user": users, "item": items}
    return features, labels, truth


def _batches(features, labels, batch_size, shuffle_seed=None):
  """A tf.data pipeline slicing whole batches from in-memory tensors (ragged included)."""
  values, lengths = features["recent_items"]
  tensors = {k: tf.constant(v) for k, v in features.items() if k != "recent_items"}
  tensors["recent_items"] = tf.RaggedTensor.from_row_lengths(
    tf.constant(values), tf.constant(lengths, tf.int64)
  )
  labels = tf.constant(labels[:, None])
  n = len(labels)
  num_batches = (n + batch_size - 1) // batch_size
  ds = tf.data.Dataset.range(num_batches)
  if shuffle_seed is not None:  # rows are i.i.d. within a period: shuffling batches suffices
    ds = ds.shuffle(num_batches, seed=shuffle_seed, reshuffle_each_iteration=True)

  def take(b):
    start = b * batch_size
    stop = tf.minimum(start + batch_size, n)
    return {k: t[start:stop] for k, t in tensors.items()}, labels[start:stop]

  return ds.map(take, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


# ---- model --------------------------------------------------------------------------------


def table_policies(name, min_count, evict_window):
  """The lifecycle policies of a field's table (see the module docstring)."""
  policies = {}
  if name in ("user_id", "item_id") and min_count > 1:
    policies["admission"] = tf_ext.FrequencyAdmission(min_count)
  if name == "user_id" and evict_window:
    policies["eviction"] = tf_ext.EvictionPolicy(
      min_frequency=2, frequency_window_steps=evict_window
    )
  return policies


def build_model(dim, min_count=1, evict_window=0):
  inputs = {
    "user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id"),
    "item_id": tf.keras.Input(shape=(), dtype=tf.int64, name="item_id"),
    "category": tf.keras.Input(shape=(), dtype=tf.int64, name="category"),
    "city": tf.keras.Input(shape=(), dtype=tf.string, name="city"),
    "recent_items": tf.keras.Input(shape=(None,), dtype=tf.int64, ragged=True, name="recent_items"),
    "dense_features": tf.keras.Input(shape=(NUM_DENSE,), dtype=tf.float32, name="dense_features"),
  }
  embedded = {
    name: tf_ext.keras.layers.DynamicEmbedding(
      dim,
      key_dtype=tf.string if name == "city" else tf.int64,
      combiner="mean" if name == "recent_items" else None,
      name=f"{name}_embedding",
      **table_policies(name, min_count, evict_window),
    )(inputs[name])
    for name in SPARSE
  }
  # The dense tower gets the embeddings, the dense features and the user-item / history-item
  # dot products (cheap explicit interactions the MLP would otherwise have to discover).
  dots = [
    tf.keras.layers.Dot(axes=1)([embedded["user_id"], embedded["item_id"]]),
    tf.keras.layers.Dot(axes=1)([embedded["recent_items"], embedded["item_id"]]),
  ]
  x = tf.keras.layers.Concatenate()(
    [embedded[n] for n in SPARSE] + dots + [inputs["dense_features"]]
  )
  x = tf.keras.layers.Dense(128, activation="relu")(x)
  x = tf.keras.layers.Dense(64, activation="relu")(x)
  output = tf.keras.layers.Dense(1, activation="sigmoid", name="click_probability")(x)
  return tf.keras.Model(inputs, output, name="ctr")


def embedding_layers(model):
  return [
    layer for layer in model.layers if isinstance(layer, tf_ext.keras.layers.DynamicEmbedding)
  ]


def table_sizes(model):
  return {layer.name: int(layer.table.size()) for layer in embedding_layers(model)}


class Throughput(tf.keras.callbacks.Callback):
  """Training examples/s, overall and without the first step (tf.function tracing)."""

  def __init__(self, batch_size):
    super().__init__()
    self.batch_size = batch_size
    self.steps = 0
    self.first_step_end = self.start = self.end = None

  def on_train_begin(self, logs=None):
    self.start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    self.steps += 1
    if self.first_step_end is None:
      self.first_step_end = time.perf_counter()

  def on_train_end(self, logs=None):
    self.end = time.perf_counter()


def print_statistics(model, log_dir):
  """Each table's lifecycle statistics (also in TensorBoard, under log_dir)."""
  print(
    "\ntable statistics (admission, eviction, lookups; TensorBoard: tensorboard --logdir "
    f"{log_dir}):"
  )
  print(
    f"  {'layer':<26}{'admitted':>10}{'rejected':>10}{'evicted':>10}{'lookups':>12}{'hit rate':>10}"
  )
  for layer in embedding_layers(model):
    stats = {k: v.numpy().item() for k, v in layer.table.statistics().items()}
    print(
      f"  {layer.name:<26}{stats['admitted']:>10,}{stats['rejected']:>10,}{stats['evicted']:>10,}"
      f"{stats['lookups']:>12,}{stats['lookup_hit_rate']:>10.1%}"
    )


def _auc(labels, scores):
  from sklearn.metrics import roc_auc_score  # pylint: disable=import-outside-toplevel

  return roc_auc_score(labels, scores) if 0 < labels.sum() < len(labels) else float("nan")


# ---- main ---------------------------------------------------------------------------------


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, help="training rows (default 1M, --quick 20K)")
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--batch-size", type=int, help="default 1024 (--quick 512)")
  parser.add_argument("--dim", type=int, default=16, help="embedding dim of every field")
  parser.add_argument("--learning-rate", type=float, default=2e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
  parser.add_argument(
    "--min-count", type=int, default=2, help="admission of user/item ids (1: admit all)"
  )
  parser.add_argument(
    "--evict-window",
    type=int,
    default=200,
    help="evict user rows updated once and idle this many steps (0: no eviction)",
  )
  parser.add_argument(
    "--amp",
    choices=("off",) + tf_ext.mixed_precision.HALF_CHOICES,
    default="off",
    help="loss-aware mixed precision: tf_ext.mixed_precision.LossAwareOptimizer(half=...)",
  )
  parser.add_argument(
    "--graph-passes",
    action="store_true",
    help="tf_ext.graph.enable(): fused embedding lookups and table updates",
  )
  parser.add_argument(
    "--log-dir",
    default=os.path.join(tempfile.gettempdir(), "tf_ext_ctr_logs"),
    help="TensorBoard log of the table statistics",
  )
  args = parser.parse_args(argv)
  cfg = dict(QUICK if args.quick else FULL)
  rows = args.rows or cfg["rows"]
  batch_size = args.batch_size or cfg["batch_size"]
  eval_rows = max(int(rows * cfg["eval_fraction"]), 1000)
  tf.keras.utils.set_random_seed(args.seed)
  wall_start = time.perf_counter()

  # Data.
  t0 = time.perf_counter()
  world = World(
    np.random.default_rng(args.seed), cfg["users"], cfg["items"], cfg["categories"], cfg["cities"]
  )
  train_x, train_y, train_ids = world.sample(rows)
  eval_x, eval_y, eval_ids = world.sample(eval_rows, new_rate=EVAL_NEW_RATE)
  unseen_user = ~np.isin(eval_ids["user"], train_ids["user"])
  unseen_item = ~np.isin(eval_ids["item"], train_ids["item"])
  print(
    f"click log: {rows:,} train rows, {eval_rows:,} eval rows, CTR {train_y.mean():.3f} "
    f"(generated in {time.perf_counter() - t0:.1f}s)"
  )
  print(
    f"  distinct in train: {len(np.unique(train_ids['user'])):,} users, "
    f"{len(np.unique(train_ids['item'])):,} items; eval rows with a user / item unseen in "
    f"train: {unseen_user.mean():.1%} / {unseen_item.mean():.1%}"
  )
  train_ds = _batches(train_x, train_y, batch_size, shuffle_seed=args.seed)
  eval_ds = _batches(eval_x, eval_y, 4 * batch_size)

  # Model.
  if args.graph_passes:  # before the first step: the passes rewrite graphs as they are built
    tf_ext.graph.enable()
  model = build_model(args.dim, args.min_count, args.evict_window)
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(args.learning_rate))
  if args.amp != "off":
    optimizer = tf_ext.mixed_precision.LossAwareOptimizer(optimizer, half=args.amp)
  model.compile(
    optimizer=optimizer,
    loss="binary_crossentropy",
    metrics=[tf.keras.metrics.AUC(name="auc", num_thresholds=1000)],
  )

  # Train.
  throughput = Throughput(batch_size)
  statistics = tf_ext.keras.callbacks.TableStatistics(args.log_dir, every_n_steps=50)
  callbacks = [throughput, statistics]
  if args.evict_window:
    callbacks.append(tf_ext.keras.callbacks.TableEviction(every_n_steps=100))
  # Full and delta checkpoints of the tables (and the dense state) about 5 times per run.
  delta_dir = tempfile.mkdtemp(prefix="tf_ext_ctr_chain_")
  steps = (rows + batch_size - 1) // batch_size * args.epochs
  chain = tf_ext.keras.callbacks.DeltaCheckpoint(
    delta_dir, every_n_steps=max(steps // 5, 1), full_every_n_deltas=3, restore=False
  )
  callbacks.append(chain)
  model.fit(train_ds, epochs=args.epochs, verbose=1, callbacks=callbacks)
  total_examples = rows * args.epochs
  fit_s = throughput.end - throughput.start
  steady_s = throughput.end - throughput.first_step_end
  steady_examples = total_examples - batch_size
  print(
    f"\ntraining: {total_examples:,} examples in {fit_s:.1f}s = "
    f"{total_examples / fit_s:,.0f} examples/s ({steady_examples / steady_s:,.0f} examples/s "
    f"after the first step; {throughput.steps} steps of {batch_size})"
  )

  if args.graph_passes:
    passes = tf_ext.graph.stats()
    print(
      f"graph passes: {passes['lookups_fused']} lookups and {passes['updates_fused']} table "
      f"updates fused (graphs rewritten: {passes['graphs_fused']}), "
      f"{passes['concats_written']} concatenations written by the fused lookup, "
      f"{passes['slots_shared']} apply fields given their ids' distinct slots by it, "
      f"{passes['nodes_clustered']} nodes clustered for XLA"
    )

  if args.amp != "off":
    amp = tf_ext.mixed_precision.report(optimizer)
    print(
      f"mixed precision ({args.amp}): {amp['half_fraction']:.0%} of {amp['steps']:.0f} steps in "
      f"half, {amp['switches']:.0f} switches (last fallback: {amp['last_fallback']}), "
      f"{amp['skipped_steps']:.0f} steps skipped, loss scale {amp['loss_scale']:g}"
    )

  # Tables after training.
  print("\ndynamic embedding tables (dim %d):" % args.dim)
  print(f"  {'layer':<26}{'key dtype':>10}{'ids':>12}{'memory':>12}{'bytes/id':>10}")
  total_mem = 0
  for layer in embedding_layers(model):
    size, mem = int(layer.table.size()), int(layer.table.memory_bytes())
    total_mem += mem
    print(
      f"  {layer.name:<26}{layer.table.key_dtype.name:>10}{size:>12,}"
      f"{mem / 2**20:>10.2f}MB{mem / max(size, 1):>10.0f}"
    )
  total_ids = sum(table_sizes(model).values())
  print(f"  {'total':<26}{'':>10}{total_ids:>12,}{total_mem / 2**20:>10.2f}MB")
  print_statistics(model, args.log_dir)

  # Evaluate: unseen ids read their initial rows and must not be inserted.
  before = table_sizes(model)
  results = model.evaluate(eval_ds, verbose=0, return_dict=True)
  scores = model.predict(eval_ds, verbose=0)[:, 0]
  after = table_sizes(model)
  print(
    f"\neval ({eval_rows:,} rows): loss {results['loss']:.4f}, AUC {results['auc']:.4f} "
    f"(keras), {_auc(eval_y, scores):.4f} (sklearn)"
  )
  seen_auc = _auc(eval_y[~unseen_user], scores[~unseen_user])
  unseen_auc = _auc(eval_y[unseen_user], scores[unseen_user])
  print(f"  AUC on rows with seen / unseen users: {seen_auc:.4f} / {unseen_auc:.4f}")
  print(
    f"  reference AUCs: the true click probability {_auc(eval_y, eval_ids['prob']):.4f} "
    f"(a perfect model), its non-personalized part (item, category, dense) "
    f"{_auc(eval_y, eval_ids['non_personal']):.4f}, random 0.5"
  )
  missing = {}
  for field in ("user_id", "item_id"):
    table_keys = model.get_layer(f"{field}_embedding").table.export()[0].numpy()
    missing[field] = int(np.sum(~np.isin(np.unique(eval_x[field]), table_keys)))
  print(
    f"  eval looked up {missing['user_id']:,} user ids and {missing['item_id']:,} item ids "
    f"that are not in the tables (served from their initial rows)"
  )
  grew = {k: after[k] - before[k] for k in before if after[k] != before[k]}
  print(
    f"  table sizes before / after evaluate + predict: "
    f"{'equal' if not grew else 'CHANGED ' + str(grew)} ({sum(after.values()):,} ids)"
  )

  # Checkpoint: save, restore into a fresh model, compare predictions.
  ckpt_dir = tempfile.mkdtemp(prefix="tf_ext_ctr_")
  try:
    path = tf.train.Checkpoint(model=model).save(os.path.join(ckpt_dir, "ckpt"))
    restored = build_model(args.dim)
    # The checkpoint also holds the optimizer (tracked by the compiled model); the restored
    # model is for inference only, hence expect_partial().
    status = tf.train.Checkpoint(model=restored).restore(path)
    status.assert_existing_objects_matched().expect_partial()
    sample = next(iter(eval_ds))[0]
    diff = np.max(np.abs(model(sample).numpy() - restored(sample).numpy()))
    same_sizes = table_sizes(restored) == after
    ckpt_mb = sum(os.path.getsize(os.path.join(ckpt_dir, f)) for f in os.listdir(ckpt_dir)) / 2**20
    print(
      f"\ncheckpoint: saved {ckpt_mb:.1f}MB, restored into a fresh model: table sizes "
      f"{'equal' if same_sizes else 'DIFFER'}, max |prediction difference| on "
      f"{len(sample['user_id'])} eval rows = {diff:.2e}"
    )
  finally:
    shutil.rmtree(ckpt_dir, ignore_errors=True)

  # Delta checkpoints written during fit: restore the latest link into a fresh model.
  try:
    links = ", ".join(
      f"{link['kind']} {link['bytes'] / 2**20:.1f}MB @ step {link['step']}"
      for link in chain.manager.links()
    )
    print(f"\ndelta checkpoints during fit (kept: the last 2 chains): {links}")
    from_chain = build_model(args.dim)
    step = tf_ext.DeltaCheckpointManager(
      delta_dir,
      [layer.table for layer in embedding_layers(from_chain)],
      dense=tf.train.Checkpoint(variables=list(from_chain.variables)),
    ).restore()
    chain_diff = np.max(np.abs(model(sample).numpy() - from_chain(sample).numpy()))
    print(
      f"  step {step} restored into a fresh model: max |prediction difference| = {chain_diff:.2e}"
    )
  finally:
    shutil.rmtree(delta_dir, ignore_errors=True)
  print(f"\ntotal wall time {time.perf_counter() - wall_start:.1f}s")
  ok = not grew and same_sizes and diff < 1e-5 and chain_diff < 1e-5
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())

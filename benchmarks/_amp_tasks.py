"""The seeded synthetic data and the Keras models of benchmarks/amp.py (issue 10: loss-aware
mixed precision): the speed tower and the three accuracy tasks. Imported as `_amp_tasks` (the
scripts run from this folder); numpy only at import, TensorFlow and tf_ext are passed in.

The tf_ext tables are float32 layers in every variant (`dtype="float32"`: under a mixed policy
DynamicEmbedding's gradient anchor would be autocast to the half type, which its lookup op
rejects); the Dense layers after them compute in the policy's type.

Every model is built in float32 unless a Keras dtype policy is active while it is built (the
benchmark sets `mixed_bfloat16` / `mixed_float16` around the build of TensorFlow's own AMP
models, and resets it to float32 afterwards); the last Dense layer is always float32, as the
Keras mixed-precision guide recommends, so TensorFlow's AMP gets its best practice.
"""

import dataclasses

import numpy as np

# ---- metrics (higher is better) ---------------------------------------------------------------


def auc(scores, labels):
  """ROC AUC by the rank-sum formula (ties get their average rank); nan for non-finite scores."""
  scores = np.asarray(scores, np.float64).reshape(-1)
  labels = np.asarray(labels).reshape(-1) > 0.5
  if not np.all(np.isfinite(scores)):
    return float("nan")
  order = np.argsort(scores, kind="mergesort")
  ranks = np.empty(len(scores), np.float64)
  sorted_scores = scores[order]
  # average ranks of ties
  boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
  starts = np.concatenate([[0], boundaries])
  ends = np.concatenate([boundaries, [len(scores)]])
  average = (starts + ends - 1) / 2.0 + 1.0
  ranks[order] = np.repeat(average, ends - starts)
  positives = int(labels.sum())
  negatives = len(labels) - positives
  if positives == 0 or negatives == 0:
    return float("nan")
  return float((ranks[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def r2(predictions, targets):
  """Coefficient of determination 1 - MSE / Var(target); nan for non-finite predictions."""
  predictions = np.asarray(predictions, np.float64).reshape(-1)
  targets = np.asarray(targets, np.float64).reshape(-1)
  if not np.all(np.isfinite(predictions)):
    return float("nan")
  return float(1.0 - np.mean((predictions - targets) ** 2) / np.var(targets))


# ---- the tasks --------------------------------------------------------------------------------


@dataclasses.dataclass
class Task:
  """One accuracy task: its data, its model, how it trains and how it is judged.

  `tf_amp`: TensorFlow's own AMP for it (a Keras global policy; mixed_float16 adds Keras'
  LossScaleOptimizer); `half`: the half precision ours is asked for."""

  key: str
  title: str
  design: str
  metric_name: str
  metric: object  # (predictions, targets) -> float, higher is better
  loss: str  # a Keras loss name
  from_logits: bool
  tf_amp: str
  half: str
  batch_size: int
  steps: int
  quick_steps: int
  learning_rate: float
  make_data: object  # (rng, n) -> (inputs, targets)
  # (tf, tf_ext, train data, name prefix) -> keras.Model (in the active dtype policy); the prefix
  # names its tables apart from the other variants' (tables are get-or-create by name)
  build: object
  uses_tables: bool = False


# (a) Benign CTR: ids through tf_ext tables + dense features, labels from a hidden logistic model.
CTR_FIELDS, CTR_VOCAB, CTR_DENSE, CTR_DIM = 8, 20_000, 13, 8


def ctr_data(rng, n, _weights={}):  # noqa: B006 (a per-process cache of the hidden model)
  if "field" not in _weights:
    hidden = np.random.default_rng(12345)
    _weights["field"] = hidden.normal(0.0, 0.6, size=(CTR_FIELDS, CTR_VOCAB))
    _weights["dense"] = hidden.normal(0.0, 0.4, size=CTR_DENSE)
    _weights["cross"] = hidden.normal(0.0, 0.5, size=(CTR_VOCAB,))
  w = _weights
  ids = np.minimum(rng.zipf(1.2, size=(n, CTR_FIELDS)) - 1, CTR_VOCAB - 1)
  dense = rng.standard_normal((n, CTR_DENSE))
  logit = -1.2 + w["field"][np.arange(CTR_FIELDS), ids].sum(1) + dense @ w["dense"]
  logit += w["cross"][ids[:, 0]] * np.tanh(dense[:, 0]) + 0.3 * dense[:, 1] * dense[:, 2]
  label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
  # every field in its own id range of one table
  keys = (ids + np.arange(CTR_FIELDS) * CTR_VOCAB).astype(np.int64)
  return (keys, dense.astype(np.float32)), label


def ctr_model(tf, tf_ext, _data, prefix):
  ids = tf.keras.Input((CTR_FIELDS,), dtype=tf.int64, name="ids")
  dense = tf.keras.Input((CTR_DENSE,), name="dense_features")
  emb = tf_ext.keras.layers.DynamicEmbedding(CTR_DIM, name=f"{prefix}_ctr_emb", dtype="float32")(
    ids
  )
  h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(emb), dense])
  for units in (128, 64):
    h = tf.keras.layers.Dense(units, activation="relu")(h)
  logit = tf.keras.layers.Dense(1, dtype="float32")(h)
  return tf.keras.Model([ids, dense], logit)


# (b) Raw counts ~1e5 into a Dense layer, a regression target ~1e5: fp16 overflows (max 65504).
COUNT_FEATURES = 8


def counts_data(rng, n):
  counts = rng.lognormal(np.log(3e4), 1.0, size=(n, COUNT_FEATURES))
  c = counts
  y = 0.6 * c[:, 0] + 0.4 * c[:, 1] - 0.3 * c[:, 2] + 0.5 * np.sqrt(c[:, 3] * c[:, 4])
  y += 0.2 * np.minimum(c[:, 5], c[:, 6]) + 2e4
  y *= 1.0 + 0.02 * rng.standard_normal(n)
  return counts.astype(np.float32), y.astype(np.float32)


def counts_model(tf, _tf_ext, _data, _prefix):
  x = tf.keras.Input((COUNT_FEATURES,), name="counts")
  h = x
  for units in (64, 64):
    h = tf.keras.layers.Dense(units, activation="relu")(h)
  return tf.keras.Model(x, tf.keras.layers.Dense(1, dtype="float32")(h))


# (c) Coordinates in one metro area (lat 37.75 +- 0.1, lon -122.42 +- 0.12) normalised in the
# model: bf16 rounds 37.75 to steps of 0.25 and -122.42 to steps of 0.5, so the location is lost.
GEO_OTHER = 6
GEO_CENTER, GEO_SPREAD = (37.75, -122.42), (0.03, 0.04)


def geo_data(rng, n):
  z = rng.standard_normal((n, 2)).clip(-3.0, 3.0)
  lat = GEO_CENTER[0] + GEO_SPREAD[0] * z[:, 0]
  lon = GEO_CENTER[1] + GEO_SPREAD[1] * z[:, 1]
  other = rng.standard_normal((n, GEO_OTHER))
  location = np.sin(1.5 * z[:, 0]) + 0.8 * np.cos(1.2 * z[:, 1]) + 0.5 * z[:, 0] * z[:, 1]
  rest = 0.8 * other[:, 0] - 0.5 * other[:, 1] + 0.4 * np.tanh(other[:, 2] * other[:, 3])
  rest += 0.3 * other[:, 4] ** 2
  y = location + rest + 0.1 * rng.standard_normal(n)
  x = np.concatenate([lat[:, None], lon[:, None], other], 1)
  return x.astype(np.float32), y.astype(np.float32)


def geo_model(tf, _tf_ext, data, _prefix):
  inputs, _ = data
  norm = tf.keras.layers.Normalization(name="standardize")
  norm.adapt(inputs[:50_000])  # mean and variance computed in float32 (numpy input)
  x = tf.keras.Input((2 + GEO_OTHER,), name="features")
  h = norm(x)
  for units in (64, 64):
    h = tf.keras.layers.Dense(units, activation="relu")(h)
  return tf.keras.Model(x, tf.keras.layers.Dense(1, dtype="float32")(h))


TASKS = (
  Task(
    key="a",
    title="(a) benign CTR",
    design=f"{CTR_FIELDS} Zipf(1.2) id fields (tf_ext DynamicEmbedding, dim {CTR_DIM}) + "
    f"{CTR_DENSE} dense features, MLP 128-64, labels from a hidden logistic model",
    metric_name="AUC",
    metric=auc,
    loss="binary_crossentropy",
    from_logits=True,
    tf_amp="mixed_bfloat16",
    half="bfloat16",
    batch_size=1024,
    steps=1000,
    quick_steps=150,
    learning_rate=2e-3,
    make_data=ctr_data,
    build=ctr_model,
    uses_tables=True,
  ),
  Task(
    key="b",
    title="(b) raw counts, fp16 overflow",
    design=f"{COUNT_FEATURES} raw count features (lognormal, median 3e4, tail > 1e6) into "
    "Dense 64-64, regression target ~1e5 (MSE); fp16's max is 65504",
    metric_name="R2",
    metric=r2,
    loss="mse",
    from_logits=False,
    tf_amp="mixed_float16",
    half="float16",
    batch_size=256,
    steps=1500,
    quick_steps=200,
    learning_rate=3e-3,
    make_data=counts_data,
    build=counts_model,
  ),
  Task(
    key="c",
    title="(c) coordinates, bf16 precision loss",
    design="lat/lon within one metro area (37.75 +- 0.1, -122.42 +- 0.12) + "
    f"{GEO_OTHER} other features, a Normalization layer in the model, Dense 64-64, "
    "regression (MSE); bf16 keeps 8 significant bits: 0.25 deg steps at 37.75",
    metric_name="R2",
    metric=r2,
    loss="mse",
    from_logits=False,
    tf_amp="mixed_bfloat16",
    half="bfloat16",
    batch_size=256,
    steps=1500,
    quick_steps=300,
    learning_rate=2e-3,
    make_data=geo_data,
    build=geo_model,
  ),
)


# ---- the speed tower --------------------------------------------------------------------------

SPEED_FIELDS, SPEED_DIM, SPEED_DENSE, SPEED_VOCAB = 26, 16, 13, 1_000_000


def speed_data(rng, n):
  """Criteo-shaped batches: 26 Zipf(1.1) id fields (each in its own id range), 13 dense."""
  ids = np.minimum(rng.zipf(1.1, size=(n, SPEED_FIELDS)) - 1, SPEED_VOCAB - 1)
  keys = (ids + np.arange(SPEED_FIELDS) * SPEED_VOCAB).astype(np.int64)
  dense = rng.standard_normal((n, SPEED_DENSE)).astype(np.float32)
  label = (rng.random(n) < 0.25).astype(np.float32)
  return (keys, dense), label


def speed_model(tf, tf_ext, hidden, prefix):
  """A DLRM/DCN-style tower: one tf_ext table for the 26 fields (dim 16), concatenated with the
  dense features, through an MLP of `hidden` widths, a float32 logit."""
  ids = tf.keras.Input((SPEED_FIELDS,), dtype=tf.int64, name="ids")
  dense = tf.keras.Input((SPEED_DENSE,), name="dense_features")
  emb = tf_ext.keras.layers.DynamicEmbedding(
    SPEED_DIM, name=f"{prefix}_speed_emb", dtype="float32"
  )(ids)
  h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(emb), dense])
  for units in hidden:
    h = tf.keras.layers.Dense(units, activation="relu")(h)
  logit = tf.keras.layers.Dense(1, dtype="float32")(h)
  return tf.keras.Model([ids, dense], logit)

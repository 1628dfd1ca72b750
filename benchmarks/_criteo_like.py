"""A seeded generator of a Criteo-like click stream, day by day, with a known Bayes-optimal AUC.

Each sample has 26 categorical fields (int64 ids) and 13 dense features (float32). Field f has
`VOCAB[f]` slots (3 to 10^7) drawn by a bounded Zipf law of exponent `ZIPF[f]` over the slots'
ranks; the id in a slot is a 63-bit hash of (seed, field, slot, epoch), where the slot's epoch is
the last day on which it was churned: every day a fraction `CHURN[f]` of the slots, head and tail
alike (chosen by a hash of (seed, field, slot, day)), gets a brand-new id, and the id it held
fades out of the stream for good. A table that never evicts grows by the churned ids every day.

Labels come from a hidden model, the same on every day: logit = BIAS + sum over fields of a
per-id weight w_f(id) ~ N(0, SIGMA[f]^2), + a few pairwise FM terms <v_f(id), v_g(id)> over
FM_PAIRS with v ~ N(0, FM_SCALE^2 I_4), + dense . w_dense; label ~ Bernoulli(sigmoid(logit)).
Every hidden weight is a pure function of (seed, field, id) through a hash, so a 10^7-slot field
needs no array of 10^7 weights. `Day.prob` is the true click probability of each sample, so the
Bayes-optimal AUC of a day is the AUC of `prob` against `label` (`bayes_auc`).

Everything is numpy and vectorised: a day of 300,000 samples takes a few seconds. The same
(seed, day, samples) gives the same day on any machine.

  from _criteo_like import CriteoLike   # from benchmarks/
  gen = CriteoLike(seed=0)
  day = gen.day(3, 300_000)   # day.ids [n, 26] int64, day.dense [n, 13] float32,
                              # day.label [n] float32, day.prob [n] float64
"""

import dataclasses

import numpy as np

NUM_FIELDS = 26
NUM_DENSE = 13

# Slots per field: a few huge fields (10^6 to 10^7 ids), then mid-sized and small ones.
VOCAB = (
  10_000_000,
  5_000_000,
  2_000_000,
  1_000_000,
  1_000_000,
  500_000,
  300_000,
  200_000,
  100_000,
  50_000,
  30_000,
  10_000,
  5_000,
  2_000,
  1_000,
  500,
  300,
  100,
  50,
  30,
  20,
  10,
  5,
  4,
  3,
  2,
)
# Zipf exponent of each field's slot ranks (lower: a flatter, longer tail).
ZIPF = (1.05, 1.05, 1.1, 1.1, 1.15, 1.1, 1.15, 1.2, 1.1, 1.2) + (1.2,) * 16
# Share of each field's slots that get a new id every day (0 for the small, stable fields).
CHURN = (0.3,) * 11 + (0.05,) * 4 + (0.0,) * 11
# Standard deviation of each field's hidden per-id weights.
SIGMA = (0.9, 0.9, 0.8, 0.8, 0.7, 0.7, 0.6, 0.6, 0.5, 0.5, 0.4) + (0.3,) * 15
# Pairs of fields with a hidden FM interaction, its vectors' size and scale.
FM_PAIRS = ((0, 1), (2, 3), (0, 4), (5, 6), (1, 7), (8, 9), (3, 12), (10, 20))
FM_DIM = 4
FM_SCALE = 0.45
BIAS = -1.6
DENSE_SCALE = 0.25

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# Salts that separate the hash streams.
_SALT_ID, _SALT_CHURN, _SALT_W, _SALT_FM, _SALT_RNG = 1, 2, 3, 4, 5


def mix64(x):
  """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
  x = np.asarray(x, np.uint64)
  with np.errstate(over="ignore"):
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    x = x ^ (x >> np.uint64(31))
  return x


def hash64(*parts):
  """A 64-bit hash of a tuple of ints or uint64 arrays (broadcast), elementwise."""
  h = np.uint64(0x243F6A8885A308D3)
  with np.errstate(over="ignore"):
    for p in parts:
      h = mix64(h ^ (np.asarray(p).astype(np.uint64) + _GOLDEN))
  return h


def unit_uniform(h):
  """Uniform in (0, 1) from uint64 hashes (53 bits)."""
  return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / 9007199254740992.0


def hashed_normal(*parts):
  """A standard normal per element, a pure function of the hashed parts (Box-Muller)."""
  h = hash64(*parts)
  u1 = unit_uniform(h)
  u2 = unit_uniform(mix64(h ^ _GOLDEN))
  return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def zipf_ranks(rng, vocab, exponent, n):
  """n ranks in [0, vocab) with P(rank r) roughly proportional to (r + 1)^-exponent (the inverse
  CDF of a continuous power law on [1, vocab + 1), floored)."""
  u = rng.random(n)
  if vocab == 1:
    return np.zeros(n, np.int64)
  a = 1.0 - exponent
  if abs(a) < 1e-9:  # exponent 1: P(rank < x) = log(x) / log(vocab + 1)
    r = np.floor(np.exp(u * np.log(vocab + 1.0))).astype(np.int64) - 1
  else:
    top = float(vocab + 1) ** a
    r = np.floor((1.0 + u * (top - 1.0)) ** (1.0 / a)).astype(np.int64) - 1
  return np.clip(r, 0, vocab - 1)


def auc(score, label):
  """ROC AUC of `score` against 0/1 `label` (ties share their rank)."""
  from sklearn.metrics import roc_auc_score  # pylint: disable=import-outside-toplevel

  return float(roc_auc_score(label, score))


@dataclasses.dataclass
class Day:
  """One day of samples."""

  index: int
  ids: np.ndarray  # [n, NUM_FIELDS] int64, non-negative
  dense: np.ndarray  # [n, NUM_DENSE] float32
  label: np.ndarray  # [n] float32, 0 or 1
  prob: np.ndarray  # [n] float64: the hidden model's click probability

  def __len__(self):
    return len(self.label)

  def bayes_auc(self):
    """The Bayes-optimal AUC of this day: the true probability's AUC against the labels."""
    return auc(self.prob, self.label)


class CriteoLike:
  """The generator; `day(d, n)` is a pure function of (seed, d, n) and the module's tables."""

  def __init__(self, seed=0, vocab=VOCAB):
    if len(vocab) != NUM_FIELDS:
      raise ValueError(f"vocab needs {NUM_FIELDS} sizes, got {len(vocab)}")
    self.seed = int(seed)
    self.vocab = tuple(int(v) for v in vocab)
    w_rng = np.random.default_rng([self.seed, _SALT_W, 0])
    self.dense_weights = w_rng.normal(0.0, DENSE_SCALE, NUM_DENSE)

  def slot_ids(self, field, slots, day):
    """The ids that `slots` (int64 array) of `field` hold on `day`."""
    epoch = np.zeros(slots.shape, np.int64)
    threshold = np.uint64(int(CHURN[field] * 2**64)) if CHURN[field] > 0 else None
    if threshold is not None:
      undecided = np.ones(slots.shape, bool)
      for d in range(day, 0, -1):  # the latest day <= `day` that churned the slot
        churned = undecided & (hash64(self.seed, _SALT_CHURN, field, slots, d) < threshold)
        epoch[churned] = d
        undecided &= ~churned
        if not undecided.any():
          break
    h = hash64(self.seed, _SALT_ID, field, slots, epoch) >> np.uint64(1)
    return h.astype(np.int64)

  def field_weights(self, field, ids):
    """The hidden first-order weight of each id of `field`."""
    return SIGMA[field] * hashed_normal(self.seed, _SALT_W, field, ids)

  def fm_vectors(self, field, ids):
    """The hidden FM vectors [len(ids), FM_DIM] of `field`'s ids."""
    cols = np.arange(FM_DIM, dtype=np.int64)
    return FM_SCALE * hashed_normal(self.seed, _SALT_FM, field, ids[:, None], cols[None, :])

  def logit(self, ids, dense):
    """The hidden model's logit for ids [n, NUM_FIELDS] and dense [n, NUM_DENSE]."""
    z = BIAS + dense.astype(np.float64) @ self.dense_weights
    for f in range(NUM_FIELDS):
      z += self.field_weights(f, ids[:, f])
    for f, g in FM_PAIRS:
      z += np.sum(self.fm_vectors(f, ids[:, f]) * self.fm_vectors(g, ids[:, g]), axis=1)
    return z

  def day(self, index, n):
    """Day `index` (0, 1, ...) of `n` samples."""
    rng = np.random.default_rng([self.seed, _SALT_RNG, int(index), int(n)])
    ids = np.empty((n, NUM_FIELDS), np.int64)
    for f in range(NUM_FIELDS):
      slots = zipf_ranks(rng, self.vocab[f], ZIPF[f], n)
      ids[:, f] = self.slot_ids(f, slots, index)
    # Criteo's dense features are counts: log1p of a heavy-tailed count, standardised roughly.
    counts = np.floor(np.exp(rng.normal(1.0, 1.2, (n, NUM_DENSE))))
    dense = ((np.log1p(counts) - 1.2) / 0.9).astype(np.float32)
    prob = 1.0 / (1.0 + np.exp(-self.logit(ids, dense)))
    label = (rng.random(n) < prob).astype(np.float32)
    return Day(index, ids, dense, label, prob)

  def stream(self, n, day_samples):
    """The first `n` samples of consecutive days 0, 1, ... of `day_samples` each:
    (ids, dense, label, the day of each sample)."""
    parts = []
    while sum(len(p.label) for p in parts) < n:
      parts.append(self.day(len(parts), day_samples))
    ids, dense, label = (
      np.concatenate([getattr(p, k) for p in parts])[:n] for k in ("ids", "dense", "label")
    )
    days = np.concatenate([np.full(len(p.label), p.index) for p in parts])[:n]
    return ids, dense, label, days

#!/usr/bin/env python3
"""Graph passes for recommendation models: training steps/s with
tf_ext.graph_optimizations on and off, in a TF1 Session and in Keras, every ratio taken in one run.

The model: 26 sparse fields, one tf_ext table each (dim --dim), ids drawn by a Zipf law
(benchmarks/_criteo_like.py's field sizes and exponents); --multi-valued of the fields hold 0 to
--max-ids ids per row (SparseTensor in the Session, RaggedTensor in Keras, mean combiner), the
others one id per row (--shared of the multi-valued fields use a single-id field's table, Session
only); plus 13 dense features, a dense tower and a logistic loss, trained with
Adam wrapped by tf_ext.DynamicEmbeddingOptimizer, batch --batch. Each tower of --towers (MLP widths;
"none" is logistic regression over the features) is measured in turn: the larger the tower, the
smaller the embedding part's share of a step, and so the smaller the gain. The same graph
(Session) or model code (Keras) runs in three variants:
  off     no pass (the graph tf_ext builds: per field a find, segment sums, counts, divisions, and
          on the way back unique, segment sum and one update per table);
  fusion  the embedding fusion pass only (one fused lookup, one fused apply);
  all     every pass (fusion, and the dense part clustered for XLA), as enable() turns them on.
Timed in --rounds interleaved rounds of --steps steps (rotating order; each round's first step
untimed, inputs prepared beforehand); steps/s of each variant's best round and the median of the
rounds' ratios. Target: >= 1.3x steps/s with the passes on (the faster of fusion / all) against
off, in both the Session and Keras; PASS/MISS per tower. The exit status is 0 whatever the numbers.
A PNG (--png) charts the steps/s of each variant, tower and API, with the ratios to off.

The default takes 1.5-5 minutes on a 2-CPU machine (the CPU matters); --quick (batch 512, fewer
steps) under one.

  python benchmarks/embedding_fusion.py
  python benchmarks/embedding_fusion.py --quick --json /tmp/fusion.json --png /tmp/fusion.png
"""

import os
import statistics
import sys
import time

from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_intra_op_threads,
  add_json,
  argument_parser,
  int_list,
  log,
  require_positive,
  use_checkout,
)
from _report import (
  chart_path,
  finish,
  machine_report,
  save_figure,
  verdict,
  versions,
  write_chart,
)
from _rounds import rotated

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
use_checkout()

import _criteo_like  # noqa: E402
import numpy as np  # noqa: E402

TARGET = 1.3
DEFAULT_PNG = chart_path("embedding_fusion.png")
VARIANTS = ("off", "fusion", "all")
LABELS = {"off": "off", "fusion": "embedding fusion", "all": "fusion + XLA (all passes)"}
SWITCHES = {
  "off": {"fuse_embeddings": False, "cluster_dense_for_xla": False},
  "fusion": {"fuse_embeddings": True, "cluster_dense_for_xla": False},
  "all": {"fuse_embeddings": True, "cluster_dense_for_xla": True},
}


def parse_args(argv):
  p = argument_parser(__doc__)
  p.add_argument("--batch", type=int, default=4096)
  p.add_argument("--dim", type=int, default=16, help="embedding dim of every table")
  p.add_argument(
    "--towers",
    default="none;64,32;256,128",
    help="dense towers to measure, separated by ';': MLP widths, or none",
  )
  p.add_argument("--multi-valued", type=int, default=6, help="fields with several ids per row")
  p.add_argument("--max-ids", type=int, default=10, help="most ids in a multi-valued row")
  p.add_argument(
    "--shared",
    type=int,
    default=0,
    help="Session only: this many multi-valued fields look their ids up in a single-id field's "
    "table (a behaviour history sharing the item table, as in DIN)",
  )
  p.add_argument("--batches", type=int, default=8, help="distinct input batches, cycled")
  p.add_argument("--steps", type=int, default=20, help="timed steps per round and variant")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--apis", default="session,keras", help="comma-separated: session, keras")
  p.add_argument("--quick", action="store_true", help="batch 512, 3 rounds of 10 steps")
  p.add_argument("--png", default=DEFAULT_PNG, help="chart path ('' for none)")
  add_intra_op_threads(p)
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    args.batch, args.steps, args.rounds, args.batches = 512, 10, 3, 4
  require_positive(p, args, ["batch", "dim", "max_ids", "batches", "steps", "rounds"])
  if not 0 <= args.multi_valued <= _criteo_like.NUM_FIELDS:
    p.error(f"--multi-valued must be in [0, {_criteo_like.NUM_FIELDS}]")
  try:
    args.towers = [
      [] if t.strip() == "none" else int_list(t) for t in args.towers.split(";") if t.strip()
    ]
  except ValueError:
    p.error(f"--towers takes widths like '64,32' or none, separated by ';', got {args.towers!r}")
  if not args.towers or any(w < 1 for t in args.towers for w in t):
    p.error("--towers needs at least one tower of positive widths (or none)")
  args.apis = [a.strip() for a in args.apis.split(",") if a.strip()]
  unknown = set(args.apis) - {"session", "keras"}
  if unknown or not args.apis:
    p.error(f"--apis takes session and/or keras, got {sorted(unknown) or 'nothing'}")
  most_shared = min(args.multi_valued, _criteo_like.NUM_FIELDS - args.multi_valued)
  if not 0 <= args.shared <= most_shared:
    p.error(f"--shared must be in [0, {most_shared}] (multi-valued fields and single-id tables)")
  if args.shared and "keras" in args.apis:
    p.error("--shared needs --apis session: a Keras DynamicEmbedding layer has one combiner")
  return args


class Batch:
  """One input batch: per field its ids (single-valued: [batch]; multi-valued: the values and row
  lengths of a ragged [batch, None]), the dense features and the labels."""

  def __init__(self, rng, args):
    n, self.fields = args.batch, []
    first_multi = _criteo_like.NUM_FIELDS - args.multi_valued
    for f in range(_criteo_like.NUM_FIELDS):
      vocab, exponent = _criteo_like.VOCAB[f], _criteo_like.ZIPF[f]
      if f < first_multi:
        self.fields.append(_criteo_like.zipf_ranks(rng, vocab, exponent, n))
      else:
        lengths = rng.integers(0, args.max_ids + 1, n)
        values = _criteo_like.zipf_ranks(rng, vocab, exponent, int(lengths.sum()))
        self.fields.append((values, lengths))
    self.dense = rng.normal(size=(n, _criteo_like.NUM_DENSE)).astype(np.float32)
    self.label = (rng.random(n) < 0.25).astype(np.float32)


def sparse_value(tf, values, lengths):
  rows = np.repeat(np.arange(len(lengths)), lengths)
  cols = np.concatenate([np.arange(k) for k in lengths]) if len(lengths) else np.zeros(0)
  indices = np.stack([rows, cols], axis=1).astype(np.int64)
  return tf.compat.v1.SparseTensorValue(
    indices, values, [len(lengths), int(lengths.max(initial=1))]
  )


def tower(tf, embeddings, dense, hidden, dense_layer):
  x = tf.concat(embeddings + [dense], axis=1)
  for width in hidden:
    x = dense_layer(width, "relu")(x)
  return tf.squeeze(dense_layer(1, None)(x), axis=1)


def time_rounds(runners, steps, rounds):
  """{variant: [steps/s of each round]}; runners[v](k) runs k steps of variant v."""
  rates = {v: [] for v in runners}
  order = list(runners)
  for r in range(rounds):
    for v in rotated(order, r):
      runners[v](1)  # untimed: the round's first step
      start = time.perf_counter()
      runners[v](steps)
      rates[v].append(steps / (time.perf_counter() - start))
    log(f"  round {r + 1}/{rounds}: " + ", ".join(f"{v} {rates[v][-1]:.2f}/s" for v in order))
  return rates


def session_runners(tf, tf_ext, args, hidden, batches):
  """TF1 graph with placeholders; one Session per variant, configured by config_proto()."""
  from tf_ext import graph_optimizations  # pylint: disable=import-outside-toplevel

  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    first_multi = _criteo_like.NUM_FIELDS - args.multi_valued
    ids = [
      tf.compat.v1.placeholder(tf.int64, [None], name=f"ids{f}")
      if f < first_multi
      else tf.compat.v1.sparse_placeholder(tf.int64, name=f"ids{f}")
      for f in range(_criteo_like.NUM_FIELDS)
    ]
    dense = tf.compat.v1.placeholder(tf.float32, [None, _criteo_like.NUM_DENSE])
    label = tf.compat.v1.placeholder(tf.float32, [None])
    init = tf.random_normal_initializer(0.0, 0.05)
    table_of = list(range(_criteo_like.NUM_FIELDS))  # --shared: multi-valued field k + first_multi
    table_of[first_multi : first_multi + args.shared] = range(args.shared)  # uses field k's table
    embeddings = [
      tf_ext.dynamic_embedding(
        x,
        args.dim,
        f"field{table_of[f]}",
        initializer=init,
        combiner=None if f < first_multi else "mean",
      )
      for f, x in enumerate(ids)
    ]
    layer = lambda width, act: tf.compat.v1.layers.Dense(width, act)  # noqa: E731
    logit = tower(tf, embeddings, dense, hidden, layer)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
    optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3))
    train = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    initialize = tf.compat.v1.global_variables_initializer()

  feeds = []
  for b in batches:
    feed = {dense: b.dense, label: b.label}
    for x, values in zip(ids, b.fields):
      feed[x] = values if isinstance(values, np.ndarray) else sparse_value(tf, *values)
    feeds.append(feed)

  runners, sessions = {}, []
  for variant in VARIANTS:
    config = graph_optimizations.config_proto(**SWITCHES[variant])
    session = tf.compat.v1.Session(graph=graph, config=config)
    session.run(initialize)
    sessions.append(session)
    state = {"i": 0}

    def run(k, session=session, state=state):
      for _ in range(k):
        session.run(train, feeds[state["i"] % len(feeds)])
        state["i"] += 1

    runners[variant] = run
  return runners, sessions


def keras_runners(tf, tf_ext, args, hidden, batches):
  """One Keras model per variant (same code), each train function instantiated while
  enable()/disable() set its switches."""
  from tf_ext import graph_optimizations  # pylint: disable=import-outside-toplevel

  first_multi = _criteo_like.NUM_FIELDS - args.multi_valued

  def inputs_of(b):
    features = {}
    for f, field in enumerate(b.fields):
      if f < first_multi:
        features[f"ids{f}"] = tf.constant(field)
      else:
        features[f"ids{f}"] = tf.RaggedTensor.from_row_lengths(*field)
    features["numeric"] = tf.constant(b.dense)
    return features, tf.constant(b.label)

  dataset = None
  for b in batches:
    part = tf.data.Dataset.from_tensors(inputs_of(b))
    dataset = part if dataset is None else dataset.concatenate(part)
  dataset = dataset.repeat()

  def build(variant):
    prefix = f"{variant}_{'x'.join(map(str, hidden)) or 'none'}"
    tf.keras.utils.set_random_seed(0)
    inputs = {
      f"ids{f}": tf.keras.Input(shape=(), dtype=tf.int64, name=f"ids{f}")
      if f < first_multi
      else tf.keras.Input(shape=(None,), dtype=tf.int64, ragged=True, name=f"ids{f}")
      for f in range(_criteo_like.NUM_FIELDS)
    }
    inputs["numeric"] = tf.keras.Input(shape=(_criteo_like.NUM_DENSE,), name="numeric")
    init = tf.random_normal_initializer(0.0, 0.05)
    embeddings = [
      tf_ext.keras.layers.DynamicEmbedding(
        args.dim,
        name=f"{prefix}_field{f}",
        initializer=init,
        combiner=None if f < first_multi else "mean",
      )(inputs[f"ids{f}"])
      for f in range(_criteo_like.NUM_FIELDS)
    ]
    layer = lambda width, act: tf.keras.layers.Dense(width, act)  # noqa: E731
    logit = tower(tf, embeddings, inputs["numeric"], hidden, layer)
    model = tf.keras.Model(inputs, logit)
    model.compile(
      optimizer=tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3)),
      loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model

  runners = {}
  for variant in VARIANTS:
    graph_optimizations.enable(**SWITCHES[variant])
    model = build(variant)
    model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)  # instantiates the train step
    # Then the step `fit` runs, called as `fit` calls it, without fit's per-call set-up. The
    # variant's switches are set again first: TensorFlow may instantiate a function again at a
    # later call, and the passes then follow the switches of that moment.
    iterator = iter(dataset)

    def run(k, model=model, iterator=iterator, switches=SWITCHES[variant]):
      graph_optimizations.enable(**switches)
      for _ in range(k):
        model.train_function(iterator)

    runners[variant] = run
  return runners


def report(api, rates):
  best = {v: max(r) for v, r in rates.items()}
  print(f"{api}: steps/s, best round (median)")
  for v in VARIANTS:
    print(f"  {v:<7}: {best[v]:7.2f} ({statistics.median(rates[v]):.2f})")
  ratios = {}
  for v in ("fusion", "all"):
    per_round = [a / b for a, b in zip(rates[v], rates["off"])]
    ratios[v] = {"best": best[v] / best["off"], "median_of_rounds": statistics.median(per_round)}
    median = ratios[v]["median_of_rounds"]
    print(f"  {v} / off: {ratios[v]['best']:.2f}x (median of rounds {median:.2f}x)")
  on = max(ratios["fusion"]["best"], ratios["all"]["best"])
  print(f"  {verdict(on >= TARGET)}: passes on >= {TARGET}x off ({on:.2f}x)")
  return {"steps_per_s": rates, "ratios": ratios, "target": TARGET, "met": on >= TARGET}


def chart(path, towers):
  """Grouped bars: steps/s (best round) of off / fusion / all for each API and tower."""
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  groups = [
    (f"{api}\ntower {entry['hidden'] or 'none'}", entry[api])
    for api in ("session", "keras")
    for entry in towers
    if api in entry
  ]
  fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
  width = 0.8 / len(VARIANTS)
  for k, variant in enumerate(VARIANTS):
    rates = [max(result["steps_per_s"][variant]) for _, result in groups]
    positions = [g + (k - 1) * width for g in range(len(groups))]
    bars = ax.bar(positions, rates, width, label=LABELS[variant])
    if variant != "off":
      for bar, (_, result) in zip(bars, groups):
        ratio = result["ratios"][variant]["best"]
        ax.annotate(
          f"{ratio:.2f}x",
          (bar.get_x() + bar.get_width() / 2, bar.get_height()),
          ha="center",
          va="bottom",
          fontsize=7,
        )
  ax.set_xticks(range(len(groups)), [name for name, _ in groups], fontsize=8)
  ax.set_ylabel("training steps/s (best round)")
  ax.set_title(f"tf_ext graph passes, 26 fields, batch 4096 (ratio to off; target {TARGET}x)")
  ax.legend()
  save_figure(fig, plt, path, dpi=120)


def main(argv):
  args = parse_args(argv)
  wall_start = time.perf_counter()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel
  from tf_ext import graph_optimizations  # pylint: disable=import-outside-toplevel

  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  print("Graph passes for recommendation models: steps/s with the passes on and off")
  results = {"machine": machine_report(tf, tf_ext, np), "versions": versions(tf, tf_ext, np)}
  print(
    f"model        : 26 fields ({args.multi_valued} multi-valued, <= {args.max_ids} ids, mean), "
    f"dim {args.dim}, 13 dense, Adam, batch {args.batch}"
    + (f"; {args.shared} of them share a single-id field's table" if args.shared else "")
  )
  rng = np.random.default_rng(0)
  batches = [Batch(rng, args) for _ in range(args.batches)]
  results["args"] = {k: v for k, v in vars(args).items() if k != "json"}
  results["towers"] = []
  for hidden in args.towers:
    name = f"tower {hidden or 'none'}"
    print(f"\n== {name}")
    entry = {"hidden": hidden}
    if "session" in args.apis:
      log(f"{name}, TF1 Session: building and warming up the three variants")
      runners, sessions = session_runners(tf, tf_ext, args, hidden, batches)
      entry["session"] = report("TF1 Session", time_rounds(runners, args.steps, args.rounds))
      for s in sessions:
        s.close()
    if "keras" in args.apis:
      log(f"{name}, Keras: building and warming up the three variants")
      runners = keras_runners(tf, tf_ext, args, hidden, batches)
      entry["keras"] = report("Keras fit", time_rounds(runners, args.steps, args.rounds))
      graph_optimizations.disable()
    results["towers"].append(entry)
  if args.png:
    write_chart(args.png, results, lambda path: chart(path, results["towers"]))
  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

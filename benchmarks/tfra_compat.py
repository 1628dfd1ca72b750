"""The same TFRA-API programs run with TFRA 0.7.2 and with `import tf_ext.tfra as de`: samples/s
and ratios, interleaved rounds, and the same models written with tf_ext's native API.

Two programs, each written once against a `de` module (TFRA's `dynamic_embedding`, or
tf_ext.tfra):
- keras: a DeepFM-like Keras model on the Criteo-like stream (26 id fields, each a
  `de.keras.layers.BasicEmbedding`, an FM term, a [256, 128] tower over the 13 dense features and
  the embeddings), `de.DynamicEmbeddingOptimizer(Adam)`, `model.train_on_batch`;
- tf1: a TF1 graph: 26 one-id SparseTensor fields and a 3-id history field through
  `de.embedding_lookup_sparse` (mean), a logistic head,
  `DynamicEmbeddingOptimizer(AdagradOptimizer)`, `Session.run` with feeds.
"native" is each model with tf_ext's own API (tf_ext.keras.layers.DynamicEmbedding,
tf_ext.embedding_lookup). "floor" (opt-in: --impls tfra,tf_ext.tfra,native,floor) is each model
with one-row dense embeddings in place of the tables (every id reads row 0): the rest of the
step, which bounds every implementation's samples/s. Each (implementation, program) trains in a
fresh process (TFRA's import patches TensorFlow), round after round in rotated order; a round's
ratio compares runs of that round, and the verdicts use the median over rounds.

Targets: tf_ext.tfra >= 2x TFRA's samples/s on the Keras model and >= 1.5x on the TF1 graph; the
compat path >= 0.95x the native API on both.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import _common
import _report
import _rounds

IMPLS = ("tfra", "tf_ext.tfra", "native", "floor")
DEFAULT_IMPLS = IMPLS[:3]
PROGRAMS = ("keras", "tf1")
TARGETS = {
  ("keras", "tfra"): 2.0,
  ("tf1", "tfra"): 1.5,
  ("keras", "native"): 0.95,
  ("tf1", "native"): 0.95,
}
NUM_FIELDS, NUM_DENSE, HISTORY = 26, 13, 3


def batches(args):
  """(ids [n, 26], history [n, 3], dense [n, 13], label [n]) batches from the Criteo-like stream."""
  from _criteo_like import CriteoLike  # pylint: disable=import-outside-toplevel

  gen = CriteoLike(seed=1)
  day = gen.day(1, args.batch * (args.warmup + args.steps))
  history = day.ids[:, :HISTORY] ^ day.ids[:, HISTORY : 2 * HISTORY]  # a multi-id field
  for i in range(args.warmup + args.steps):
    s = slice(i * args.batch, (i + 1) * args.batch)
    yield day.ids[s], history[s], day.dense[s], day.label[s]


class TfraApi:
  """A program's calls written against TFRA's `de` (TFRA itself, or tf_ext.tfra)."""

  def __init__(self, tf, de):
    self.tf, self.de = tf, de

  def embedding(self, dim, name):
    return self.de.keras.layers.BasicEmbedding(dim, name=name)

  def sparse_lookup(self, name, dim, sparse_ids):
    initializer = self.tf.keras.initializers.RandomNormal()
    var = self.de.get_variable(name, dim=dim, initializer=initializer)
    return self.de.embedding_lookup_sparse(var, sparse_ids, None, combiner="mean", name=name)

  def optimizer(self, optimizer):
    return self.de.DynamicEmbeddingOptimizer(optimizer)


class NativeApi:
  """The same calls with tf_ext's own API."""

  def __init__(self, tf_ext):
    self.tf_ext = tf_ext

  def embedding(self, dim, name):
    return self.tf_ext.keras.layers.DynamicEmbedding(dim, name=name, initializer="normal")

  def sparse_lookup(self, name, dim, sparse_ids):
    table = self.tf_ext.get_dynamic_embedding_variable(name, dim, initializer="normal")
    return self.tf_ext.embedding_lookup(table, sparse_ids, combiner="mean")

  def optimizer(self, optimizer):
    return self.tf_ext.DynamicEmbeddingOptimizer(optimizer)


class FloorApi:
  """The same calls with one-row dense embeddings: the models' cost without their tables."""

  def __init__(self, tf):
    self.tf = tf

  def embedding(self, dim, name):
    row = self.tf.keras.layers.Embedding(1, dim, name=name)
    return lambda ids: row(self.tf.zeros_like(ids))

  def sparse_lookup(self, name, dim, sparse_ids):
    tf = self.tf
    row = tf.compat.v1.get_variable(
      name, [1, dim], initializer=tf.keras.initializers.RandomNormal()
    )
    zeros = tf.SparseTensor(
      sparse_ids.indices, tf.zeros_like(sparse_ids.values), sparse_ids.dense_shape
    )
    return tf.nn.embedding_lookup_sparse(row, zeros, None, combiner="mean")

  def optimizer(self, optimizer):
    return optimizer


def run_keras(tf, api, args):
  ids = tf.keras.Input(shape=(NUM_FIELDS,), dtype=tf.int64)
  dense = tf.keras.Input(shape=(NUM_DENSE,), dtype=tf.float32)
  fields = [api.embedding(args.dim, f"field{f}")(ids[:, f]) for f in range(NUM_FIELDS)]
  stacked = tf.stack(fields, axis=1)  # [batch, fields, dim]
  fm = 0.5 * tf.reduce_sum(
    tf.square(tf.reduce_sum(stacked, 1)) - tf.reduce_sum(tf.square(stacked), 1), 1, keepdims=True
  )
  deep = tf.concat([tf.reshape(stacked, [-1, NUM_FIELDS * args.dim]), dense], 1)
  for width in (256, 128):
    deep = tf.keras.layers.Dense(width, activation="relu")(deep)
  model = tf.keras.Model([ids, dense], tf.sigmoid(tf.keras.layers.Dense(1)(deep) + fm))
  model.compile(api.optimizer(tf.keras.optimizers.legacy.Adam(1e-3)), "binary_crossentropy")
  return timed(args, lambda b: model.train_on_batch([b[0], b[2]], b[3]))


def run_tf1(tf, api, args):
  tf.compat.v1.disable_eager_execution()
  v1 = tf.compat.v1
  ids = v1.placeholder(tf.int64, [None, NUM_FIELDS])
  history = v1.placeholder(tf.int64, [None, HISTORY])
  label = v1.placeholder(tf.float32, [None])
  rows = tf.shape(ids, out_type=tf.int64)[0]

  def sparse(dense_ids):
    width = dense_ids.shape[1]
    positions = tf.range(rows * width)
    indices = tf.stack([positions // width, positions % width], 1)
    return tf.SparseTensor(indices, tf.reshape(dense_ids, [-1]), tf.stack([rows, width]))

  columns = [sparse(ids[:, f : f + 1]) for f in range(NUM_FIELDS)] + [sparse(history)]
  embedded = [api.sparse_lookup(f"f{f}", args.dim, c) for f, c in enumerate(columns)]
  logit = tf.squeeze(v1.layers.dense(tf.concat(embedded, 1), 1), 1)
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
  optimizer = api.optimizer(v1.train.AdagradOptimizer(0.05))
  train = optimizer.minimize(loss, global_step=v1.train.get_or_create_global_step())
  session = v1.Session()
  session.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
  return timed(args, lambda b: session.run(train, {ids: b[0], history: b[1], label: b[3]}))


def timed(args, step):
  seconds = 0.0
  for i, batch in enumerate(batches(args)):
    start = time.perf_counter()
    step(batch)
    if i >= args.warmup:
      seconds += time.perf_counter() - start
  return {"samples_per_s": args.batch * args.steps / seconds, "seconds": seconds}


def worker(args):
  _common.use_checkout()
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  if args.impl == "tfra":  # TFRA's process imports no tf_ext
    de, version, status = _common.import_tfra(False, "cannot run the TFRA baseline")
    if de is None:
      raise SystemExit(status)
    api = TfraApi(tf, de)
  else:
    import tf_ext  # pylint: disable=import-outside-toplevel
    import tf_ext.tfra  # pylint: disable=import-outside-toplevel

    version = tf_ext.__version__
    apis = {"native": NativeApi(tf_ext), "floor": FloorApi(tf)}
    api = apis.get(args.impl) or TfraApi(tf, tf_ext.tfra)
  run = run_keras if args.program == "keras" else run_tf1
  result = run(tf, api, args)
  result.update(impl=args.impl, program=args.program, version=version)
  print(json.dumps(result))


def main():
  p = _common.argument_parser(__doc__)
  p.add_argument("--worker", action="store_true", help="(internal) one run; prints its JSON")
  p.add_argument("--impl", choices=IMPLS)
  p.add_argument("--program", choices=PROGRAMS)
  p.add_argument("--programs", default=",".join(PROGRAMS))
  p.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help=f"of {IMPLS}")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--batch", type=int, default=2048)
  p.add_argument("--steps", type=int, default=40, help="timed steps per run")
  p.add_argument("--warmup", type=int, default=8, help="untimed steps first (tracing, new rows)")
  p.add_argument("--dim", type=int, default=16)
  p.add_argument("--quick", action="store_true", help="a short run: 1 round, small batches")
  _common.add_json(p)
  args = p.parse_args()
  if args.worker:
    return worker(args)
  if args.quick:
    args.rounds, args.batch, args.steps, args.warmup = 1, 256, 4, 2
  _common.require_positive(p, args, ["rounds", "batch", "steps", "warmup", "dim"])
  wall_start = time.perf_counter()
  programs = [x for x in args.programs.split(",") if x]
  impls = [x for x in args.impls.split(",") if x]
  for name in programs + impls:
    if name not in PROGRAMS + IMPLS:
      p.error(f"unknown program or implementation {name!r}")
  _common.use_checkout()
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import tf_ext  # pylint: disable=import-outside-toplevel

  results_machine = _report.machine_report(tf, tf_ext, np)
  runs = {(program, impl): [] for program in programs for impl in impls}
  for round_index in range(args.rounds):
    for program in programs:
      for impl in _rounds.rotated(impls, round_index):
        command = [
          sys.executable,
          os.path.abspath(__file__),
          "--worker",
          "--impl",
          impl,
          "--program",
          program,
          "--batch",
          str(args.batch),
          "--steps",
          str(args.steps),
          "--warmup",
          str(args.warmup),
          "--dim",
          str(args.dim),
        ]
        _common.log(f"round {round_index + 1}/{args.rounds}: {program} with {impl}")
        out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        runs[(program, impl)].append(result["samples_per_s"])
        _common.log(f"  {result['samples_per_s']:,.0f} samples/s")
  results = {"machine": results_machine, "runs": {f"{p}/{i}": v for (p, i), v in runs.items()}}
  results["verdicts"] = {}
  print()
  print(f"{'program':8s} {'implementation':14s} {'samples/s (median)':>20s}   per round")
  for (program, impl), values in runs.items():
    rounds = " ".join(f"{v:,.0f}" for v in values)
    print(f"{program:8s} {impl:14s} {statistics.median(values):>20,.0f}   {rounds}")
  print()
  all_met = True
  for program in programs:
    for anchor in ("tfra", "native"):
      if "tf_ext.tfra" not in impls or anchor not in impls:
        continue
      ratios = [a / b for a, b in zip(runs[(program, "tf_ext.tfra")], runs[(program, anchor)])]
      ratio, target = statistics.median(ratios), TARGETS[(program, anchor)]
      met = ratio >= target
      all_met &= met
      spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
      print(
        f"{program}: tf_ext.tfra / {anchor:6s} = {ratio:.2f}x (rounds {spread}; target >= "
        f"{target}x) {_report.verdict(met)}"
      )
      results["verdicts"][f"{program}/{anchor}"] = {
        "ratio": ratio,
        "ratios": ratios,
        "target": target,
        "met": met,
      }
    if "floor" in impls and "tfra" in impls:
      ratios = [a / b for a, b in zip(runs[(program, "floor")], runs[(program, "tfra")])]
      ceiling = statistics.median(ratios)
      results["verdicts"][f"{program}/floor"] = {"ceiling": ceiling, "ratios": ratios}
      print(
        f"{program}: floor / tfra    = {ceiling:.2f}x: the most any implementation's tables "
        "could give over TFRA's (the step without them)"
      )
  results.update(
    batch=args.batch, steps=args.steps, rounds=args.rounds, dim=args.dim, all_targets_met=all_met
  )
  return _report.finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())

#!/usr/bin/env python3
"""Model quality against TFRA, over seeds: what makes TFRA's AUC differ from tf_ext's on the
all-to-all benchmark's workload, and by how much.

The workload of benchmarks/alltoall_tables.py (its DeepFM, dim 16, [256, 128] tower, Keras Adam at
lr 0.002, the drifting Criteo-like stream of 100,000-sample days, rows from N(0, s^2) by a seeded
Keras RandomNormal), trained in one process on the 4-rank benchmark's global batch (4 x 4096
samples a step, 110 steps, ~18 days): the same updates as its ranks make (the mean loss over the
global batch), without the cluster, so that a run takes ~20 s and many seeds fit. The AUC is
progressive: every prediction a step made before learning from it, per day of the stream.

Configurations (each run in a fresh process: TFRA's import patches TensorFlow):
  tfra              TFRA 0.7.2 de.keras.layers.Embedding, de.DynamicEmbeddingOptimizer(Adam);
  tfra_independent  the same with tf.random_normal_initializer (tf.random.set_seed(seed)): TFRA
                    calls its initializer for each lookup's keys, and a Keras initializer
                    returns the same values at every call (seeded or not, in Keras 2.15), so
                    with `tfra` every id that is new at position i of a lookup starts from the
                    same row; TensorFlow's initializer draws afresh at every call;
  tfra_api          the `tfra` program with `import tf_ext.tfra as de`;
  row, optimizer    tf_ext's native API (tf_ext.get_dynamic_embedding_variable,
                    tf_ext.DynamicEmbeddingOptimizer(Adam, bias_correction_step=...)): each row
                    bias-corrected by its own update count, or by the optimizer's step as
                    TensorFlow and TFRA do (tf_ext's default);
  defaults          tf_ext's native API with its defaults: the table's default initial rows
                    (N(0, 0.001^2), whatever --initial-stddev) and the optimizer's.
The seed is the initializer's (the stream and the dense layers are the same in every run).

Prints, per configuration, the AUC over the run for each seed and their mean, then the mean AUC of
each day over the seeds beside TFRA's, with each configuration's difference from it.

  python benchmarks/tfra_quality.py                                # 4 seeds, ~8 min
  python benchmarks/tfra_quality.py --seeds 2 --initial-stddev 0.001
  python benchmarks/tfra_quality.py --configs tfra,optimizer --json /tmp/tfra_quality.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import _common
import _report
import _rounds
import numpy as np

CONFIGS = ("tfra", "tfra_independent", "tfra_api", "row", "optimizer", "defaults")
RANKS, RANK_BATCH, STEPS = 4, 4096, 110
DAY_SAMPLES = 100_000


def stream(path, steps):
  """The benchmark's global stream (RANKS x RANK_BATCH x `steps` samples), cached at `path`."""
  import _criteo_like

  if os.path.exists(path):
    data = np.load(path)
    return data["ids"], data["dense"], data["label"], data["days"]
  ids, dense, label, days = _criteo_like.CriteoLike(seed=0).stream(
    RANKS * RANK_BATCH * steps, DAY_SAMPLES
  )
  np.savez(path, ids=ids, dense=dense, label=label, days=days)
  return ids, dense, label, days


def worker(config, seed, stddev, data_path, steps):
  """One training run; prints {"auc", "per_day"} as its last line."""
  _common.use_checkout()
  import _alltoall_tables_worker as alltoall_model
  import _criteo_like
  import tensorflow as tf

  tf.config.threading.set_intra_op_parallelism_threads(_report.cpus_available())
  ids, dense, label, days = stream(data_path, steps)
  if config == "tfra_independent":
    tf.random.set_seed(seed)
    init = tf.random_normal_initializer(stddev=stddev)
  else:
    init = tf.keras.initializers.RandomNormal(stddev=stddev, seed=seed)
  dim = 16
  logit_of, dense_vars = alltoall_model.deepfm(tf, dim, [256, 128], 0)
  adam = tf.keras.optimizers.Adam(alltoall_model.LEARNING_RATE)
  if config in ("tfra", "tfra_independent", "tfra_api"):
    if config == "tfra_api":
      import tf_ext.tfra as de
    else:
      de, _, status = _common.import_tfra(False, "")
      if de is None:
        raise SystemExit(f"TFRA: {status}")
    layer = de.keras.layers.Embedding(dim, key_dtype=tf.int64, initializer=init, name="emb")
    optimizer = de.DynamicEmbeddingOptimizer(adam)
    embed = layer

    def variables():
      return layer.trainable_variables + dense_vars

  else:
    import tf_ext

    if config == "defaults":
      table = tf_ext.get_dynamic_embedding_variable("emb", dim)
      optimizer = tf_ext.DynamicEmbeddingOptimizer(adam)
    else:
      table = tf_ext.get_dynamic_embedding_variable("emb", dim, initializer=init)
      optimizer = tf_ext.DynamicEmbeddingOptimizer(adam, bias_correction_step=config)

    def embed(batch_ids):
      unique, positions = tf.unique(tf.reshape(batch_ids, [-1]))
      return tf.reshape(tf.gather(table.lookup(unique), positions), [-1, batch_ids.shape[1], dim])

    def variables():
      return [table.gradient_anchor] + dense_vars

  @tf.function
  def step(batch_ids, batch_dense, batch_label):
    with tf.GradientTape() as tape:
      logit = logit_of(embed(batch_ids), batch_dense)
      loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=batch_label, logits=logit)
      )
    trained = variables()
    optimizer.apply_gradients(zip(tape.gradient(loss, trained), trained))
    return tf.sigmoid(logit)

  batch = RANKS * RANK_BATCH
  probs = np.zeros(len(label), np.float32)
  for s in range(steps):
    part = slice(s * batch, (s + 1) * batch)
    probs[part] = step(ids[part], dense[part], label[part]).numpy()
  per_day = {int(d): _criteo_like.auc(probs[days == d], label[days == d]) for d in np.unique(days)}
  print(json.dumps({"auc": _criteo_like.auc(probs, label), "per_day": per_day}))


def main(argv=None):
  p = _common.argument_parser(__doc__)
  p.add_argument(
    "--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {CONFIGS}"
  )
  p.add_argument("--seeds", type=int, default=4, help="initializer seeds 0..N-1 per configuration")
  p.add_argument("--initial-stddev", type=float, default=0.01, help="of the initial rows")
  p.add_argument("--steps", type=int, default=STEPS, help="training steps of the global batch")
  _common.add_json(p)
  p.add_argument("--worker", nargs=3, metavar=("CONFIG", "SEED", "DATA"), help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    config, seed, data = args.worker
    return worker(config, int(seed), args.initial_stddev, data, args.steps)
  configs = [c for c in args.configs.split(",") if c]
  unknown = [c for c in configs if c not in CONFIGS]
  if unknown:
    p.error(f"unknown config(s) {unknown}; known: {CONFIGS}")
  _common.require_positive(p, args, ["seeds", "steps"])
  if not args.initial_stddev > 0:
    p.error("--initial-stddev must be > 0")
  wall = time.perf_counter()
  _common.use_checkout()
  import tensorflow as tf

  import tf_ext

  print("== model quality against TFRA, over seeds (the all-to-all benchmark's workload) ==")
  machine = _report.machine_report(tf, tf_ext, np)
  needs_tfra = any(c in ("tfra", "tfra_independent") for c in configs)
  _, tfra_version, tfra_status = _common.import_tfra(not needs_tfra, "not run")
  print(f"TFRA         : {tfra_status}")
  if needs_tfra and tfra_version is None:
    raise SystemExit("TFRA is needed for its configurations: `make bench-deps` installs it")
  versions = _report.versions(tf, tf_ext, np, tfra=tfra_version)
  results = {"machine": machine, "versions": versions, "runs": {}}
  results["workload"] = {
    "global_batch": RANKS * RANK_BATCH,
    "steps": args.steps,
    "day_samples": DAY_SAMPLES,
    "initial_stddev": args.initial_stddev,
    "seeds": args.seeds,
  }
  with tempfile.TemporaryDirectory(prefix="tfra_quality_") as directory:
    data = os.path.join(directory, "stream.npz")
    day_of_sample = stream(data, args.steps)[3]
    for seed in range(args.seeds):
      for config in _rounds.rotated(configs, seed):
        t = time.perf_counter()
        command = [sys.executable, os.path.abspath(__file__), "--worker", config, str(seed), data]
        command += ["--initial-stddev", str(args.initial_stddev), "--steps", str(args.steps)]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
          raise SystemExit(f"{config} seed {seed} failed (exit status {done.returncode})")
        run = json.loads(done.stdout.strip().splitlines()[-1])
        run["per_day"] = {int(d): a for d, a in run["per_day"].items()}
        results["runs"].setdefault(config, []).append(run)
        _common.log(
          f"{config:<17} seed {seed}: AUC {run['auc']:.5f} ({time.perf_counter() - t:.0f}s)"
        )
  values, counts = np.unique(day_of_sample, return_counts=True)
  full_days = [int(d) for d, n in zip(values, counts) if n == DAY_SAMPLES]
  report(results["runs"], configs, args, full_days)
  return _report.finish(results, args.json, wall)


def report(runs, configs, args, full_days):
  print(
    f"\nAUC over the run (progressive), per seed and mean; rows from N(0, {args.initial_stddev}^2):"
  )
  for config in configs:
    values = [r["auc"] for r in runs[config]]
    each = " ".join(f"{v:.5f}" for v in values)
    print(f"  {config:<17} {each}   mean {np.mean(values):.5f} (std {np.std(values):.5f})")
  reference = "tfra" if "tfra" in configs else configs[0]
  days = sorted(runs[reference][0]["per_day"])

  def mean_of(config, day):
    return float(np.mean([r["per_day"][day] for r in runs[config]]))

  others = [c for c in configs if c != reference]
  print(
    f"\nMean AUC per day over {args.seeds} seed(s), beside {reference}'s, and each one's "
    "difference:"
  )
  print(
    f"  {'day':>3} "
    + " ".join(f"{c:>17}" for c in configs)
    + "".join(f"  {c + '-' + reference:>22}" for c in others)
  )
  for day in days:
    line = f"  {day:>3}{' ' if day in full_days else '*'}" + " ".join(
      f"{mean_of(c, day):17.4f}" for c in configs
    )
    line += "".join(f"  {mean_of(c, day) - mean_of(reference, day):+22.4f}" for c in others)
    print(line)
  if set(days) - set(full_days):
    print("  * a partial day (its AUC is noisier): left out of the counts below unless all are")
  judged = [d for d in days if d in full_days] or days
  print(f"\nDays on which each configuration's mean AUC is at least {reference}'s, and the gaps:")
  for config in others:
    gaps = [mean_of(config, d) - mean_of(reference, d) for d in judged]
    at_least = sum(g >= 0 for g in gaps)
    print(
      f"  {config:<17} {at_least} of {len(gaps)} days; smallest {min(gaps):+.4f}, largest "
      f"{max(gaps):+.4f}; within 0.0005 (equal to 3 decimals) on "
      f"{sum(abs(g) < 0.0005 for g in gaps)} days"
    )


if __name__ == "__main__":
  sys.exit(main())

"""The rank program of alltoall_tables.py (`alltoall_tables.py --worker`): its DeepFM-like model
(also tfra_quality.py's), the training step of each configuration (a tf_ext table split or
replicated, TFRA's HvdAllToAllEmbedding or tf_ext.tfra's), and the timed steps between two
barriers with the counters read around them."""

import json
import os
import time

import _common
import _criteo_like
import _horovod_cluster
import numpy as np

BASE_RATE = 0.2  # the stream's click rate, roughly: the output bias starts at its log-odds


LEARNING_RATE = 0.002


def deepfm(tf, dim, hidden, seed):
  """The dense part of the model, the same on every rank (seeded): a function of the embeddings
  [B, F, dim] and dense features [B, D] to the logit [B], and its variables."""
  init = tf.keras.initializers.GlorotUniform(seed=seed)
  width = _criteo_like.NUM_FIELDS * dim + _criteo_like.NUM_DENSE
  linear = tf.Variable(init([width, 1]), name="linear")
  layers, last = [], width
  for i, units in enumerate(hidden):
    layers.append(
      (tf.Variable(init([last, units]), name=f"mlp{i}"), tf.Variable(tf.zeros([units])))
    )
    last = units
  out = tf.Variable(init([last, 1]), name="mlp_out")
  bias = tf.Variable(float(np.log(BASE_RATE / (1 - BASE_RATE))), name="bias")

  def logit(emb, dense):
    x = tf.concat([tf.reshape(emb, [-1, width - _criteo_like.NUM_DENSE]), dense], 1)
    summed = tf.reduce_sum(emb, 1)  # FM: 0.5 * sum_k ((sum_f e_fk)^2 - sum_f e_fk^2)
    fm = 0.5 * tf.reduce_sum(tf.square(summed) - tf.reduce_sum(tf.square(emb), 1), 1)
    h = x
    for w, b in layers:
      h = tf.nn.relu(h @ w + b)
    return (x @ linear)[:, 0] + fm + (h @ out)[:, 0] + bias

  variables = [linear, out, bias] + [v for pair in layers for v in pair]
  return logit, variables


def initial_rows(tf, spec):
  return tf.keras.initializers.RandomNormal(stddev=spec["initial_stddev"], seed=spec["seed"])


def native_initial_rows(tf, spec):
  """tf_ext's default initializer (None), or with --native-rows same the TFRA programs' rows."""
  return initial_rows(tf, spec) if spec["native_rows"] == "same" else None


def tf_ext_step(tf, spec, distribution):
  """The training step of a tf_ext table (split or replicated), and its table's figures."""
  import tf_ext
  import tf_ext.lightcc as hvd

  dim = spec["dim"]
  table = tf_ext.get_dynamic_embedding_variable(
    "deepfm_emb",
    dim,
    initializer=native_initial_rows(tf, spec),
    distribution=distribution,
  )
  logit_of, dense_vars = deepfm(tf, dim, spec["hidden"], spec["seed"])
  optimizer = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(LEARNING_RATE))
  variables = [table.gradient_anchor] + dense_vars

  def embed(ids):
    if distribution is not None:  # its lookup deduplicates before the exchange
      return table.lookup(ids)
    unique, positions = tf.unique(tf.reshape(ids, [-1]))
    return tf.reshape(tf.gather(table.lookup(unique), positions), [-1, ids.shape[1], dim])

  @tf.function
  def step(ids, dense, label):
    with tf.GradientTape() as tape:
      logit = logit_of(embed(ids), dense)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
    grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))
    return tf.sigmoid(logit)

  def figures():
    return {"rows": int(table.size().numpy()), "bytes": int(table.memory_bytes().numpy())}

  return step, figures


def tfra_step(tf, spec, hvd, de):
  """The training step of HvdAllToAllEmbedding from `de` (TFRA's, or tf_ext.tfra's), and its
  table's figures."""
  dim = spec["dim"]
  layer = de.keras.layers.HvdAllToAllEmbedding(
    embedding_size=dim,
    key_dtype=tf.int64,
    initializer=initial_rows(tf, spec),
    name="deepfm_emb",
  )
  logit_of, dense_vars = deepfm(tf, dim, spec["hidden"], spec["seed"])
  optimizer = de.DynamicEmbeddingOptimizer(
    tf.keras.optimizers.Adam(LEARNING_RATE), synchronous=True
  )
  size = float(hvd.size())

  @tf.function
  def step(ids, dense, label):
    with tf.GradientTape() as tape:
      logit = logit_of(layer(ids), dense)
      # Horovod sums TFRA's dense gradients and each owner sums every rank's row gradients:
      # divided by the ranks, both are the global batch's mean, as in the tf_ext runs.
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
      loss = loss / size
    variables = layer.trainable_variables + dense_vars
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return tf.sigmoid(logit)

  def figures():
    rows = int(layer.params.size().numpy())
    if de.__name__.startswith("tf_ext"):
      tables_bytes = sum(int(t.memory_bytes().numpy()) for t in layer.params.tables)
      return {"rows": rows, "bytes": tables_bytes}
    # Key + value, and Adam's two slot tables (each a key and a value): a lower bound.
    return {"rows": rows, "bytes": rows * (3 * 8 + 3 * 4 * dim), "bytes_estimated": True}

  return step, figures


def worker(args):
  _common.use_checkout()
  with open(args.spec) as f:
    spec = json.load(f)
  config = spec["config"]
  import horovod.tensorflow as horovod_hvd
  import tensorflow as tf

  tf.config.threading.set_intra_op_parallelism_threads(spec["intra_op_threads"])
  tf.config.threading.set_inter_op_parallelism_threads(spec["inter_op_threads"])
  if config == "tfra":
    horovod_hvd.init()
  else:
    import tf_ext.lightcc as hvd

    hvd.init()
  if config == "tfra_api":
    horovod_hvd = hvd  # the tf_ext.tfra program's Horovod
  rank, ranks = horovod_hvd.rank(), horovod_hvd.size()
  b, total = spec["batch"], spec["warmup"] + spec["steps"]
  data = np.load(spec["data"], mmap_mode="r")
  # This rank's part of every global batch: samples [s*G + r*b, s*G + (r+1)*b) of step s.
  mine = (np.arange(total)[:, None] * b * ranks + rank * b + np.arange(b)[None, :]).reshape(-1)
  ids, dense, label = (np.ascontiguousarray(data[k][mine]) for k in ("ids", "dense", "label"))
  del data
  if config == "tfra":
    de, _, status = _common.import_tfra(False, "")
    if de is None:
      raise RuntimeError(f"TFRA: {status}")
    step, figures = tfra_step(tf, spec, horovod_hvd, de)
  elif config == "tfra_api":
    import tf_ext.tfra as de

    step, figures = tfra_step(tf, spec, hvd, de)
  else:
    step, figures = tf_ext_step(tf, spec, "alltoall" if config == "alltoall" else None)

  def barrier():
    _horovod_cluster.barrier(horovod_hvd, tf, "a2a_bench_barrier")

  def run(first, count):
    for s in range(first, first + count):
      part = slice(s * b, (s + 1) * b)
      probs[part] = step(ids[part], dense[part], label[part]).numpy()

  probs = np.zeros(total * b, np.float32)
  rss_before = _common.rss_bytes()
  t = time.perf_counter()
  run(0, spec["warmup"])
  warmup_s = time.perf_counter() - t
  barrier()
  before = _horovod_cluster.read_counters()
  t0 = time.perf_counter()
  run(spec["warmup"], spec["steps"])
  barrier()
  elapsed = time.perf_counter() - t0
  after = _horovod_cluster.read_counters()
  np.save(os.path.join(args.result_dir, f"probs{rank}.npy"), probs)
  result = {
    "rank": rank,
    "elapsed_s": elapsed,
    "warmup_s": warmup_s,
    "counters": {k: after[k] - before[k] for k in after},
    "rss_before_steps": rss_before,
    "rss_after_steps": _common.rss_bytes(),
    "peak_rss": _common.peak_rss_bytes(),
    "table": figures(),
  }
  with open(os.path.join(args.result_dir, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
  barrier()  # nobody leaves (tearing down Gloo) while a peer still reads its counters

"""The model of quality.py, written once for every backend: DeepFM in TF1 graph mode with its
session, and each backend's embedding (tf_ext with admission and eviction or with its defaults,
the memory-matched hashed tf.Variable, TFRA) with its initial rows and its optimizer's wrapper."""

import time

import _criteo_like
import numpy as np


def deepfm_logit(tf, emb, dense, hidden_units, seed, bias):
  """DeepFM: emb [B, F, dim] field embeddings, dense [B, D]; returns the logit [B]. `bias`: the
  output bias's initial value (the log-odds of the first day's click rate)."""
  fields, dim = emb.shape[1], emb.shape[2]
  flat = tf.reshape(emb, [-1, fields * dim])
  init = tf.compat.v1.glorot_uniform_initializer(seed=seed)
  x = tf.concat([flat, dense], 1)
  linear = tf.compat.v1.layers.dense(x, 1, kernel_initializer=init, name="linear")[:, 0]
  # FM second order: 0.5 * sum_k ((sum_f e_fk)^2 - sum_f e_fk^2).
  summed = tf.reduce_sum(emb, 1)
  fm = 0.5 * tf.reduce_sum(tf.square(summed) - tf.reduce_sum(tf.square(emb), 1), 1)
  h = x
  for i, units in enumerate(hidden_units):
    h = tf.compat.v1.layers.dense(h, units, tf.nn.relu, kernel_initializer=init, name=f"mlp_{i}")
  deep = tf.compat.v1.layers.dense(h, 1, kernel_initializer=init, name="mlp_out")[:, 0]
  b = tf.compat.v1.get_variable("bias", [], tf.float32, tf.constant_initializer(bias))
  return linear + fm + deep + b


class Model:
  """The graph and session of one backend: `embed(ids [B, F])` builds its lookup, rows
  [B, F, dim]; `wrap(optimizer)` its optimizer; `after_day`, `size`, `memory` (optional) build
  the ops run after each day's training (tf_ext's evict()), its row count and its bytes."""

  def __init__(self, tf, args, embed, wrap, after_day=None, size=None, memory=None):
    bias = float(np.log(args.click_rate / (1.0 - args.click_rate)))
    self.tf, self.args = tf, args
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.compat.v1.set_random_seed(args.seed)
      self.ids = tf.compat.v1.placeholder(tf.int64, [None, _criteo_like.NUM_FIELDS], "ids")
      self.dense = tf.compat.v1.placeholder(tf.float32, [None, _criteo_like.NUM_DENSE], "dense")
      self.label = tf.compat.v1.placeholder(tf.float32, [None], "label")
      emb = embed(self.ids)
      logit = deepfm_logit(tf, emb, self.dense, args.hidden_units, args.seed, bias)
      self.prob = tf.sigmoid(logit)
      # Summed over the batch: Adagrad (initial accumulator 0.1) then steps an id's row by
      # about its own gradient's size, not 1/batch of it, so ids are learned within a day.
      self.loss = tf.reduce_sum(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=self.label, logits=logit)
      )
      self.global_step = tf.compat.v1.train.get_or_create_global_step()
      opt = wrap(tf.compat.v1.train.AdagradOptimizer(args.learning_rate))
      self.train_op = opt.minimize(self.loss, global_step=self.global_step)
      self.after_day = after_day() if after_day else None
      self.size = size() if size else None
      self.memory = memory() if memory else None
      init = [tf.compat.v1.global_variables_initializer()]
      init.append(tf.compat.v1.tables_initializer())
      threads = args.intra_op_threads
      config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads)
      self.sess = tf.compat.v1.Session(graph=self.graph, config=config)
      self.sess.run(init)
    self.graph.finalize()

  def train_day(self, day):
    """One pass over `day`; returns the seconds spent in the training steps."""
    return self.train_steps(day, 0, -(-len(day) // self.args.batch_size))

  def train_steps(self, day, first, steps):
    """`steps` training steps on `day`'s batches from sample `first`; returns their seconds."""
    b = self.args.batch_size
    seconds = 0.0
    for start in range(first, first + steps * b, b):
      feed = {
        self.ids: day.ids[start : start + b],
        self.dense: day.dense[start : start + b],
        self.label: day.label[start : start + b],
      }
      t = time.perf_counter()
      self.sess.run(self.train_op, feed)
      seconds += time.perf_counter() - t
    return seconds

  def predict(self, day):
    b = self.args.eval_batch_size
    out = [
      self.sess.run(self.prob, {self.ids: day.ids[s : s + b], self.dense: day.dense[s : s + b]})
      for s in range(0, len(day), b)
    ]
    return np.concatenate(out)

  def close(self):
    self.sess.close()


def lookup_unique(tf, lookup, ids, dim):
  """`lookup` of each distinct id of ids [B, F] once, spread back to [B, F, dim]."""
  unique, positions = tf.unique(tf.reshape(ids, [-1]))
  return tf.reshape(tf.gather(lookup(unique), positions), [-1, ids.shape[1], dim])


INITIAL_STDDEV = 0.01


def initial_rows(tf, args):
  """The initializer of every backend's rows (--initializer), as a Keras initializer (tf_ext
  takes it, and TF1 variables and TFRA call it alike)."""
  if args.initializer == "uniform":
    limit = INITIAL_STDDEV * 3**0.5  # the same standard deviation
    return tf.keras.initializers.RandomUniform(-limit, limit, seed=args.seed)
  if args.initializer == "truncated_normal":
    return tf.keras.initializers.TruncatedNormal(stddev=INITIAL_STDDEV, seed=args.seed)
  return tf.keras.initializers.RandomNormal(stddev=INITIAL_STDDEV, seed=args.seed)


def tf_ext_initial_rows(tf, tf_ext, args):
  """tf_ext's rows: initial_rows, in --initializer-version's generator."""
  if args.initializer_version == 1 or args.initializer == "uniform":
    return initial_rows(tf, args)
  return tf_ext.InitializerSpec(
    args.initializer, 0.0, INITIAL_STDDEV, args.seed, version=args.initializer_version
  )


def tf_ext_model(tf, tf_ext, args, steps_per_day, policies=True):
  """tf_ext's backend: with --min-count admission and --ttl-days eviction, or (not `policies`)
  with the table's defaults: neither, and its default initial rows."""
  holder = {}
  ttl = max(1, int(round(args.ttl_days * steps_per_day)))
  options = {}
  if policies:
    options["admission"] = tf_ext.FrequencyAdmission(
      min_count=args.min_count, sketch_bytes=args.sketch_mib << 20
    )
    options["eviction"] = tf_ext.EvictionPolicy(ttl_steps=ttl)

  def embed(ids):
    table = tf_ext.get_dynamic_embedding_variable(
      "emb",
      dim=args.dim,
      key_dtype=tf.int64,
      initializer=tf_ext_initial_rows(tf, tf_ext, args) if policies else None,
      **options,
    )
    holder["table"] = table
    return (
      lookup_unique(tf, table.lookup, ids, args.dim)
      if args.lookup == "unique"
      else table.lookup(ids)
    )

  model = Model(
    tf,
    args,
    embed,
    tf_ext.DynamicEmbeddingOptimizer,
    after_day=(lambda: holder["table"].evict()) if policies else None,
    size=lambda: holder["table"].size(),
    memory=lambda: holder["table"].memory_bytes(),
  )
  if not policies:
    model.policy = "no admission or eviction, default initial rows (the table's defaults)"
    return model
  model.policy = f"FrequencyAdmission(min_count={args.min_count}, sketch {args.sketch_mib} MiB), "
  model.policy += f"EvictionPolicy(ttl_steps={ttl}) + evict() after each day"
  return model


def hashed_model(tf, args, buckets):
  def embed(ids):
    table = tf.compat.v1.get_variable(
      "emb", [buckets, args.dim], tf.float32, initializer=initial_rows(tf, args)
    )

    def gather(x):
      return tf.nn.embedding_lookup(table, tf.math.floormod(x, buckets))

    return lookup_unique(tf, gather, ids, args.dim) if args.lookup == "unique" else gather(ids)

  model = Model(tf, args, embed, lambda opt: opt, size=lambda: tf.constant(buckets, tf.int64))
  model.policy = f"{buckets:,} buckets, id mod buckets"
  return model


def tfra_model(tf, de, args):
  holder = {}

  def embed(ids):
    var = de.get_variable(
      "emb",
      key_dtype=tf.int64,
      value_dtype=tf.float32,
      dim=args.dim,
      initializer=initial_rows(tf, args),
    )
    holder["var"] = var
    flat = tf.reshape(ids, [-1])
    if args.lookup == "unique":
      rows = de.embedding_lookup_unique(var, flat, name="emb_lookup")
    else:
      rows = de.embedding_lookup(var, flat, name="emb_lookup")
    return tf.reshape(rows, [-1, _criteo_like.NUM_FIELDS, args.dim])

  model = Model(tf, args, embed, de.DynamicEmbeddingOptimizer, size=lambda: holder["var"].size())
  how = "embedding_lookup_unique" if args.lookup == "unique" else "embedding_lookup"
  model.policy = f"no admission or eviction (TrainableWrapper path, de.{how})"
  return model

#!/usr/bin/env python3
"""A canned Estimator over dynamic embedding columns: train_and_evaluate, export, serve.

A DNNClassifier reads two id features through tf_ext.feature_column: a user id (int64, any
value: 12-digit ids here) and a city (string), both with collision-free dynamic vocabularies.
Its own optimizer argument is wrapped in tf_ext.DynamicEmbeddingOptimizer, so the tables train
with the dense layers. The click label depends on the user, so only trained user rows predict it.
The script trains with tf.estimator.train_and_evaluate, evaluates, exports a SavedModel with
export_saved_model (the tables stream into files beside its variables) and, for stock TensorFlow
Serving, with tf_ext.saved_model.export_estimator_for_serving (core TensorFlow ops only). It serves
each in a fresh process, the second one where importing tf_ext fails, and checks the served
probabilities against Estimator.predict.

  python examples/estimator_columns.py            # 20,000 users, 2,000 steps
  python examples/estimator_columns.py --quick    # 500 users, 200 steps
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(REPO, "tf_ext", "__init__.py")) and REPO not in sys.path:
  sys.path.insert(0, REPO)  # run from a checkout without PYTHONPATH

import tf_ext  # noqa: E402

# TensorFlow 2.15 marks every Estimator API deprecated and warns so at each call: keep its Python
# log to errors so that the example's own lines are what shows.
tf.get_logger().setLevel("ERROR")

CITIES = np.array([b"paris", b"oslo", b"lima", b"pune", b"kyiv"])


def click_log(rng, users, rows):
  """Rows of (user id, city) and a click label: each user clicks with its own probability."""
  user_ids = rng.integers(10**11, 10**12, users)
  click_rate = rng.beta(0.5, 0.5, users)
  picked = rng.integers(0, users, rows)
  features = {"user": user_ids[picked, None], "city": rng.choice(CITIES, (rows, 1))}
  labels = (rng.random(rows) < click_rate[picked]).astype(np.int64)
  return features, labels


def folder_size(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def serve_in_fresh_process(export, sample, with_tf_ext, out_file):
  """Runs the export's "predict" signature on `sample` in a new Python process, loaded as TF
  Serving loads it (TF1 loader). Without tf_ext, importing it fails there (checked), so no tf_ext
  op can be registered."""
  prologue = (
    "import tf_ext  # registers the table ops the SavedModel uses"
    if with_tf_ext
    else "import sys; sys.modules['tf_ext'] = None  # `import tf_ext` now fails"
  )
  code = f"""
    {prologue}
    import numpy as np, tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    try:
      import tf_ext
    except ImportError:
      assert op_def_registry.get("TfExtTableFind") is None
    tf.get_logger().setLevel("ERROR")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], {export!r})
      signature = meta.signature_def["predict"]
      feed = {{signature.inputs["user"].name: {sample["user"].tolist()},
              signature.inputs["city"].name: {[[c[0].decode()] for c in sample["city"]]}}}
      np.save({out_file!r}, sess.run(signature.outputs["probabilities"].name, feed)[:, 1])
  """
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, env=env)
  return np.load(out_file)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
  parser.add_argument("--model-dir", help="default: a temporary folder")
  args = parser.parse_args(argv)
  users, steps = (500, 200) if args.quick else (20_000, 2_000)
  rng = np.random.default_rng(0)
  train_x, train_y = click_log(rng, users, steps * 64)
  eval_x, eval_y = click_log(np.random.default_rng(0), users, 20 * 256)  # the same users

  user = tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("user", tf.int64)
  city = tf_ext.feature_column.categorical_column_with_dynamic_vocabulary("city", tf.string)
  columns = [
    tf_ext.feature_column.dynamic_embedding_column(user, 8),
    tf_ext.feature_column.dynamic_embedding_column(city, 4),
  ]
  model_dir = args.model_dir or tempfile.mkdtemp(prefix="tf_ext_estimator_")
  estimator = tf.compat.v1.estimator.DNNClassifier(
    hidden_units=[16],
    feature_columns=columns,
    model_dir=model_dir,
    optimizer=tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.2)),
  )

  def train_input():
    return tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(10_000, seed=0).batch(64)

  def eval_input():
    return tf.data.Dataset.from_tensor_slices((eval_x, eval_y)).batch(256)

  tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(train_input, max_steps=steps),
    tf.estimator.EvalSpec(eval_input, steps=None, throttle_secs=0),
  )
  metrics = estimator.evaluate(eval_input)
  print(
    f"trained {metrics['global_step']} steps: eval AUC {metrics['auc']:.4f}, "
    f"log loss {metrics['average_loss']:.4f}"
  )

  def serving_input():
    receivers = {
      "user": tf.compat.v1.placeholder(tf.int64, [None, 1], name="user"),
      "city": tf.compat.v1.placeholder(tf.string, [None, 1], name="city"),
    }
    return tf.estimator.export.ServingInputReceiver(receivers, receivers)

  export = estimator.export_saved_model(os.path.join(model_dir, "export"), serving_input).decode()
  files = sorted(os.listdir(os.path.join(export, "variables")))
  print(f"exported {export}: variables/ holds {', '.join(files)}")
  # For stock TensorFlow Serving: the same graph with core lookup tables (rows only).
  core_export = tf_ext.saved_model.export_estimator_for_serving(
    estimator, os.path.join(model_dir, "export_serving"), serving_input
  ).decode()
  print(
    f"sizes: {folder_size(export) / 1e6:.2f} MB full fidelity (export_saved_model: rows, "
    f"optimizer slots, counts; loads with tf_ext), {folder_size(core_export) / 1e6:.2f} MB for "
    "serving (export_estimator_for_serving: rows only, core TensorFlow ops)"
  )

  sample = {k: v[:8] for k, v in eval_x.items()}
  expected = np.array(
    [p["probabilities"][1] for p in estimator.predict(lambda: tf.data.Dataset.from_tensors(sample))]
  )
  diffs = []
  for path, with_tf_ext in ((export, True), (core_export, False)):
    served = serve_in_fresh_process(path, sample, with_tf_ext, os.path.join(model_dir, "out.npy"))
    diffs.append(float(np.max(np.abs(served - expected))))
    print(
      f"served {'with' if with_tf_ext else 'WITHOUT'} tf_ext in a fresh process: max |probability "
      f"difference| to Estimator.predict = {diffs[-1]:.2e}"
    )
  if not args.model_dir:
    shutil.rmtree(model_dir, ignore_errors=True)
    print(f"removed {model_dir} (--model-dir DIR keeps the model and its export)")
  ok = max(diffs) < 1e-5 and metrics["auc"] > 0.6
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())

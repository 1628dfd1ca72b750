"""One task of the parameter-server cluster of test_ps_cluster.py; TF_CONFIG names the task.

  _ps_task.py ps                                     a tf.distribute.Server: prints READY, serves
  _ps_task.py train <model_dir> <out.json> <wait_s>    chief or worker: MonitoredTrainingSession
  _ps_task.py restore <model_dir> <out.json> <wait_s>  chief: restores the checkpoint, trains on

The worker trains WORKER_STEPS steps. The chief trains with it to global step WORKER_STEPS, waits
for it to leave (so that nothing changes the tables after its checkpoint), trains alone to
CHIEF_STEPS, saves, and reports the lookups of PROBE, each shard's size and device.
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import tf_ext

DIM = 8
IDS = 1000
PROBE = np.arange(0, IDS, 7, dtype=np.int64)
WORKER_STEPS = 20
CHIEF_STEPS = 30
MORE_STEPS = 5


def _model(job, index, cluster):
  setter = tf.compat.v1.train.replica_device_setter(
    cluster=cluster, worker_device=f"/job:{job}/task:{index}"
  )
  with tf.compat.v1.device(setter):
    step = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.random.uniform([64, 3], 0, IDS, tf.int64)
    table = tf_ext.get_dynamic_embedding_variable(
      "emb", DIM, num_shards=2, initializer="truncated_normal"
    )
    logits = tf.compat.v1.layers.dense(tf.reduce_mean(table.lookup(ids), 1), 1)[:, 0]
    labels = tf.cast(tf.reduce_sum(ids, 1) % 2, tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
    opt = tf_ext.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
    train = opt.minimize(loss, global_step=step)
  return {
    "step": step,
    "train": train,
    "loss": loss,
    "probe": table.lookup(tf.constant(PROBE)),
    "sizes": [shard.size() for shard in table.shards],
    "table": table,
  }


def _report(sess, model):
  step, probe, sizes = sess.run([model["step"], model["probe"], model["sizes"]])
  return {"step": int(step), "probe": probe.tolist(), "sizes": [int(s) for s in sizes]}


def main():
  config = json.loads(os.environ["TF_CONFIG"])
  job, index = config["task"]["type"], config["task"]["index"]
  cluster = tf.train.ClusterSpec(config["cluster"])
  if sys.argv[1] == "ps":
    server = tf.distribute.Server(cluster, job_name=job, task_index=index)
    print("READY", flush=True)
    server.join()
    return
  mode, model_dir, out, wait_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
  # A clear error instead of a session that waits forever for a PS that is not there.
  tf_ext.wait_for_cluster(cluster, timeout_s=wait_s)
  server = tf.distribute.Server(cluster, job_name=job, task_index=index)
  session_config = tf.compat.v1.ConfigProto(
    device_filters=["/job:ps", f"/job:{job}/task:{index}"], operation_timeout_in_ms=120_000
  )
  is_chief = job == "chief"
  report = {}
  with tf.Graph().as_default():
    model = _model(job, index, cluster)
    report["devices"] = model["table"].devices
    if mode == "restore":
      # Before the restore: the restarted PS lost its shard, the other kept its rows.
      with tf.compat.v1.Session(server.target, config=session_config) as sess:
        report["sizes_before_restore"] = [int(s) for s in sess.run(model["sizes"])]
    last = {"train": WORKER_STEPS if not is_chief else CHIEF_STEPS}.get(mode)
    with tf.compat.v1.train.MonitoredTrainingSession(
      master=server.target,
      is_chief=is_chief,
      checkpoint_dir=model_dir,
      save_checkpoint_secs=None,
      save_checkpoint_steps=1000 if mode == "train" else None,  # once, at the end
      save_summaries_steps=None,
      save_summaries_secs=None,
      log_step_count_steps=None,
      config=session_config,
      stop_grace_period_secs=5,
    ) as sess:
      if mode == "restore":
        report["restored"] = _report(sess, model)
        losses = [sess.run([model["train"], model["loss"]])[1] for _ in range(MORE_STEPS)]
        report["losses"] = [float(x) for x in losses]
        report["after"] = _report(sess, model)
      else:
        worker_done = os.path.join(model_dir, "worker_done")
        deadline = time.monotonic() + 120
        while (sess.run(model["step"]) if is_chief else report.get("own_steps", 0)) < last:
          if is_chief and sess.run(model["step"]) >= WORKER_STEPS:
            while not os.path.exists(worker_done):  # let the worker leave first
              if time.monotonic() > deadline:
                raise TimeoutError("the worker did not finish within 120 s")
              time.sleep(0.1)
          sess.run(model["train"])
          report["own_steps"] = report.get("own_steps", 0) + 1
    if mode == "train" and is_chief:
      # After MonitoredTrainingSession saved the final checkpoint: the values it holds.
      with tf.compat.v1.Session(server.target, config=session_config) as sess:
        report["saved"] = _report(sess, model)
        report["checkpoint"] = tf.train.latest_checkpoint(model_dir)
    if mode == "train" and not is_chief:
      open(os.path.join(model_dir, "worker_done"), "w").close()
  with open(out, "w") as f:
    json.dump(report, f)


if __name__ == "__main__":
  main()

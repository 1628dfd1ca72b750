"""The TensorFlow kernels of GPU tables, run without a GPU: with TF_EXT_GPU_TABLES=host (emulate's
older name, which the cases use as a user of it would) every int64
table is the GPU table core (kernels/dynamic_embedding/core/gpu/) on host threads, served by the
same kernels and the same code paths as a table in GPU memory (the placement checks, the GPU
backend, full and delta saves from the core, restores into a new core swapped in). Only the CUDA
stream and the device memory differ; the core itself is tested on a GPU by
tests/kernels/dynamic_embedding/device_table_test.cc.

Each case runs the same script in a process with GPU tables on the host and in one with CPU tables,
and requires the same rows, sizes and checkpoint links, bit for bit, and checkpoints that move
between the two.
"""

import json
import shutil

import numpy as np
import pytest
from _subprocess import run_python

HOST_CORE = {"TF_EXT_GPU_TABLES": "host"}

# Trains a table with Adam, inserts, evicts and removes ids, saves a full-and-delta chain at each
# step, and records the rows of every id it touched (and some it never did) and the size.
TRAIN_AND_SAVE = """
import json, os, sys
import numpy as np, tensorflow as tf, tf_ext

out = sys.argv[1]
table = tf_ext.DynamicEmbeddingVariable(
  "users", 4, initializer="normal", eviction=tf_ext.EvictionPolicy(ttl_steps=3)
)
opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
manager = tf_ext.DeltaCheckpointManager(os.path.join(out, "chain"), [table], full_every_n_deltas=3)
rng = np.random.default_rng(0)
probe = np.arange(-5, 260, dtype=np.int64)
record, links = {}, []
for step in range(1, 9):
  ids = rng.integers(0, 200, 64)  # with duplicates
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(table.lookup(ids) - 0.1 * step))
  grads = tape.gradient(loss, [table.gradient_anchor])
  opt.apply_gradients(zip(grads, [table.gradient_anchor]))
  table.insert(rng.integers(200, 250, 5), rng.normal(size=(5, 4)).astype(np.float32))
  if step % 3 == 0:
    table.evict(step)  # rows idle for 3 steps go; some come back at the next step
  if step == 5:
    table.remove(np.arange(0, 250, 7))
  link = manager.save(step)
  links.append([link["kind"], link["rows"], link["tombstones"]])
  record[f"rows{step}"] = table.lookup(probe).numpy()
  record[f"size{step}"] = np.array(int(table.size()))
np.savez(os.path.join(out, "record.npz"), **record)
try:  # an op without a GPU kernel refuses the table as it would a table in GPU memory
  table.export_with_slots()
  refusal = "none"
except tf.errors.InvalidArgumentError as error:
  refusal = error.message
print(json.dumps({"links": links, "refusal": refusal}))
"""

# Restores each link of the chain in argv[1] and compares its rows and size with argv[2]'s record;
# then restores the last link, trains one more step, saves, and records that step.
RESTORE_AND_CONTINUE = """
import json, os, sys
import numpy as np, tensorflow as tf, tf_ext

chain, record = sys.argv[1], np.load(sys.argv[2])
table = tf_ext.DynamicEmbeddingVariable("users", 4, initializer="normal")
table.insert([999], [[5.0] * 4])  # replaced by every restore
# The chain's last link is its third delta: allow a fourth.
manager = tf_ext.DeltaCheckpointManager(chain, [table], full_every_n_deltas=4)
probe = np.arange(-5, 260, dtype=np.int64)
for step in range(1, 9):
  assert manager.restore(step=step) == step
  np.testing.assert_array_equal(table.lookup(probe).numpy(), record[f"rows{step}"])
  assert int(table.size()) == int(record[f"size{step}"]), step
assert manager.restore() == 8
opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.05))
with tf.GradientTape() as tape:
  loss = tf.reduce_sum(tf.square(table.lookup(np.arange(190, 230))))
grads = tape.gradient(loss, [table.gradient_anchor])
opt.apply_gradients(zip(grads, [table.gradient_anchor]))
table.remove([1, 2, 3])
link = manager.save(9)
np.save(os.path.join(chain, "rows9.npy"), table.lookup(probe).numpy())
print(json.dumps([link["kind"], link["rows"], link["tombstones"], int(table.size())]))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """TRAIN_AND_SAVE's folder and printed result, with GPU-core tables ("gpu") and CPU tables
  ("cpu"); the cases read them and copy what they change."""
  runs = {}
  for name, env in (("gpu", HOST_CORE), ("cpu", None)):
    out = tmp_path_factory.mktemp(name)
    proc = run_python(TRAIN_AND_SAVE, args=[str(out)], env=env)
    runs[name] = out, json.loads(proc.stdout.strip().splitlines()[-1])
  return runs


def test_gpu_table_kernels_train_and_save_delta_chains_as_the_cpu_table_does(trained):
  (gpu_out, gpu), (cpu_out, cpu) = trained["gpu"], trained["cpu"]
  assert "has no GPU kernel yet" in gpu["refusal"] and "TfExtTableExport" in gpu["refusal"]
  assert cpu["refusal"] == "none"
  kinds = [link[0] for link in gpu["links"]]
  assert kinds == ["full", "delta", "delta", "delta", "full", "delta", "delta", "delta"]
  assert any(link[2] > 0 for link in gpu["links"]), "no delta held a removed id"
  # The same links, rows for rows and removed ids for removed ids, and the same table at each step.
  assert gpu["links"] == cpu["links"]
  gpu_record, cpu_record = np.load(gpu_out / "record.npz"), np.load(cpu_out / "record.npz")
  for key in cpu_record.files:
    np.testing.assert_array_equal(gpu_record[key], cpu_record[key], err_msg=key)


def test_delta_chains_move_between_gpu_and_cpu_tables_and_continue_after_a_restore(
  trained, tmp_path
):
  continued = {}
  for chain_of, into, env in (
    ("gpu", "cpu", None),
    ("cpu", "gpu", HOST_CORE),
    ("gpu", "gpu", HOST_CORE),
  ):
    out = trained[chain_of][0]
    chain = tmp_path / f"{chain_of}_into_{into}"
    shutil.copytree(out / "chain", chain)
    proc = run_python(RESTORE_AND_CONTINUE, args=[str(chain), str(out / "record.npz")], env=env)
    link = json.loads(proc.stdout.strip().splitlines()[-1])
    # A restored table continues its chain: the next save is a delta of the 40 rows trained since.
    assert link[:2] == ["delta", 40], (chain.name, link)
    continued[chain.name] = (link, np.load(chain / "rows9.npy"))
  link, rows = continued["gpu_into_gpu"]
  for name, (other_link, other_rows) in continued.items():
    assert other_link == link, name
    np.testing.assert_array_equal(other_rows, rows, err_msg=name)


# Trains a table of 3 shards, checkpoints it, restores the checkpoint into tables of 2 shards and
# of one (each shard keeps its own ids of every file, the files merge) and prints the rows of all.
RESHARD = """
import json, os, sys
import numpy as np, tensorflow as tf, tf_ext

init = tf.keras.initializers.RandomNormal(seed=3)
table = tf_ext.get_dynamic_embedding_variable("items", 4, num_shards=3, initializer=init)
opt = tf_ext.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adagrad(0.1))
rng = np.random.default_rng(0)
for _ in range(3):
  ids = rng.integers(0, 200, 64)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(table.lookup(ids) - 0.5))
  opt.apply_gradients(zip(tape.gradient(loss, table.gradient_anchors), table.gradient_anchors))
path = tf.train.Checkpoint(table=table).write(os.path.join(sys.argv[1], "ckpt"))
probe = np.arange(-5, 210, dtype=np.int64)
rows = {"saved": table.lookup(probe).numpy().tolist(), "size": int(table.size())}
for shards in (2, 1):
  other = tf_ext.get_dynamic_embedding_variable(
    f"items{shards}", 4, num_shards=shards if shards > 1 else None, initializer=init
  )
  tf.train.Checkpoint(table=other).read(path)
  rows[shards] = other.lookup(probe).numpy().tolist()
  rows[f"size{shards}"] = int(other.size())
print(json.dumps(rows))
"""


def test_gpu_tables_restore_a_checkpoint_into_another_number_of_shards_as_cpu_tables_do(tmp_path):
  results = {}
  for name, env in (
    ("gpu", HOST_CORE),
    ("emulate", {"TF_EXT_GPU_TABLES": "emulate"}),
    ("cpu", None),
  ):
    out = tmp_path / name
    out.mkdir()
    proc = run_python(RESHARD, args=[str(out)], env=env)
    results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
  for name, rows in results.items():
    assert rows["size2"] == rows["size1"] == rows["size"] > 0, name
    np.testing.assert_array_equal(rows["2"], rows["saved"], err_msg=name)
    np.testing.assert_array_equal(rows["1"], rows["saved"], err_msg=name)
    np.testing.assert_array_equal(rows["saved"], results["cpu"]["saved"], err_msg=name)


def test_a_bad_gpu_tables_setting_is_a_clear_error():
  proc = run_python(
    """
    import tf_ext
    tf_ext.DynamicEmbeddingVariable("t", 4)
    """,
    check=False,
    env={"TF_EXT_GPU_TABLES": "yes"},
  )
  assert proc.returncode != 0
  assert (
    "TF_EXT_GPU_TABLES='yes' is invalid: expected 0, 1 or emulate (or host, its older name)"
    in proc.stderr
  )


# A TF1 graph whose ops on one table run at once on 4 inter-op threads: lookups of rows inserted
# earlier, beside inserts of new ids that grow the table (each growth moves every row) and
# removals. Each lookup must read the rows as inserted.
CONCURRENT_OPS = """
import numpy as np, tensorflow as tf, tf_ext

tf1 = tf.compat.v1
tf1.disable_eager_execution()
table = tf_ext.DynamicEmbeddingVariable("shared", 8)
old = [tf1.placeholder(tf.int64, [None]) for _ in range(3)]
new, gone = tf1.placeholder(tf.int64, [None]), tf1.placeholder(tf.int64, [None])
new_rows = tf1.placeholder(tf.float32, [None, 8])
lookups = [table.lookup(ids) for ids in old]
writes = [table.insert(new, new_rows), table.remove(gone)]
config = tf1.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=1)
rng = np.random.default_rng(1)
with tf1.Session(config=config) as sess:
  sess.run(tf1.global_variables_initializer())
  present = np.arange(500)
  sess.run(writes[0], {new: present, new_rows: np.repeat(present[:, None], 8, 1)})
  for round in range(1, 120):
    fresh, doomed = np.arange(500 * round, 500 * (round + 1)), rng.choice(present, 20, False)
    kept = np.setdiff1d(present, doomed)
    feed = {ids: rng.choice(kept, 300) for ids in old}
    feed.update({new: fresh, new_rows: np.repeat(fresh[:, None], 8, 1), gone: doomed})
    *read, _, _ = sess.run(lookups + writes, feed)
    for ids, rows in zip(old, read):
      np.testing.assert_array_equal(rows, np.repeat(feed[ids][:, None], 8, 1).astype(np.float32))
    present = np.concatenate([kept, fresh])
  print(int(sess.run(table.size())), len(present))
"""


def test_ops_of_one_gpu_table_running_at_once_each_see_the_table_whole():
  proc = run_python(CONCURRENT_OPS, env=HOST_CORE)
  size, expected = proc.stdout.split()[-2:]
  assert size == expected

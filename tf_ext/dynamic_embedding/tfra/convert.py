"""Converts a TFRA checkpoint into a native tf_ext checkpoint; needs no TFRA.

  python -m tf_ext.tfra.convert SRC DST [--format auto|saver|object] [--update-count N]

SRC is what `tf_ext.tfra.checkpoints.restore_from_tfra` reads (a checkpoint prefix or directory, a
SavedModel, FileSystemSaver files). DST, a directory that must not exist (or --overwrite), gets a
checkpoint that a program of tf_ext.tfra Variables of the same names restores with its usual
saver, and a `checkpoint` file (tf.train.latest_checkpoint(DST) finds it):

- saver (from a tf.compat.v1.train.Saver checkpoint or FileSystemSaver files): what
  tf.compat.v1.train.Saver writes for tf_ext tables, each `<table>-slot_initial_values` in the
  index and its rows and slots in a snapshot file beside it; the checkpoint's other tensors
  (dense variables, global_step, beta powers) are copied as they are.
- object (from tf.train.Checkpoint, Keras save_weights or a SavedModel): the checkpoint's object
  graph with each TFRA Variable's `tables_of_<name>` list as tf_ext's `tables` (tables saved by
  tf_ext's registered saver), the slot Variables left out of the optimizer (tf_ext keeps slots
  in the table), and TFRA's shadow state dropped: a ShadowVariable's value (0 rows) becomes
  tf_ext's scalar, its ids and exists are left out, and the optimizer's slot variables of shadows
  (0 rows) leave its variable list, whose others are renumbered as a tf_ext program numbers them.
  Dense variables keep their values.

Tables are streamed a chunk of rows at a time into tf_ext's snapshot files (memory for a chunk);
dense tensors are copied whole. Everything is written into a temporary directory beside DST that
is renamed to DST at the end: on any failure nothing is left. A file that cannot be read (not a
checkpoint, truncated, corrupt) is a one-line error naming it, exit status 2.

Rows and slots are kept exactly; every row's update count is the TFRA optimizer's step count (see
checkpoints.py: the next Adam step is then TFRA's), its last step that count - 1.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tf_ext.dynamic_embedding import checkpoint as table_checkpoint
from tf_ext.dynamic_embedding.tfra import checkpoints

try:  # a progress bar where tqdm is installed; else a plain one
  import tqdm
except ImportError:  # pragma: no cover
  tqdm = None

__all__ = ["convert", "main"]

# checkpoint.py's name of a table's row count in a tf.train.Checkpoint index (informational).
ROWS_TENSOR = ".TF_EXT_TABLE_ROWS"
REGISTERED_SAVER = f"{table_checkpoint.SAVER_PACKAGE}.{table_checkpoint.SAVER_NAME}"
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
VARIABLE_VALUE = "VARIABLE_VALUE"
REPORT = "tfra_conversion.json"


class _Progress:
  """Rows done of the total, on stderr: tqdm's bar, or a line rewritten in place."""

  def __init__(self, total, enabled):
    self.total, self.done, self.enabled = total, 0, enabled
    self._bar = None
    if enabled and tqdm is not None:
      self._bar = tqdm.tqdm(total=total, unit="rows", file=sys.stderr, desc="tf_ext.tfra.convert")

  def __call__(self, rows):
    self.done += rows
    if self._bar is not None:
      self._bar.update(rows)
    elif self.enabled:
      percent = 100.0 * self.done / self.total if self.total else 100.0
      sys.stderr.write(f"\rtf_ext.tfra.convert: {self.done}/{self.total} rows ({percent:.0f}%)")
      sys.stderr.flush()

  def close(self):
    if self._bar is not None:
      self._bar.close()
    elif self.enabled:
      sys.stderr.write("\n")


def _escape(local_name):
  """A local name as TensorFlow writes it in checkpoint keys."""
  return local_name.replace(".", "..").replace("/", ".S")


def _save_tensors(prefix, tensors):
  """Writes {name: (dtype, numpy value)} as a tensor bundle at `prefix` (SaveV2 in a graph of its
  own, so that it runs eagerly or not)."""
  names = sorted(tensors)
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    values = [tf.constant(tensors[n][1], dtype=tensors[n][0]) for n in names]
    session.run(
      tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=values
      )
    )


def _shard_group(group, index):
  return checkpoints.TableGroup(
    group.name,
    group.exact,
    group.path,
    [group.shards[index]],
    group.dim,
    group.key_dtype,
    group.value_dtype,
    group.source,
  )


def _write_tables(
  ck, group, naming, update_count, initializer_version, chunk_rows, progress, exclude
):
  """Streams a TFRA Variable and its slots into one snapshot file per TFRA shard; naming(i) gives
  (snapshot path, table name). Returns ([(path, table name, rows)] per shard, the slots'
  initial values, a summary for the report)."""
  kind, slots, initial = checkpoints.optimizer_slots(ck, group.name, None, exclude)
  stored_dim, encode = checkpoints.row_encoder(group.value_dtype, group.dim)
  if stored_dim != group.dim:  # rows held as bits are never trained in tf_ext: no slots
    kind, slots, initial = "sgd", [], []
  key_dtype = tf.string if group.key_dtype == tf.string else tf.int64
  written, totals = [], {"rows": 0, "missing_slot_rows": 0, "dropped_slot_rows": 0}
  for index in range(len(group.shards)):
    path, table_name = naming(index)
    shard_slots = [
      _shard_group(s, index) if s is not None and len(s.shards) == len(group.shards) else s
      for s in slots
    ]
    writer = checkpoints.SnapshotWriter(
      path, table_name, key_dtype, stored_dim, initial, update_count, initializer_version
    )
    try:
      stats = checkpoints.write_snapshots(
        ck,
        _shard_group(group, index),
        shard_slots,
        initial,
        [writer],
        lambda keys: np.zeros(len(keys), np.int32),
        update_count,
        chunk_rows,
        progress,
        encode,
      )
      writer.finish()
    finally:
      writer.close()
    for key in totals:
      totals[key] += stats[key]
    written.append((path, table_name, stats["rows"]))
  summary = {
    "shards": len(group.shards),
    "dim": group.dim,
    "optimizer_kind": kind,
    "slots": [s.name if s is not None else None for s in slots],
    "slot_initial_values": initial,
    **totals,
  }
  return written, initial, summary


def _dense(ck, name):
  """A dense tensor, whole (complex and other rare dtypes through TensorFlow's reader)."""
  if ck.bundle.readable(name):
    return ck.bundle.dtype(name), ck.bundle.read(name)
  return ck.bundle.dtype(name), tf.train.load_checkpoint(ck.prefix).get_tensor(name)


# ---- the object graph, TFRA's made tf_ext's ------------------------------------------------------


def _object_graph(ck):
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(ck.bundle.read(OBJECT_GRAPH).item())
  return graph


def _value_shape(ck, node):
  for attribute in node.attributes:
    if attribute.name == VARIABLE_VALUE and attribute.checkpoint_key in ck.bundle.entries:
      return ck.bundle.shape(attribute.checkpoint_key)
  return None


def _rewrite(ck, graph, variables, slot_groups):
  """Rewrites `graph` (TFRA's) in place; returns ({table node id: (group, shard index)}, {key:
  replacement tensor}, {keys dropped})."""
  nodes = graph.nodes
  names = {g.name: g for g in variables}
  slot_names = {g.name for g in slot_groups}
  tables, replaced, dropped = {}, {}, set()
  shadows = set()
  for node in nodes:
    for child in node.children:
      if not child.local_name.startswith("tables_of_"):
        continue
      name = _local(child.local_name[len("tables_of_") :], names, slot_names)
      listing = nodes[child.node_id]
      shard_nodes = {
        int(c.local_name): c.node_id for c in listing.children if c.local_name.isdigit()
      }
      if name in names:
        child.local_name = "tables"
        for index, node_id in shard_nodes.items():
          tables[node_id] = (names[name], index)
      elif name in slot_names:
        for node_id in shard_nodes.values():
          dropped.update(a.checkpoint_key for a in nodes[node_id].attributes)
          del nodes[node_id].attributes[:]
  # TFRA's Variables save through a registered saver of TFRA's; tf_ext's are plain trackables.
  for node in nodes:
    if node.registered_saver.name.startswith("DECustomSaver"):
      node.ClearField("registered_saver")
  # The slot Variables leave their parent (the optimizer).
  for node in nodes:
    keep = [c for c in node.children if _local(c.local_name, names, slot_names) not in slot_names]
    if len(keep) != len(node.children):
      del node.children[:]
      node.children.extend(keep)
  # TFRA's shadow state: values of 0 rows.
  for node_id, node in enumerate(nodes):
    shape = _value_shape(ck, node)
    if shape and shape[0] == 0:
      shadows.add(node_id)
  for node in nodes:
    listed = [c for c in node.children if c.local_name.isdigit()]
    if listed and len(listed) == len(node.children):
      keep = [c for c in listed if c.node_id not in shadows]
      if len(keep) != len(listed):
        for child in listed:
          if child.node_id in shadows:
            dropped.update(a.checkpoint_key for a in nodes[child.node_id].attributes)
        del node.children[:]
        for number, child in enumerate(keep):
          child.local_name = str(number)
          node.children.append(child)
        continue
    kept = [
      c
      for c in node.children
      if not (c.node_id in shadows and c.local_name.endswith(("-ids", "-exists")))
    ]
    if len(kept) != len(node.children):
      for child in node.children:
        if child not in kept:
          dropped.update(a.checkpoint_key for a in nodes[child.node_id].attributes)
      del node.children[:]
      node.children.extend(kept)
    kept_slots = [s for s in node.slot_variables if s.original_variable_node_id not in shadows]
    if len(kept_slots) != len(node.slot_variables):
      del node.slot_variables[:]
      node.slot_variables.extend(kept_slots)
  for node_id in shadows:
    for attribute in nodes[node_id].attributes:
      shape = ck.bundle.shape(attribute.checkpoint_key)
      if len(shape) == 2 and attribute.checkpoint_key not in dropped:
        # tf_ext's ShadowVariable is a scalar, always 0.
        replaced[attribute.checkpoint_key] = (tf.float32, np.float32(0.0))
  return tables, replaced, dropped


def _prune(graph, tables):
  """Drops the nodes no longer reachable from the root (TFRA's slot Variables, shadow state),
  renumbering the others; returns `tables` by the new node ids."""
  reachable, queue = {0}, [0]
  while queue:
    for child in graph.nodes[queue.pop()].children:
      if child.node_id not in reachable:
        reachable.add(child.node_id)
        queue.append(child.node_id)
  kept = sorted(reachable)
  new_id = {old: new for new, old in enumerate(kept)}
  nodes = [graph.nodes[old] for old in kept]
  for node in nodes:
    for child in node.children:
      child.node_id = new_id[child.node_id]
    slots = [
      s
      for s in node.slot_variables
      if s.original_variable_node_id in new_id and s.slot_variable_node_id in new_id
    ]
    del node.slot_variables[:]
    for slot in slots:
      slot.original_variable_node_id = new_id[slot.original_variable_node_id]
      slot.slot_variable_node_id = new_id[slot.slot_variable_node_id]
      node.slot_variables.append(slot)
  pruned = trackable_object_graph_pb2.TrackableObjectGraph()
  pruned.nodes.extend(nodes)
  graph.CopyFrom(pruned)
  return {new_id[old]: where for old, where in tables.items() if old in new_id}


def _local(local_name, *known):
  """A Variable's name from a local name (raw in the object graph; escaped in older graphs)."""
  if any(local_name in names for names in known):
    return local_name
  return checkpoints.unescape_local_name(local_name)


def _paths(graph):
  """{node id: its checkpoint path from the root} along the first path to each node."""
  paths, queue = {0: ""}, [0]
  while queue:
    node_id = queue.pop(0)
    for child in graph.nodes[node_id].children:
      if child.node_id not in paths:
        prefix = paths[node_id]
        paths[child.node_id] = (prefix + "/" if prefix else "") + _escape(child.local_name)
        queue.append(child.node_id)
  return paths


# ---- convert ------------------------------------------------------------------------------------


def convert(
  src,
  dst,
  format="auto",  # noqa: A002 (the CLI's word)
  update_count=None,
  key_dtype=tf.int64,
  initializer_version=1,
  chunk_rows=checkpoints.CHUNK_ROWS,
  progress=True,
  overwrite=False,
):
  """Writes the tf_ext checkpoint of the TFRA checkpoint `src` into the new directory `dst`;
  returns its prefix. See the module's doc."""
  ck = checkpoints.TfraCheckpoint(src, key_dtype=key_dtype)
  if format == "auto":
    format = "object" if ck.kind == "object" else "saver"  # noqa: A001
  if format not in ("saver", "object"):
    raise ValueError(f"tf_ext.tfra.convert: format must be auto, saver or object, got {format!r}")
  if format == "object" and ck.kind != "object":
    raise ValueError(
      f"tf_ext.tfra.convert: '{src}' has no object graph ({ck.kind}): write --format saver"
    )
  dst = os.path.abspath(dst)
  if os.path.exists(dst) and not overwrite:
    raise FileExistsError(f"tf_ext.tfra.convert: '{dst}' exists (pass --overwrite to replace it)")
  variables = ck.variables()
  slot_groups = [g for g in ck.groups.values() if g not in variables]
  steps = checkpoints.step_count(ck) if update_count is None else int(update_count)
  parent = os.path.dirname(dst)
  os.makedirs(parent, exist_ok=True)
  work = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.converting-", dir=parent)
  bar = _Progress(sum(g.rows for g in variables), progress)
  try:
    name = os.path.basename(ck.prefix) if ck.bundle is not None else "ckpt"
    prefix = os.path.join(work, name)
    tensors, report = {}, {"source": os.path.abspath(src), "format": format, "variables": {}}
    graph = paths = tables = None
    if format == "object":
      graph = _object_graph(ck)
      tables, replaced, dropped = _rewrite(ck, graph, variables, slot_groups)
      tables = _prune(graph, tables)
      paths = _paths(graph)
      by_group = {(group.name, index): node_id for node_id, (group, index) in tables.items()}
      for tensor in ck.dense_tensors():
        if tensor not in dropped:
          tensors[tensor] = replaced.get(tensor) or _dense(ck, tensor)
    elif ck.bundle is not None:
      for tensor in ck.dense_tensors():
        tensors[tensor] = _dense(ck, tensor)
    for group in variables:
      if format == "object":

        def naming(index, group=group):
          node_id = by_group[(group.name, index)]
          node = graph.nodes[node_id]
          node.registered_saver.name = REGISTERED_SAVER
          node.registered_saver.object_name = paths[node_id]
          table = f"{group.flat}_mht_{index + 1}of{len(group.shards)}"
          return prefix + table_checkpoint.snapshot_suffix(paths[node_id]), table

      else:

        def naming(index, group=group):
          table = f"{group.flat}_mht_{index + 1}of{len(group.shards)}"
          return prefix + table_checkpoint.snapshot_suffix(table), table

      written, initial, summary = _write_tables(
        ck, group, naming, steps, initializer_version, chunk_rows, bar, variables
      )
      for index, (_, table, rows) in enumerate(written):
        if format == "object":
          object_name = paths[by_group[(group.name, index)]]
          tensors[f"{object_name}/{ROWS_TENSOR}"] = (tf.int64, np.int64(rows))
        else:
          tensors[f"{table}-slot_initial_values"] = (tf.float32, np.array(initial, np.float32))
      report["variables"][group.name] = summary
    if format == "object":
      for node_id in tables:
        graph.nodes[node_id].has_checkpoint_values.value = True
      tensors[OBJECT_GRAPH] = (tf.string, np.array(graph.SerializeToString(), dtype=object))
    _save_tensors(prefix, tensors)
    with open(os.path.join(work, "checkpoint"), "w") as f:
      f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    report["update_count"] = steps
    with open(os.path.join(work, REPORT), "w") as f:
      json.dump(report, f, indent=2, sort_keys=True)
      f.write("\n")
    bar.close()
    if os.path.exists(dst):
      old = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.replaced-", dir=parent)
      os.rename(dst, os.path.join(old, "old"))
      os.rename(work, dst)
      shutil.rmtree(old, ignore_errors=True)
    else:
      os.rename(work, dst)
  except BaseException:
    bar.close()
    shutil.rmtree(work, ignore_errors=True)
    raise
  return os.path.join(dst, name)


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog="python -m tf_ext.tfra.convert",
    description="Converts a TFRA checkpoint (Saver, tf.train.Checkpoint, Keras weights, "
    "SavedModel, FileSystemSaver files) into a native tf_ext checkpoint.",
  )
  parser.add_argument("src", help="the TFRA checkpoint: a prefix, a directory or a SavedModel")
  parser.add_argument("dst", help="the directory to write (it must not exist)")
  parser.add_argument("--format", default="auto", choices=["auto", "saver", "object"])
  parser.add_argument(
    "--update-count",
    type=int,
    default=None,
    help="every row's update count (default: TFRA's step count)",
  )
  parser.add_argument(
    "--key-dtype",
    default="int64",
    choices=["int64", "int32"],
    help="the keys of FileSystemSaver files (they do not say)",
  )
  parser.add_argument(
    "--initializer-version",
    type=int,
    default=1,
    help="the initializer version of the tables that will restore it",
  )
  parser.add_argument("--chunk-rows", type=int, default=checkpoints.CHUNK_ROWS)
  parser.add_argument("--overwrite", action="store_true")
  parser.add_argument("--quiet", action="store_true", help="no progress bar")
  args = parser.parse_args(argv)
  try:
    prefix = convert(
      args.src,
      args.dst,
      format=args.format,
      update_count=args.update_count,
      key_dtype=tf.int64 if args.key_dtype == "int64" else tf.int32,
      initializer_version=args.initializer_version,
      chunk_rows=args.chunk_rows,
      progress=not args.quiet,
      overwrite=args.overwrite,
    )
  except (tf.errors.OpError, ValueError, OSError) as error:
    message = error.message if isinstance(error, tf.errors.OpError) else str(error)
    sys.stderr.write(f"tf_ext.tfra.convert: error: {' '.join(message.split())}\n")
    return 2
  print(prefix)
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""The markers that tf_ext's lookups leave for the embedding fusion pass.

kernels/graph/embedding_fusion_pass.cc reads them; ops/dynamic_embedding_fusion_ops.cc documents
them.
"""

import weakref

import tensorflow as tf
from tensorflow.python.framework import ops

from tf_ext import _ops_loader

# In a graph, each lookup's result goes through a TfExtEmbeddingField marker naming the table,
# keys, segments and combiner it was computed from, and the gradient of its rows through a
# TfExtEmbeddingRowsGradient marker naming the gradient of the result. Both pass their first input
# through; with tf_ext.graph's passes enabled, the pass replaces them, and the ops before
# them, by one fused lookup and one fused apply for all lookups of the step.

# graph -> {find op name: (gradient of the marked result, the marker op)}, filled by the marker's
# gradient and read by the find's (tf.gradients and tapes compute the marker's first).
_output_gradients = weakref.WeakKeyDictionary()


def marked(table, rows, embeddings, segment_ids, num_segments, combiner):
  """`embeddings`, computed from `rows` (a lookup in `table`), through the fusion marker when
  building a graph."""
  if tf.executing_eagerly() or rows.op.type != "TfExtTableFind":
    return embeddings
  return _ops_loader.load().tf_ext_embedding_field(
    embeddings,
    rows,
    rows.op.inputs[0],  # the handle the find read: a one-shard sharded table has no handle itself
    rows.op.inputs[1],
    tf.cast(segment_ids, tf.int64),
    tf.cast(num_segments, tf.int64),
    dim=table.dim,
    combiner=combiner,
  )


def marked_rows(table, rows):
  """`rows` (a lookup in `table`, one row per id: no combiner) through the fusion marker."""
  return marked(table, rows, rows, [], 0, "none")


@ops.RegisterGradient("TfExtEmbeddingField")
def _embedding_field_gradient(op, grad):
  marker = op.outputs[0].op  # tapes pass a stand-in op; its output is the real one's
  _output_gradients.setdefault(marker.graph, {})[marker.inputs[1].op.name] = (grad, marker)
  return [grad] + [None] * 5


def marked_rows_gradient(find, keys, row_gradients):
  """`row_gradients` of the find op `find` (flat keys `keys`), through the rows-gradient marker
  when the find's result was marked and its gradient is being computed in the same graph."""
  if tf.executing_eagerly():  # eager lookups leave no markers
    return row_gradients
  find = find.outputs[0].op  # as above
  output_gradient, marker = _output_gradients.get(find.graph, {}).pop(find.name, (None, None))
  if output_gradient is None or getattr(output_gradient, "graph", None) is not row_gradients.graph:
    return row_gradients
  return _ops_loader.load().tf_ext_embedding_rows_gradient(
    row_gradients,
    output_gradient,
    keys,
    marker.inputs[4],
    marker.inputs[5],
    dim=marker.get_attr("dim"),
    combiner=marker.get_attr("combiner"),
  )

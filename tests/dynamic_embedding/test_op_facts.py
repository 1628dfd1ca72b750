"""Python's copies of facts the C++ ops own agree with the loaded op library.

The op library is the source of truth: its op definitions (names of inputs, outputs, allowed attr
values, docs) are read from TensorFlow's op registry, and its kernels are run directly through the
raw ops, bypassing the Python checks, where a fact lives only in a kernel (max dim, initializer
kinds, optimizer kinds).
"""

import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session

import tf_ext
from tf_ext import _ops_loader
from tf_ext.dynamic_embedding import initializers
from tf_ext.dynamic_embedding import variable as variable_lib
from tf_ext.keras import layers


def _library_op_defs():
  """{name: OpDef} of every op the op library registers, docs included."""
  library = _ops_loader.load()
  buffer = pywrap_tf_session.TF_GetAllOpList()
  registered = op_def_pb2.OpList.FromString(pywrap_tf_session.TF_GetBuffer(buffer))
  # The module tf.load_op_library generates defines a wrapper named like each op of the library.
  ours = {
    name
    for name, value in vars(library).items()
    if callable(value) and getattr(value, "__module__", None) == library.__name__
  }
  return {op.name: op for op in registered.op if op.name in ours}


def _allowed_values(op_def, attr_name):
  (attr,) = [a for a in op_def.attr if a.name == attr_name]
  return [value.decode() for value in attr.allowed_values.list.s]


def test_the_library_registers_the_table_ops():
  names = set(_library_op_defs())
  assert {"TfExtDynamicTable", "TfExtTableFind", "TfExtTableExport", "TfExtTableImport"} <= names


def test_every_op_is_documented():
  undocumented, cut_short = [], []
  for name, op_def in sorted(_library_op_defs().items()):
    if not op_def.summary:
      undocumented.append(name)
    # TensorFlow takes the first line of .Doc() as the summary: it must be a whole sentence.
    elif not op_def.summary.endswith("."):
      cut_short.append(f"{name}: {op_def.summary!r}")
  assert not (undocumented or cut_short), (
    f"ops without .Doc() in ops/*.cc: {undocumented}; "
    f"summaries cut short (make the first line of .Doc() a sentence): {cut_short}"
  )


def test_save_tensors_are_the_export_outputs_and_import_inputs_in_order():
  op_defs = _library_op_defs()
  exported = [arg.name for arg in op_defs["TfExtTableExport"].output_arg]
  imported = [arg.name for arg in op_defs["TfExtTableImport"].input_arg]
  assert exported == list(variable_lib._SAVE_SUFFIXES)
  assert imported == ["table", *variable_lib._SAVE_SUFFIXES]


def test_keras_layer_arrays_are_the_export_outputs_after_keys():
  exported = [arg.name for arg in _library_op_defs()["TfExtTableExport"].output_arg]
  assert exported[0] == "keys"
  assert list(layers.DynamicEmbedding._TABLE_ARRAYS) == exported[1:]


def _raw_table(name, dim=2, initializer="zeros", key_dtype=tf.int64):
  """A table made by the raw op, without the Python argument checks."""
  return _ops_loader.load().tf_ext_dynamic_table(
    table_name=name,
    shared_name=f"{name}_{id(object())}",
    key_dtype=key_dtype,
    dim=dim,
    initializer=initializer,
  )


def test_max_dim_is_the_kernels():
  library = _ops_loader.load()
  dim = variable_lib.MAX_DIM
  keys = tf.constant([7], tf.int64)
  rows = library.tf_ext_table_find(_raw_table("max_dim", dim), keys, tf.constant(0.0), dim=dim)
  assert rows.shape == (1, dim)
  with pytest.raises(tf.errors.InvalidArgumentError, match=rf"dim must be in \[1, {dim}\]"):
    _raw_table("over_max_dim", dim + 1)


def test_initializer_kinds_are_the_kernels():
  for kind in initializers.KINDS:
    _raw_table(f"kind_{kind}", initializer=kind)
  with pytest.raises(tf.errors.InvalidArgumentError, match="unknown initializer 'bogus'") as error:
    _raw_table("kind_bogus", initializer="bogus")
  known = re.search(r"known: ((?:\w+, )*\w+)", error.value.message).group(1)
  assert tuple(known.split(", ")) == initializers.KINDS


# Optimizer slots per row: Adagrad's accumulator; Adam's first and second moments (AMSGrad: and
# their maximum); momentum; FTRL's accumulator and linear term; RMSprop's ms (centered: and mg;
# with momentum: and mom); Adadelta's two accumulators; ProximalAdagrad's accumulator; AdagradDA's
# gradient and squared gradient sums; Adamax's m and u; Nadam's m and v.
_SLOTS = {
  "sgd": 0,
  "adagrad": 1,
  "adam": 2,
  "amsgrad": 3,
  "momentum": 1,
  "keras_momentum": 1,
  "ftrl": 2,
  "rmsprop": 1,
  "centered_rmsprop": 2,
  "rmsprop_momentum": 2,
  "centered_rmsprop_momentum": 3,
  "adadelta": 2,
  "proximal_sgd": 0,
  "proximal_adagrad": 1,
  "adagrad_da": 2,
  "adamax": 2,
  "nadam": 2,
}
# The op's `hyperparameters` input by kind: momentum; FTRL's l1, l2, l2_shrinkage, lr_power;
# RMSprop's and Adadelta's rho (and momentum); the proximal l1, l2 (AdagradDA: and global step);
# Nadam's schedule decay.
_HYPERPARAMETERS = {
  "momentum": [0.9],
  "keras_momentum": [0.9],
  "ftrl": [0.0, 0.0, 0.0, -0.5],
  "rmsprop": [0.9],
  "centered_rmsprop": [0.9],
  "rmsprop_momentum": [0.9, 0.5],
  "centered_rmsprop_momentum": [0.9, 0.5],
  "adadelta": [0.9],
  "proximal_sgd": [0.0, 0.0],
  "proximal_adagrad": [0.0, 0.0],
  "adagrad_da": [0.0, 0.0, 1.0],
  "nadam": [1.0],
}


def test_every_optimizer_the_op_allows_runs_in_the_kernel():
  library = _ops_loader.load()
  allowed = _allowed_values(_library_op_defs()["TfExtTableApplyGradient"], "optimizer")
  assert sorted(allowed) == sorted(_SLOTS)
  for kind in allowed:
    table = _raw_table(f"apply_{kind}")
    library.tf_ext_table_apply_gradient(
      table,
      tf.constant([3], tf.int64),
      tf.ones([1, 2]),
      0.1,
      0.9,
      0.999,
      1e-7,
      tf.constant(1, tf.int64),
      _HYPERPARAMETERS.get(kind, []),
      dim=2,
      optimizer=kind,
    )
    _, values, slots, counts, _, slot_initial_values = library.tf_ext_table_export(
      table, Tkey=tf.int64, dim=2
    )
    assert counts.numpy().tolist() == [1]
    assert not np.array_equal(values.numpy(), np.zeros([1, 2])), kind
    assert slots.shape == (1, 2 * _SLOTS[kind]) and slot_initial_values.shape == (_SLOTS[kind],)


def _optimizer_kinds_emitted(make_optimizer):
  """The `optimizer` attrs of the table updates that DynamicEmbeddingOptimizer builds."""
  table = tf_ext.DynamicEmbeddingVariable("emitted", 2, initializer="zeros")
  optimizer = tf_ext.DynamicEmbeddingOptimizer(make_optimizer())

  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(table.lookup(tf.constant([1, 2], tf.int64)))
    anchor = table.gradient_anchor
    optimizer.apply_gradients(zip(tape.gradient(loss, [anchor]), [anchor]))

  step()  # eagerly first, so that the optimizer creates its variables outside the traced graph
  graph_def = tf.function(step).get_concrete_function().graph.as_graph_def()
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  return {n.attr["optimizer"].s.decode() for n in nodes if n.op == "TfExtTableApplyGradient"}


_OPTIMIZER_FAMILIES = {
  "v1": (
    lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    lambda: tf.compat.v1.train.FtrlOptimizer(0.1),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.1),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.1, momentum=0.9, centered=True),
    lambda: tf.compat.v1.train.AdadeltaOptimizer(0.1),
    lambda: tf.compat.v1.train.ProximalGradientDescentOptimizer(0.1),
    lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.1),
    lambda: tf.compat.v1.train.AdagradDAOptimizer(0.1, tf.Variable(0, dtype=tf.int64)),
  ),
  "keras": (
    lambda: tf.keras.optimizers.SGD(0.1),
    lambda: tf.keras.optimizers.Adagrad(0.1),
    lambda: tf.keras.optimizers.Adam(0.1),
    lambda: tf.keras.optimizers.Adam(0.1, amsgrad=True),
    lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: tf.keras.optimizers.Ftrl(0.1),
    lambda: tf.keras.optimizers.RMSprop(0.1),
    lambda: tf.keras.optimizers.RMSprop(0.1, momentum=0.9, centered=True),
    lambda: tf.keras.optimizers.RMSprop(0.1, centered=True),
    lambda: tf.keras.optimizers.RMSprop(0.1, momentum=0.9),
    lambda: tf.keras.optimizers.Adadelta(0.1),
    lambda: tf.keras.optimizers.Adamax(0.1),
    lambda: tf.keras.optimizers.Nadam(0.1),
  ),
  "keras_legacy": (
    lambda: tf.keras.optimizers.legacy.SGD(0.1),
    lambda: tf.keras.optimizers.legacy.Adagrad(0.1),
    lambda: tf.keras.optimizers.legacy.Adam(0.1),
    lambda: tf.keras.optimizers.legacy.Adam(0.1, amsgrad=True),
    lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    lambda: tf.keras.optimizers.legacy.Ftrl(0.1),
    lambda: tf.keras.optimizers.legacy.RMSprop(0.1),
    lambda: tf.keras.optimizers.legacy.RMSprop(0.1, momentum=0.9, centered=True),
    lambda: tf.keras.optimizers.legacy.Adadelta(0.1),
    lambda: tf.keras.optimizers.legacy.Adamax(0.1),
    lambda: tf.keras.optimizers.legacy.Nadam(0.1),
  ),
}


@pytest.mark.parametrize("family", sorted(_OPTIMIZER_FAMILIES))
def test_optimizer_kinds_python_emits_are_the_ops(family):
  allowed = _allowed_values(_library_op_defs()["TfExtTableApplyGradient"], "optimizer")
  emitted = [_optimizer_kinds_emitted(make) for make in _OPTIMIZER_FAMILIES[family]]
  assert all(len(kinds) == 1 for kinds in emitted), emitted
  assert set().union(*emitted) <= set(allowed)


def test_every_optimizer_kind_the_op_allows_is_emitted():
  allowed = _allowed_values(_library_op_defs()["TfExtTableApplyGradient"], "optimizer")
  emitted = set().union(
    *(_optimizer_kinds_emitted(make) for family in _OPTIMIZER_FAMILIES.values() for make in family)
  )
  assert sorted(emitted) == sorted(allowed)


def test_statistics_names_follow_the_op_output_order():
  from tf_ext.dynamic_embedding import lifecycle

  op_def = _library_op_defs()["TfExtTableStatistics"]
  text = (op_def.summary + " " + op_def.description).replace("\n", " ")
  listed = re.sub(r"\([^)]*\)", "", re.search(r"In order: (.*?)\. Counts", text).group(1))
  names = [re.match(r"\s*(\w+)", part).group(1) for part in listed.split(",")]
  # "size (rows), bytes in use, ..." -> size, bytes, admitted, ...
  assert names == list(lifecycle.STATISTICS)
  table = tf_ext.get_dynamic_embedding_variable("facts_stats", 2)
  values = _ops_loader.load().tf_ext_table_statistics(table.resource_handle)
  assert values.shape == [len(lifecycle.STATISTICS)]

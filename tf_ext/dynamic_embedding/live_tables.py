"""Every live dynamic embedding table, by graph (eager ones apart): what hooks, callbacks and
serving export find when they are not given tables. Tables add themselves when they are created;
the sets are weak, so a table its user dropped is gone from them too."""

import weakref

import tensorflow as tf
from tensorflow.python.framework import ops

_graph_tables = weakref.WeakKeyDictionary()
_eager_tables = weakref.WeakSet()


def scope_key():
  """The current graph, or "eager": where a table created now lives."""
  with tf.init_scope():
    return "eager" if tf.executing_eagerly() else ops.get_default_graph()


def remember(table):
  """Adds a new table to the live tables of where it was created."""
  key = scope_key()
  if key == "eager":
    _eager_tables.add(table)
  else:
    _graph_tables.setdefault(key, weakref.WeakSet()).add(table)


def tables(graph=None):
  """The live tables of `graph` (default: the current graph, or the eager context), by name."""
  key = scope_key() if graph is None else graph
  found = _eager_tables if key == "eager" else _graph_tables.get(key, ())
  return sorted(found, key=lambda table: table.name)

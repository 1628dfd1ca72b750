"""Sessions of a padded graph wait in close() for their XLA compilations in flight.

TensorFlow's asynchronous XLA compilation goes on after the step that started it, reading the
Session's function library: closing the Session meanwhile crashes the process (a use after free in
TensorFlow 2.15). So a Session of a graph that a tf_ext.jit.Bucketing pads waits, in close(),
until its device has no compilation in flight (TfExtXlaOngoingCompilations counts them):
`install_close_guard()` wraps Session.close once per process, and `guard_sessions_of(graph)` adds
the counting op to a graph.
"""

import functools
import logging
import time
import weakref

import tensorflow as tf
from tensorflow.python.client import session as session_lib

from tf_ext import _ops_loader

logger = logging.getLogger("tf_ext.jit")

_ONGOING = weakref.WeakKeyDictionary()  # graph -> its TfExtXlaOngoingCompilations tensor
_CLOSE_WAIT_S = 600.0


def guard_sessions_of(graph):
  """Makes the Sessions of `graph` wait in close() (once the close guard is installed)."""
  if tf.executing_eagerly() or graph.finalized or graph in _ONGOING:
    return
  with graph.as_default(), graph.name_scope(None), tf.device("/cpu:0"):
    _ONGOING[graph] = _ops_loader.load().tf_ext_xla_ongoing_compilations(
      name="tf_ext_jit_ongoing_compilations"
    )


def install_close_guard():
  """Wraps Session.close (once per process) to wait for a guarded graph's compilations."""
  close = session_lib.BaseSession.close
  if getattr(close, "waits_for_xla_compilations", False):
    return

  @functools.wraps(close)
  def close_after_compilations(session):
    ongoing = _ONGOING.get(session.graph)
    if ongoing is not None and not session._closed:
      _wait_for_compilations(session, ongoing)
    close(session)

  close_after_compilations.waits_for_xla_compilations = True
  session_lib.BaseSession.close = close_after_compilations


def _wait_for_compilations(session, ongoing):
  deadline = time.monotonic() + _CLOSE_WAIT_S
  logged = False
  while time.monotonic() < deadline:
    try:
      count = int(session.run(ongoing))
    except Exception:  # a session that cannot run any more: nothing to wait for
      return
    if count <= 0:
      return
    if not logged:
      logged = True
      logger.info("tf_ext.jit: closing a Session after its %d XLA compilation(s) in flight", count)
    time.sleep(0.02)
  logger.warning("tf_ext.jit: XLA compilations still in flight after %.0f s", _CLOSE_WAIT_S)

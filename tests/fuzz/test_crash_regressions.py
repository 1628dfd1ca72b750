"""The inputs that took the process down before their kernels checked them (issue 37).

Each test runs the exact call in a child process (so that a regression fails the test instead of
killing pytest) and expects the TensorFlow error that names what is wrong. The same calls are in
corpus.json, which the fuzzer replays first.
"""

import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import re, sys
import numpy as np
import tensorflow as tf
from tf_ext import _ops_loader
ops = _ops_loader.load()

def table(dim=1, key_dtype=tf.int64, name="regression"):
  return ops.tf_ext_dynamic_table(table_name=name, shared_name=name, key_dtype=key_dtype, dim=dim)
"""

EAGER = """
try:
{body}
except tf.errors.InvalidArgumentError as error:
  print("ERROR InvalidArgumentError:", error.message)
else:
  print("no error")
"""

# In a graph the inputs come from placeholders of unknown shape: the shape functions cannot see
# them, so only the kernel can refuse them.
GRAPH = """
with tf.Graph().as_default():
  feeds = {{}}
  def fed(value, dtype):
    placeholder = tf.compat.v1.placeholder(dtype, shape=None)
    feeds[placeholder] = value
    return placeholder
  fetch = {body}
  with tf.compat.v1.Session() as session:
    try:
      session.run(fetch, feed_dict=feeds)
    except tf.errors.InvalidArgumentError as error:
      print("ERROR InvalidArgumentError:", error.message)
    else:
      print("no error")
"""

# Building the graph: the op's shape function refuses the call (TensorFlow raises ValueError).
GRAPH_BUILD = """
with tf.Graph().as_default():
  try:
{body}
  except ValueError as error:
    print("ERROR ValueError:", error)
  else:
    print("no error")
"""


def run_call(template, body):
  indent = "    " if template is GRAPH_BUILD else "  "
  code = PRELUDE + template.format(body=textwrap.indent(textwrap.dedent(body).strip(), indent))
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    TF_CPP_MIN_LOG_LEVEL="2",
  )
  proc = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
  )
  assert proc.returncode == 0, (
    f"the call took the process down (status {proc.returncode}):\n{proc.stderr[-3000:]}"
  )
  return proc.stdout


def expect_error(template, body, message):
  out = run_call(template, body)
  assert "ERROR " in out and message in out, out


# TfExtAmpProbe: CHECK failure (SIGABRT) in Tensor::scalar on a non-scalar input.
def test_amp_probe_non_scalar_loss_is_an_error_eagerly():
  expect_error(
    EAGER,
    """
    ops.tf_ext_amp_probe(
      loss=tf.fill([16, 16, 1], np.inf), reference=tf.constant([2.0]),
      probed=tf.zeros([16, 3, 0], tf.bool))
    """,
    "precision probe: loss must be a scalar, got shape [16,16,1]",
  )


def test_amp_probe_non_scalar_probed_is_an_error_in_a_graph():
  expect_error(
    GRAPH,
    """
    ops.tf_ext_amp_probe(
      loss=fed(1.0, tf.float32), reference=fed(2.0, tf.float32),
      probed=fed(np.zeros([4, 4], bool), tf.bool))
    """,
    "precision probe: probed must be a scalar, got shape [4,4]",
  )


# TfExtAmpPolicyStep: its input 4 (ran_half) was the one input left unchecked (same CHECK).
def test_amp_policy_step_non_scalar_ran_half_is_an_error():
  expect_error(
    EAGER,
    """
    ops.tf_ext_amp_policy_step(
      state=ops.tf_ext_amp_policy_initial_state(), loss=tf.constant(1.0),
      gradients_finite=tf.constant(True), probe_error=tf.constant(-1.0),
      ran_half=tf.zeros([0], tf.bool))
    """,
    "loss-aware precision policy: ran_half must be a scalar, got shape [0]",
  )


# TfExtXlaSpeedGateReady: the same CHECK failure on a non-scalar `ready`.
def test_xla_speed_gate_ready_non_scalar_is_an_error_eagerly():
  expect_error(
    EAGER,
    """
    ops.tf_ext_xla_speed_gate_ready(ready=tf.zeros([4], tf.bool), gate="", clusters="c")
    """,
    "TfExtXlaSpeedGateReady: ready must be a scalar bool, got shape [4]",
  )


def test_xla_speed_gate_ready_empty_is_an_error_in_a_graph():
  expect_error(
    GRAPH,
    """
    ops.tf_ext_xla_speed_gate_ready(
      ready=fed(np.zeros([0, 1], bool), tf.bool), gate="none", clusters="c")
    """,
    "TfExtXlaSpeedGateReady: ready must be a scalar bool, got shape [0,1]",
  )


# TfExtTableFind with dim=0 on a table of dim 1: the dim check skipped 0, the output was sized
# by 0 and written by the table's dim (SIGSEGV).
@pytest.mark.parametrize("template", [EAGER, GRAPH], ids=["eager", "graph"])
def test_table_find_with_dim_zero_is_an_error(template):
  expect_error(
    template,
    """
    ops.tf_ext_table_find(
      table=table(dim=1), keys=tf.constant(1, tf.int64), gradient_anchor=tf.constant(0.0), dim=0)
    """,
    "dim is 1, the op expects 0",
  )


# A table input that is not one handle: TensorFlow's HandleFromInput reads element 0 unchecked,
# past the end of an empty handle tensor fed to a graph.
@pytest.mark.parametrize("count", [0, 2])
def test_table_size_of_a_non_scalar_handle_is_an_error_in_a_graph(count):
  expect_error(
    GRAPH,
    f"""
    ops.tf_ext_table_size(table=tf.gather(tf.stack([table()]), tf.zeros([{count}], tf.int32)))
    """,
    f"TfExtTableSize: input 0 must be one table (a scalar resource handle), got shape [{count}]",
  )


# TfExtFusedEmbeddingLookup: the same unchecked read, for a field's table (SIGSEGV).
def test_fused_lookup_of_an_empty_handle_is_an_error_in_a_graph():
  expect_error(
    GRAPH,
    """
    ops.tf_ext_fused_embedding_lookup(
      tables=[tf.gather(tf.stack([table()]), tf.zeros([0], tf.int32))],
      keys=[tf.constant([1], tf.int64)], segment_ids=[tf.constant([0], tf.int64)],
      num_segments=[tf.constant(1, tf.int64)], concat_extras=[], dims=[1], combiners=["none"])
    """,
    "TfExtFusedEmbeddingLookup: input 0 must be one table (a scalar resource handle), got shape "
    "[0]",
  )


# TfExtDynamicTable allowed an admission sketch of up to 2^32 counters per row, 16 rows (256 GiB),
# allocated at creation: past the memory at hand the process went down (SIGSEGV under the
# fuzzer's 4 GiB bound) or was killed for memory.
def test_dynamic_table_with_an_oversized_admission_sketch_is_an_error():
  expect_error(
    EAGER,
    """
    ops.tf_ext_dynamic_table(
      table_name="ab", shared_name="ab", key_dtype=tf.int64, dim=4, admission_min_count=2,
      admission_sketch_width=2**32)
    """,
    "'ab': admission sketch of 4294967296 x 4 counters is over the limit of 268435456 counters",
  )


# TfExtFusedEmbeddingLookup's shape function found field i's inputs by position, assuming N keys
# tensors: with fewer, it read past the end of the inputs while the graph was built (SIGSEGV).
def test_fused_lookup_with_fewer_keys_than_tables_is_an_error_when_the_graph_is_built():
  expect_error(
    GRAPH_BUILD,
    """
    ops.tf_ext_fused_embedding_lookup(
      tables=[table(name=f"t{i}") for i in range(3)],
      keys=[tf.constant(["a", "b"]), tf.constant("c")],
      segment_ids=[tf.constant(0, tf.int64)] * 3, num_segments=[tf.constant(1, tf.int64)] * 3,
      concat_extras=[], dims=[1, 1, 1], combiners=["sum", "sum", "sum"])
    """,
    "keys, dims and combiners must have N = 3 entries, got 2, 3 and 3",
  )


# TfExtTopKCompress checked residual_offset + len(gradient) against the residual's size, and a
# huge residual_offset overflowed into a pass: 2^63 - 1 wrapped to a pointer just before the
# residual's buffer, which was then read and written (no crash, a silent heap corruption).
def test_topk_compress_with_a_huge_residual_offset_is_an_error():
  expect_error(
    EAGER,
    """
    residual = tf.Variable(tf.zeros([4]))
    ops.tf_ext_top_k_compress(
      gradient=tf.ones([2]), residual=residual.handle, segment_lengths=[2], segment_counts=[1],
      residual_offset=2**63 - 1)
    """,
    "residual must be a float32 vector of at least 9223372036854775809 entries",
  )


# Its residual handle had TensorFlow's unchecked HandleFromInput read too (SIGSEGV in a graph fed
# an empty vector of handles).
def test_topk_compress_of_an_empty_residual_handle_is_an_error_in_a_graph():
  expect_error(
    GRAPH,
    """
    ops.tf_ext_top_k_compress(
      gradient=tf.ones([2]), segment_lengths=[2], segment_counts=[1],
      residual=tf.gather(tf.stack([tf.Variable(tf.zeros([4])).handle]), tf.zeros([0], tf.int32)))
    """,
    "residual must be one variable (a scalar resource handle), got shape [0]",
  )

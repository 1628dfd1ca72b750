"""Reachability of a cluster's tasks: a clear error within a timeout instead of a hang.

TensorFlow's gRPC sessions wait forever for a task that does not answer (a parameter server whose
address is wrong, or that is down), printing "CreateSession still waiting" and nothing else.
Two guards:

- A table built in a graph on a task of the TF_CONFIG cluster (e.g. a shard placed on a PS by
  replica_device_setter) checks, when it is built, that the task accepts connections within
  TF_EXT_PS_WAIT_TIMEOUT_S (once per address and process).
- `wait_for_cluster` checks whole jobs, for code that wants the check before anything else.
"""

import socket
import time

import tensorflow as tf

from tf_ext import settings

# Addresses that accepted a connection once in this process: checked no more.
_answered = set()


def _wait(tasks, timeout_s, what):
  """Waits until each of {task: "host:port"} accepts a TCP connection; DeadlineExceededError
  naming the ones that did not within timeout_s, and why."""
  waiting = {task: address for task, address in tasks.items() if address not in _answered}
  deadline = time.monotonic() + timeout_s
  errors = {}
  while waiting:
    for task, address in list(waiting.items()):
      host, _, port = address.rpartition(":")
      try:
        left = max(0.1, min(2.0, deadline - time.monotonic()))
        with socket.create_connection((host.strip("[]"), int(port)), timeout=left):
          del waiting[task]
          _answered.add(address)
      except (OSError, ValueError) as error:
        errors[task] = error
    if not waiting or time.monotonic() >= deadline:
      break
    time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
  if waiting:
    unreachable = ", ".join(
      f"{task} at {address} ({errors[task]})" for task, address in waiting.items()
    )
    raise tf.errors.DeadlineExceededError(
      None,
      None,
      f"{what}: {len(waiting)} task(s) unreachable after {timeout_s:g} s: {unreachable}; check "
      "the cluster's addresses (TF_CONFIG) and that those servers run",
    )


def _tasks(spec, job):
  tasks = spec.get(job) or {}
  return tasks.items() if isinstance(tasks, dict) else enumerate(tasks)


def wait_for_cluster(cluster=None, timeout_s=30.0, jobs=("ps",)):
  """Waits until every task of `jobs` in `cluster` accepts connections, or raises.

  Args:
    cluster: a tf.train.ClusterSpec, a dict {job: [addresses]}, or None for the cluster of
      TF_CONFIG.
    timeout_s: how long to keep trying the tasks that do not answer yet.
    jobs: the jobs to check; None checks every job.

  Raises:
    tf.errors.DeadlineExceededError: naming each task and address that did not accept a TCP
      connection within timeout_s, with the last connection error.
  """
  if cluster is None:
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
  spec = tf.train.ClusterSpec(cluster).as_dict()
  tasks = {
    f"/job:{job}/task:{index}": address
    for job in spec
    if jobs is None or job in jobs
    for index, address in _tasks(spec, job)
  }
  _wait(tasks, timeout_s, "tf_ext.wait_for_cluster")


def check_device_reachable(device, table_name):
  """When `device` is a task of the TF_CONFIG cluster, waits (TF_EXT_PS_WAIT_TIMEOUT_S) until it
  accepts connections; DeadlineExceededError naming the table and the address otherwise."""
  timeout_s = settings.get("TF_EXT_PS_WAIT_TIMEOUT_S")
  if not device or not timeout_s:
    return
  placed = tf.DeviceSpec.from_string(device)
  if placed.job in (None, "localhost"):
    return
  spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec().as_dict()
  tasks = {
    f"/job:{placed.job}/task:{index}": address
    for index, address in _tasks(spec, placed.job)
    if placed.task is None or int(index) == placed.task
  }
  _wait(tasks, timeout_s, f"dynamic embedding table '{table_name}' on {device}")

"""After `make build`, the venv's python imports tf_ext from any directory (editable install).

This checks the installed environment, not the files Bazel gave this test (it is tagged
"external" in tests/BUILD, so never cached).
"""

import os
import subprocess
import sys

USE_FROM_ANYWHERE = """
import numpy as np
import tensorflow as tf
import tf_ext
import tf_ext.harp

print("tf_ext from", tf_ext.__file__)
table = tf_ext.get_dynamic_embedding_variable("anywhere", dim=3, initializer="zeros")
table.insert(tf.constant([7], tf.int64), np.ones([1, 3], np.float32))
print("rows", table.lookup(tf.constant([7, 8], tf.int64)).numpy().tolist())
print("plugin", tf_ext.harp.plugin_path())
"""


def test_the_venv_python_imports_tf_ext_outside_the_checkout(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  proc = subprocess.run(
    [sys.executable, "-c", USE_FROM_ANYWHERE],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert proc.returncode == 0, (
    f"{sys.executable} cannot use tf_ext outside the checkout: run `make build` (its "
    f"`make develop` step installs the checkout into .venv, editable)\n{proc.stderr[-3000:]}"
  )
  assert "rows [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]" in proc.stdout, proc.stdout
  assert "libnccl-net-harp.so" in proc.stdout

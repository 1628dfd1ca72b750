"""The op loader refuses a library built for another C++ ABI, with a message that says so.

(tests/dynamic_embedding/test_api.py covers another TensorFlow version and a missing library.)
"""

import os
import subprocess
import sys

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_library_built_for_another_cxx_abi_is_reported(tmp_path):
  running = str(tf.sysconfig.CXX11_ABI_FLAG)
  other = "0" if running == "1" else "1"
  with open(os.path.join(ROOT, "tf_ext", "_tf_ext_ops.so"), "rb") as f:
    raw = f.read()
  marker = f";cxx11_abi={running}]".encode()
  assert raw.count(marker) == 1, "the build-info marker of kernels/build_info.cc is not in the file"
  fake = tmp_path / "_tf_ext_ops.so"
  fake.write_bytes(raw.replace(marker, f";cxx11_abi={other}]".encode()))
  code = (
    "import tf_ext\n"  # importing still works
    "try:\n"
    "  tf_ext.DynamicEmbeddingVariable('x', 4)\n"
    "except ImportError as error:\n"
    "  print('ERROR:', error)\n"
  )
  env = dict(os.environ, TF_EXT_OPS_LIBRARY=str(fake), PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240
  )
  assert proc.returncode == 0, proc.stderr
  assert f"(_GLIBCXX_USE_CXX11_ABI={other}) but this process runs" in proc.stdout, proc.stdout
  assert f"TensorFlow {tf.__version__} (_GLIBCXX_USE_CXX11_ABI={running})" in proc.stdout
  assert "make build" in proc.stdout

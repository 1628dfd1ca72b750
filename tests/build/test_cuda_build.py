"""The CUDA part of the build (third_party/cuda_library.sh, TF_EXT_CUDA) and the opt-in GPU
kernels (TF_EXT_GPU_TABLES): what a machine without a GPU can check of them.

The GPU table itself is tested by tests/kernels/dynamic_embedding/device_table_test.cc (its
algorithm on host threads here; on a GPU by tests/gpu/run_gpu_checks.sh).
"""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "third_party", "cuda_library.sh")
CUDA_SOURCE = "kernels/dynamic_embedding/core/gpu/cuda_table.cu"
FALLBACK_SOURCE = "kernels/dynamic_embedding/core/gpu/no_cuda_table.cc"


def build_archive(tmp_path, mode, path=None):
  env = dict(os.environ, TF_EXT_CUDA=mode)
  if path is not None:
    env["PATH"] = path
  archive = tmp_path / "libcuda_part.a"
  result = subprocess.run(
    ["sh", SCRIPT, str(archive), CUDA_SOURCE, FALLBACK_SOURCE],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
  )
  return result, archive


def defined_symbols(archive):
  out = subprocess.run(["nm", "-C", "--defined-only", str(archive)], capture_output=True, text=True)
  return out.stdout


def test_without_cuda_the_fallback_says_so(tmp_path):
  result, archive = build_archive(tmp_path, "0")
  assert result.returncode == 0, result.stderr
  symbols = defined_symbols(archive)
  assert "tf_ext::de::MakeCudaTable" in symbols
  assert "cudaMalloc" not in symbols  # no CUDA runtime inside


def test_a_bad_mode_is_a_clear_error(tmp_path):
  result, _ = build_archive(tmp_path, "yes")
  assert result.returncode != 0
  assert "TF_EXT_CUDA must be auto, 0 or 1, got 'yes'" in result.stderr


def test_cuda_required_without_nvcc_fails_naming_nvcc(tmp_path):
  # A PATH with the compilers and tools but no nvcc.
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  tools = ("g++", "as", "ld", "ar", "mktemp", "rm", "dirname", "mkdir", "mv", "basename", "sh")
  for tool in tools:
    found = shutil.which(tool)
    if found:
      os.symlink(found, bin_dir / tool)
  result, _ = build_archive(tmp_path, "1", path=str(bin_dir))
  assert result.returncode != 0
  assert "TF_EXT_CUDA=1 but nvcc is not on the PATH" in result.stderr
  result, archive = build_archive(tmp_path, "auto", path=str(bin_dir))
  assert result.returncode == 0, result.stderr  # auto falls back
  assert "cudaMalloc" not in defined_symbols(archive)


def op_library():
  import tf_ext

  return os.path.join(os.path.dirname(tf_ext.__file__), "_tf_ext_ops.so")


def test_the_op_library_keeps_any_cuda_runtime_private():
  """TensorFlow brings a CUDA runtime of its own: ours must neither export nor interpose."""
  out = subprocess.run(
    ["nm", "-D", "--defined-only", op_library()], capture_output=True, text=True, check=True
  ).stdout
  exported = [line.split()[-1] for line in out.splitlines() if " cuda" in line.lower()]
  assert exported == []


REGISTERED = """
import tf_ext  # loads the op library
from tensorflow.python.framework import kernels
for op in ("TfExtTableFind", "TfExtDynamicTable", "TfExtTableApplyGradient", "TfExtTableEvict",
           "TfExtTableStatistics", "TfExtTableSaveSnapshot", "TfExtTableRestoreCheckpoint",
           "TfExtFusedEmbeddingLookup"):
  print(op, sorted({k.device_type for k in kernels.get_registered_kernels_for_op(op).kernel}))
"""


@pytest.mark.parametrize("enabled", ["0", "1"])
def test_gpu_kernels_are_registered_only_when_asked(enabled):
  env = dict(os.environ, TF_EXT_GPU_TABLES=enabled, TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run(
    [sys.executable, "-c", REGISTERED], env=env, capture_output=True, text=True, check=True
  ).stdout
  devices = dict(line.split(" ", 1) for line in out.strip().splitlines())
  gpu = "['CPU', 'GPU']" if enabled == "1" else "['CPU']"
  assert devices["TfExtTableFind"] == gpu
  assert devices["TfExtDynamicTable"] == gpu
  assert devices["TfExtTableApplyGradient"] == gpu
  assert devices["TfExtTableEvict"] == gpu
  assert devices["TfExtTableStatistics"] == gpu
  assert devices["TfExtTableSaveSnapshot"] == gpu
  assert devices["TfExtTableRestoreCheckpoint"] == gpu
  # Ops without a GPU path stay CPU-only: a GPU table refuses them with a clear error.
  assert devices["TfExtFusedEmbeddingLookup"] == "['CPU']"

"""The op library's hot loops compile to the instructions they were written for.

- The hashtable's software prefetches. GCC 12 at -O2 finds a function whose only effect is
  __builtin_prefetch "pure" and deletes every call to it: the table's prefetching once compiled to
  nothing, silently (benchmarks/lookup.py measured 0.53x the dense gather's speed instead of
  0.90x). The table prefetches through an asm statement now
  (kernels/dynamic_embedding/core/prefetch.h, PrefetchLine).
- The optimizers' row updates. With std::sqrt allowed to set errno, or with pointers that might
  overlap, GCC compiles Adam's, AMSGrad's, Adagrad's and FTRL's per-element loops
  (kernels/dynamic_embedding/core/optimizers.h) one float at a time: about 4x slower, with the
  same results. The build passes -fno-math-errno and the loops say their blocks do not overlap.
"""

import functools
import os
import platform
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="checks x86-64 instructions")


@functools.lru_cache(maxsize=None)
def disassembly():
  objdump = shutil.which("objdump")
  assert objdump, "objdump (binutils, installed with build-essential by `make setup`) is missing"
  library = os.path.join(ROOT, "tf_ext", "_tf_ext_ops.so")
  return subprocess.run(
    [objdump, "-d", "--no-show-raw-insn", library], capture_output=True, text=True, check=True
  ).stdout


def test_op_library_holds_prefetch_instructions():
  # Lookups in order and by shard, batched updates, the fused kernels' strided rows: each inlined
  # into several kernels (0 when the prefetches were compiled away).
  assert disassembly().count("prefetcht0") >= 10, "the table's prefetches were compiled away"


def test_optimizer_loops_use_packed_square_roots():
  # Adam, AMSGrad, Adagrad (two forms) and FTRL, each inlined into the fused and unfused applies
  # (0 with either errno or possible overlap in the way).
  packed = disassembly().count("sqrtps")  # also counts vsqrtps
  assert packed >= 8, f"{packed} packed square roots: the optimizer loops compiled to scalar code"

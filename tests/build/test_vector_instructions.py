"""The optimizers' row updates compile to vector square roots.

With std::sqrt allowed to set errno, or with pointers that might overlap, GCC compiles Adam's,
AMSGrad's, Adagrad's and FTRL's per-element loops (kernels/dynamic_embedding/core/optimizers.h)
one float at a time: about 4x slower, with the same results. The build passes -fno-math-errno and
the loops say their blocks do not overlap; this checks the built library holds packed square
roots (none before either change).
"""

import os
import platform
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="checks x86-64 instructions")
def test_optimizer_loops_use_packed_square_roots():
  objdump = shutil.which("objdump")
  assert objdump, "objdump (binutils, installed with build-essential by `make setup`) is missing"
  library = os.path.join(ROOT, "tf_ext", "_tf_ext_ops.so")
  listing = subprocess.run(
    [objdump, "-d", "--no-show-raw-insn", library], capture_output=True, text=True, check=True
  ).stdout
  packed = listing.count("sqrtps") + listing.count("vsqrtps")
  # Adam, AMSGrad, Adagrad (two forms) and FTRL, each inlined into the fused and unfused applies.
  assert packed >= 8, f"{packed} packed square roots: the optimizers' loops compiled one float at a time"

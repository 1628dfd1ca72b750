"""The hashtable's software prefetches survive compilation.

GCC 12 at -O2 finds a function whose only effect is __builtin_prefetch "pure" and deletes every
call to it: the table's prefetching once compiled to nothing, silently (benchmarks/lookup.py
measured 0.53x the dense gather's speed instead of 0.90x). The table prefetches through an asm
statement now (kernels/dynamic_embedding/core/embedding_table.h, PrefetchLine); this checks the
built library holds the instructions.
"""

import os
import platform
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="checks x86-64 prefetch instructions")
def test_op_library_holds_prefetch_instructions():
  objdump = shutil.which("objdump")
  assert objdump, "objdump (binutils, installed with build-essential by `make setup`) is missing"
  library = os.path.join(ROOT, "tf_ext", "_tf_ext_ops.so")
  listing = subprocess.run(
    [objdump, "-d", "--no-show-raw-insn", library], capture_output=True, text=True, check=True
  ).stdout
  # Lookups in order and by shard, and batched updates: each inlined into several kernels.
  assert listing.count("prefetcht0") >= 10, "the table's prefetches were compiled away"

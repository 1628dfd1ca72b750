"""Every build of the op library's code generates it with the same flags, declared once in
.bazelrc; and plugin libraries are built with the same plugin flags (third_party/capabilities.bzl).

Bazel and pip (setup.py) both make tf_ext/_tf_ext_ops.so, and the GPU checks' build compiles the
table core into its test binary and benchmark; a flag that only one of them passes makes them
differ in speed (-fno-math-errno lets the optimizers' loops use vector square roots: Adam's row
update ran 4x slower without it) or in the instructions they need (-march).
"""

import ast
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "third_party"))
import build_description  # noqa: E402

GPU_BUILD = "tests/kernels/dynamic_embedding/gpu/build_gpu_checks.sh"


def top_level_list(path, name):
  """The literal list assigned to `name` at the top of the Python/Starlark file `path`."""
  with open(os.path.join(ROOT, path)) as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and [t.id for t in node.targets] == [name]:
      return ast.literal_eval(node.value)
  raise AssertionError(f"{path} has no {name} list")


def read(path):
  with open(os.path.join(ROOT, path)) as f:
    return f.read()


def test_bazelrc_declares_the_code_generation_flags():
  flags = build_description.codegen_flags(os.path.join(ROOT, ".bazelrc"))
  assert "-fno-math-errno" in flags and any(f.startswith("-march=") for f in flags), flags
  assert any(re.match(r"-O\d$", f) for f in flags), flags
  command = [sys.executable, os.path.join(ROOT, "third_party", "build_description.py")]
  printed = subprocess.run(command + ["codegen-flags"], capture_output=True, text=True, check=True)
  assert printed.stdout.split() == flags


def test_the_other_builds_read_them_instead_of_repeating_them():
  # setup.py (pip) and the GPU checks' build take them from build_description, and name none.
  # (The GPU script's g++ flags: the nvcc line for HierarchicalKV's benchmark builds HKV's code.)
  gpu_flags = re.search(r"^CXXFLAGS=.*$", read(GPU_BUILD), re.MULTILINE).group(0)
  for path, text, reader in (
    ("setup.py", read("setup.py"), "build_description.codegen_flags("),
    (GPU_BUILD, gpu_flags, "build_description.py codegen-flags"),
  ):
    assert reader in text, f"{path} does not read the code-generation flags ({reader})"
    own = [f for f in re.findall(r"-[\w=.-]+", text) if build_description.CODEGEN.match(f)]
    assert not own, f"{path} names code-generation flags of its own: {own}"


def test_both_builds_build_plugins_with_the_same_flags():
  # Hidden symbols, and -z nodelete: NCCL 2.28+ dlcloses the plugin under its worker threads.
  bazel = "third_party/capabilities.bzl"
  assert top_level_list(bazel, "_PLUGIN_COPTS") == top_level_list("setup.py", "PLUGIN_FLAGS")
  assert "-Wl,-z,nodelete" in top_level_list(bazel, "_PLUGIN_LINKOPTS")
  assert top_level_list(bazel, "_PLUGIN_LINKOPTS") == top_level_list(
    "setup.py", "PLUGIN_LINK_FLAGS"
  )

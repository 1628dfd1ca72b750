"""Bazel (.bazelrc) and pip (setup.py) compile the op library with the same code-generation flags,
and build plugin libraries with the same plugin flags (third_party/capabilities.bzl).

Both builds make tf_ext/_tf_ext_ops.so; a flag that only one of them passes makes the two libraries
differ in speed (-fno-math-errno lets the optimizers' loops use vector square roots: Adam's row
update ran 4x slower without it) or in the instructions they need (-march).
"""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Flags that decide the generated code; the rest (-fPIC, -pthread, -DNDEBUG) are each build's own.
CODEGEN = re.compile(r"^-(O\d|march=.*|f(no-)?math-errno)$")


def bazel_copts():
  with open(os.path.join(ROOT, ".bazelrc")) as f:
    return [m.group(1) for m in re.finditer(r"^build --copt=(\S+)$", f.read(), re.MULTILINE)]


def top_level_list(path, name):
  """The literal list assigned to `name` at the top of the Python/Starlark file `path`."""
  with open(os.path.join(ROOT, path)) as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and [t.id for t in node.targets] == [name]:
      return ast.literal_eval(node.value)
  raise AssertionError(f"{path} has no {name} list")


def setup_common_flags():
  return top_level_list("setup.py", "COMMON_FLAGS")


def test_both_builds_generate_code_with_the_same_flags():
  bazel = [f for f in bazel_copts() if CODEGEN.match(f)]
  pip = [f for f in setup_common_flags() if CODEGEN.match(f)]
  assert "-fno-math-errno" in bazel, bazel
  assert sorted(bazel) == sorted(pip), f".bazelrc: {bazel}, setup.py COMMON_FLAGS: {pip}"


def test_both_builds_build_plugins_with_the_same_flags():
  # Hidden symbols, and -z nodelete: NCCL 2.28+ dlcloses the plugin under its worker threads.
  bazel = "third_party/capabilities.bzl"
  assert top_level_list(bazel, "_PLUGIN_COPTS") == top_level_list("setup.py", "PLUGIN_FLAGS")
  assert "-Wl,-z,nodelete" in top_level_list(bazel, "_PLUGIN_LINKOPTS")
  assert top_level_list(bazel, "_PLUGIN_LINKOPTS") == top_level_list(
    "setup.py", "PLUGIN_LINK_FLAGS"
  )

"""The one reader of third_party/sources.bzl outside Bazel: setup.py, the build tests, the native
fuzzers and the GPU checks' build all read the source list through it.

sources.bzl's top-level `NAME = <literal>` assignments are plain Python literals (Starlark's
syntax for them is Python's), so they are read with `ast.literal_eval`, never executed.

  python3 third_party/sources_bzl.py core-sources CAPABILITY
      the core sources of CAPABILITY and of the capabilities it depends on, one per line
"""

import ast
import os
import sys

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sources.bzl")


def read(path=PATH):
  """The top-level `NAME = <literal>` assignments of the sources.bzl at `path`, by name."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  return {
    node.targets[0].id: ast.literal_eval(node.value)
    for node in tree.body
    if isinstance(node, ast.Assign)
    and len(node.targets) == 1
    and isinstance(node.targets[0], ast.Name)
  }


def core_sources(capabilities, name):
  """The core_srcs of capability `name` and of every capability it depends on (itself first)."""
  if name not in capabilities:
    raise KeyError(f"no capability {name!r} in sources.bzl (it has {sorted(capabilities)})")
  seen, todo = [], [name]
  while todo:
    current = todo.pop()
    if current not in seen:
      seen.append(current)
      todo += capabilities[current]["deps"]
  return [src for current in seen for src in capabilities[current]["core_srcs"]]


def main(argv):
  if len(argv) != 2 or argv[0] != "core-sources":
    sys.exit(__doc__)
  try:
    print("\n".join(core_sources(read()["CAPABILITIES"], argv[1])))
  except KeyError as error:
    sys.exit(f"sources_bzl.py: {error.args[0]}")


if __name__ == "__main__":
  main(sys.argv[1:])

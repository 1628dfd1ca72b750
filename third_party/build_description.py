"""The one reader, outside Bazel, of the build's description: what is compiled
(third_party/sources.bzl) and the flags that decide the generated code (.bazelrc's `build --copt`
lines). setup.py, the build tests, the native fuzzers and the GPU checks' build all read them
through it.

sources.bzl's top-level `NAME = <literal>` assignments are plain Python literals (Starlark's
syntax for them is Python's), so they are read with `ast.literal_eval`, never executed.

  python3 third_party/build_description.py core-sources CAPABILITY
      the core sources of CAPABILITY and of the capabilities it depends on, one per line
  python3 third_party/build_description.py codegen-flags
      the code-generation flags of every optimized build, on one line
"""

import ast
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "third_party", "sources.bzl")
BAZELRC = os.path.join(ROOT, ".bazelrc")
# The flags that decide the generated code (-O, -march, -f[no-]math-errno: without the latter,
# Adam's row update ran 4x slower, one square root at a time); the rest (-fPIC, -pthread,
# -DNDEBUG) are each build's own.
CODEGEN = re.compile(r"^-(O\d|march=.*|f(no-)?math-errno)$")


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


def codegen_flags(bazelrc=BAZELRC):
  """The code-generation flags of .bazelrc's `build --copt=` lines, in order: the one place they
  are declared."""
  with open(bazelrc) as f:
    copts = re.findall(r"^build --copt=(\S+)$", f.read(), re.MULTILINE)
  return [flag for flag in copts if CODEGEN.match(flag)]


def main(argv):
  if argv == ["codegen-flags"]:
    return print(" ".join(codegen_flags()))
  if len(argv) != 2 or argv[0] != "core-sources":
    sys.exit(__doc__)
  try:
    print("\n".join(core_sources(read()["CAPABILITIES"], argv[1])))
  except KeyError as error:
    sys.exit(f"build_description.py: {error.args[0]}")


if __name__ == "__main__":
  main(sys.argv[1:])

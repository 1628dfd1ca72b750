"""tf_ext's Python imports run one way, read from the import graph of tf_ext/.

The layers, bottom up:
  shared      the modules directly under tf_ext/ (settings, _ops_loader, padding, ...): they import
              only each other
  capability  tf_ext/<capability>/ for each capability of third_party/sources.bzl: it imports the
              shared modules, itself, and the capabilities in its declared `deps` (the same list
              that decides which C++ cores it may include)
  public path a package under tf_ext/ that only re-exports a capability's package under an older
              name (its __init__ calls tf_ext._public_paths.alias): it reaches that capability only
  tf_ext      tf_ext/__init__.py, the top-level API: anything
and everywhere: no circle of imports, no import inside a function or a class (a late import hides
a circle or a dependency), and no private name (`_x`) of another module.
"""

import ast
import functools
import os

import pytest
from test_capabilities import read_description

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "tf_ext"
ALIAS_MODULE = "tf_ext._public_paths"


def module_files(root):
  """{module name: path} of every .py file under <root>/tf_ext."""
  found = {}
  for dirpath, dirnames, names in os.walk(os.path.join(root, PACKAGE)):
    dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
    for name in sorted(names):
      if not name.endswith(".py"):
        continue
      path = os.path.join(dirpath, name)
      parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      found[".".join(parts)] = path
  return found


class Import:
  """One import statement's target module, and where and how it was written."""

  def __init__(self, line, target, late, private=None):
    self.line, self.target, self.late, self.private = line, target, late, private


@functools.lru_cache(maxsize=None)
def parsed(path):
  """The syntax tree of the file `path` (each file is read once, for its imports and its alias)."""
  with open(path, encoding="utf-8") as f:
    return ast.parse(f.read(), path)


def _package_of(module, modules):
  """The package a module's relative imports start from."""
  path = modules[module]
  return module if os.path.basename(path) == "__init__.py" else module.rpartition(".")[0]


def imports_of(module, modules):
  """Every import of a tf_ext module in `module`, each target resolved to the module it loads:
  `from a.b import c` loads a.b.c where that is a module, else a.b (and c is a name of it)."""
  tree = parsed(modules[module])
  top_level = set(map(id, tree.body))
  module_aliases = {}  # a local name bound to a tf_ext module -> that module
  found = []
  for node in ast.walk(tree):
    late = id(node) not in top_level
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] == PACKAGE:
          found.append(Import(node.lineno, alias.name, late))
          if alias.asname:
            module_aliases[alias.asname] = alias.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = _package_of(module, modules).split(".")
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
      if base.split(".")[0] != PACKAGE:
        continue
      for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in modules:
          found.append(Import(node.lineno, submodule, late))
          module_aliases[alias.asname or alias.name] = submodule
        else:
          private = alias.name if alias.name.startswith("_") else None
          found.append(Import(node.lineno, base, late, private))
  # `module_alias._name`: a private name of another module.
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in module_aliases
      and node.attr.startswith("_")
      and not node.attr.startswith("__")
      and f"{module_aliases[node.value.id]}.{node.attr}" not in modules
    ):
      found.append(Import(node.lineno, module_aliases[node.value.id], False, node.attr))
  return found


def alias_target(module, modules):
  """The package that a public-path package re-exports (its `_public_paths.alias` call), or None."""
  for node in ast.walk(parsed(modules[module])):
    if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == "alias"
      and len(node.args) == 2
      and isinstance(node.args[1], ast.Constant)
    ):
      return node.args[1].value
  return None


def layer_of(module, capabilities, aliases, shared):
  """("tf_ext"|"shared"|"capability"|"public path"|"unknown", capability or None)."""
  parts = module.split(".")
  if module == PACKAGE:
    return "tf_ext", None
  top = ".".join(parts[:2])
  if top in aliases:
    return "public path", layer_of(aliases[top], capabilities, {}, shared)[1]
  if parts[1] in capabilities:
    return "capability", parts[1]
  if module in shared:
    return "shared", None
  return "unknown", None


def find_cycles(edges):
  """The strongly connected components of more than one module (or with a self-import)."""
  index, low, on_stack, stack, cycles = {}, {}, set(), [], []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for succ in sorted(edges.get(node, ())):
      if succ not in index:
        visit(succ)
        low[node] = min(low[node], low[succ])
      elif succ in on_stack:
        low[node] = min(low[node], index[succ])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1 or node in edges.get(node, ()):
        cycles.append(sorted(component))

  for node in sorted(edges):
    if node not in index:
      visit(node)
  return cycles


def declared_order_problems(capabilities):
  """Capability deps that are unknown or form a circle (sources.bzl is the one declaration)."""
  problems = []
  deps = {name: set(c["deps"]) for name, c in capabilities.items()}
  for name, wanted in deps.items():
    for dep in sorted(wanted - set(deps)):
      problems.append(f"sources.bzl: capability {name} depends on unknown capability {dep}")
  for cycle in find_cycles({name: wanted & set(deps) for name, wanted in deps.items()}):
    problems.append(f"sources.bzl: the capabilities' deps form a circle: {' -> '.join(cycle)}")
  return problems


def check(root):
  """Every problem of the import graph of <root>/tf_ext, as readable lines."""
  capabilities, _ = read_description(root)
  problems = declared_order_problems(capabilities)
  modules = module_files(root)
  aliases = {}
  for module in modules:
    target = alias_target(module, modules)
    if target is not None and module.count(".") == 1:
      aliases[module] = target
  # Shared modules are files directly under tf_ext/ (a package there is a capability or a path).
  shared = {
    m for m, path in modules.items() if m.count(".") == 1 and not path.endswith("__init__.py")
  }
  edges = {}
  for module in sorted(modules):
    layer, capability = layer_of(module, capabilities, aliases, shared)
    where = f"{os.path.relpath(modules[module], root)}"
    if layer == "unknown":
      problems.append(
        f"{where}: {module} is in no capability of sources.bzl and is not a shared module"
      )
      continue
    for imp in imports_of(module, modules):
      at = f"{where}:{imp.line}"
      if imp.target not in modules:
        problems.append(f"{at} imports {imp.target}, which is not a module of the tree")
        continue
      if imp.target != module:
        edges.setdefault(module, set()).add(imp.target)
      if imp.late:
        problems.append(
          f"{at}: a late import of {imp.target} (inside a function or class): import it at the "
          "top, or move what both need below both"
        )
      if imp.private:
        problems.append(f"{at} uses {imp.target}.{imp.private}, a private name of another module")
      problem = crossing(
        layer,
        capability,
        imp.target,
        layer_of(imp.target, capabilities, aliases, shared),
        capabilities,
      )
      if problem:
        problems.append(f"{at} ({layer} {capability or ''}): {problem}".replace(" )", ")"))
    if module in aliases:
      edges.setdefault(module, set()).add(aliases[module])
  for cycle in find_cycles(edges):
    problems.append(f"import circle: {' -> '.join(cycle)}")
  return problems


def crossing(layer, capability, target, target_place, capabilities):
  """Why a module of (layer, capability) may not import `target`, of (target_layer,
  target_capability), or None."""
  target_layer, target_capability = target_place
  if layer == "tf_ext":
    return None
  if layer == "public path":
    if target == ALIAS_MODULE or target_capability == capability:
      return None
    return f"imports {target}: a public path re-exports its capability ({capability}) only"
  if target_layer == "shared":
    return None
  if layer == "shared":
    return f"imports {target}: a shared module imports only other shared modules"
  if target_layer == "public path":
    return f"imports {target}, a public path: import the capability's own module"
  if target_layer == "tf_ext":
    return f"imports {target}: the top-level API is above every capability"
  if target_capability == capability or target_capability in capabilities[capability]["deps"]:
    return None
  return (
    f"imports {target} of capability {target_capability}: declare {target_capability!r} in "
    f"the deps of {capability!r} in third_party/sources.bzl, or move what both need to a "
    "shared module"
  )


def test_the_import_graph_runs_one_way():
  problems = check(ROOT)
  assert not problems, "\n".join(problems)


# A small tree of two capabilities, to show that the check fails where it should.
SOURCES_BZL = """
CAPABILITIES = {
    "a": {"core_hdrs": [], "core_srcs": [], "kernel_hdrs": [], "kernel_srcs": [], "op_srcs": [],
          "deps": A_DEPS},
    "b": {"core_hdrs": [], "core_srcs": [], "kernel_hdrs": [], "kernel_srcs": [], "op_srcs": [],
          "deps": B_DEPS},
}
OP_LIBRARY = {"path": "tf_ext/ops.so", "srcs": []}
"""

CLEAN_TREE = {
  "tf_ext/__init__.py": "from tf_ext import a, b, old_a\nfrom tf_ext.a.api import run\n",
  "tf_ext/settings.py": "",
  "tf_ext/_loader.py": "from tf_ext import settings\n",
  "tf_ext/_public_paths.py": "",
  "tf_ext/a/__init__.py": "from tf_ext.a.api import run\n",
  "tf_ext/a/api.py": (
    "from tf_ext import _loader\nfrom tf_ext.a import util\nfrom tf_ext.b import core\n"
  ),
  "tf_ext/a/util.py": "import tf_ext.settings\n",
  "tf_ext/b/__init__.py": "",
  "tf_ext/b/core.py": "from tf_ext.settings import get\n",
  "tf_ext/old_a/__init__.py": (
    'from tf_ext import _public_paths\n\n_public_paths.alias(__name__, "tf_ext.a")\n'
  ),
}


def make_tree(root, a_deps, b_deps, extra=None):
  files = dict(CLEAN_TREE, **(extra or {}))
  files["third_party/sources.bzl"] = SOURCES_BZL.replace("A_DEPS", repr(a_deps)).replace(
    "B_DEPS", repr(b_deps)
  )
  for path, text in files.items():
    os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as f:
      f.write(text)


def test_a_clean_tree_passes(tmp_path):
  make_tree(tmp_path, ["b"], [])
  assert check(str(tmp_path)) == []


@pytest.mark.parametrize(
  "a_deps,b_deps,extra,expected",
  [
    # a capability importing another that it does not declare
    ([], [], {}, "declare 'b' in the deps of 'a'"),
    # a circle inside a capability
    (["b"], [], {"tf_ext/a/util.py": "from tf_ext.a import api\n"}, "import circle"),
    # a submodule importing a name of its own package, which imports it
    (["b"], [], {"tf_ext/a/util.py": "from tf_ext.a import run\n"}, "import circle"),
    # a late import hiding a circle
    (
      ["b"],
      [],
      {"tf_ext/a/util.py": "def f():\n  from tf_ext.a import api\n  return api\n"},
      "a late import of tf_ext.a.api",
    ),
    # a shared module reaching up into a capability
    (["b"], [], {"tf_ext/settings.py": "from tf_ext.b import core\n"}, "imports only other shared"),
    # a private name of another module, imported or used
    (["b"], [], {"tf_ext/a/util.py": "from tf_ext.b.core import _hidden\n"}, "a private name"),
    (
      ["b"],
      [],
      {"tf_ext/a/util.py": "from tf_ext.b import core\n\nx = core._hidden\n"},
      "tf_ext.b.core._hidden, a private name",
    ),
    # a capability importing through a public path, or the top-level API
    (["b"], [], {"tf_ext/b/core.py": "from tf_ext import old_a\n"}, "a public path"),
    (["b"], [], {"tf_ext/b/core.py": "import tf_ext\n"}, "the top-level API"),
    # a public path that reaches beyond its capability
    (
      ["b"],
      [],
      {"tf_ext/old_a/__init__.py": CLEAN_TREE["tf_ext/old_a/__init__.py"] + "import tf_ext.b\n"},
      "re-exports its capability (a) only",
    ),
    # a package that is neither a capability nor a public path
    (["b"], [], {"tf_ext/c/__init__.py": ""}, "in no capability"),
    # declared deps in a circle
    (["b"], ["a"], {}, "deps form a circle"),
  ],
)
def test_a_wrong_import_is_reported(tmp_path, a_deps, b_deps, extra, expected):
  make_tree(tmp_path, a_deps, b_deps, extra)
  problems = check(str(tmp_path))
  assert any(expected in p for p in problems), problems

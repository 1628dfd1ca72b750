"""One name per capability: each capability of third_party/sources.bzl has its Python package
tf_ext/<name>, its tests tests/<name>, its C++ under kernels/<name> (and ops/<name>_*.cc), its
C++ tests under tests/kernels/<name>, its page docs/<name>.md and its settings tagged <name> in
tf_ext/settings.py; and nothing else sits at those places under another name."""

import os

import pytest
from test_capabilities import read_description

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Folders of tests/ that test the house rather than one capability.
HOUSE_TESTS = {
  "build": "the build, the layout and the import graph",
  "benchmarks": "the benchmark scripts",
  "compat": "restoring what earlier versions of tf_ext wrote",
  "docs": "the README and docs/",
  "examples": "examples/",
  "fuzz": "every op fuzzed from Python, the native fuzzers' runner, and the crashes they found",
  "kernels": "googletest of the C++ cores, one folder per capability",
}
# The settings of the package itself (loading, set-up) carry this tag.
PACKAGE_TAG = "tf_ext"


def has_tests(folder):
  for _, _, names in os.walk(folder):
    if any(n.startswith("test_") and n.endswith(".py") or n.endswith("_test.cc") for n in names):
      return True
  return False


def subfolders(path):
  if not os.path.isdir(path):
    return []
  return sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n)))


def check(root, setting_tags):
  """Every place where the tree at `root` names a capability otherwise than sources.bzl does."""
  capabilities, _ = read_description(root)
  problems = []
  for name, capability in capabilities.items():
    if not os.path.isfile(os.path.join(root, "tf_ext", name, "__init__.py")):
      problems.append(f"capability {name} has no Python package tf_ext/{name}/")
    if not has_tests(os.path.join(root, "tests", name)):
      problems.append(f"capability {name} has no tests in tests/{name}/")
    if not os.path.isfile(os.path.join(root, "docs", f"{name}.md")):
      problems.append(f"capability {name} has no page docs/{name}.md")
    plugin = capability.get("plugin") or {}
    cc = capability["core_srcs"] + capability["kernel_srcs"] + plugin.get("srcs", [])
    if cc and not has_tests(os.path.join(root, "tests", "kernels", name)):
      problems.append(f"capability {name} has C++ but no googletest in tests/kernels/{name}/")
    for path in (
      capability["core_hdrs"]
      + capability["core_srcs"]
      + capability["kernel_hdrs"]
      + capability["kernel_srcs"]
      + plugin.get("srcs", [])
    ):
      if not path.startswith(f"kernels/{name}/"):
        problems.append(f"{path} belongs to capability {name}: it goes under kernels/{name}/")
    for path in capability["op_srcs"]:
      if not (path.startswith(f"ops/{name}_") and path.endswith(".cc")):
        problems.append(f"{path} belongs to capability {name}: name it ops/{name}_*.cc")
  for folder in subfolders(os.path.join(root, "kernels")):
    if folder not in capabilities:
      problems.append(f"kernels/{folder}/ is not a capability of sources.bzl")
  for folder in subfolders(os.path.join(root, "tests")):
    if folder not in capabilities and folder not in HOUSE_TESTS and folder != "__pycache__":
      problems.append(
        f"tests/{folder}/ is neither a capability of sources.bzl nor one of {sorted(HOUSE_TESTS)}"
      )
  unknown = sorted(set(setting_tags) - set(capabilities) - {PACKAGE_TAG})
  untagged = sorted(set(capabilities) - set(setting_tags))
  if unknown:
    problems.append(f"tf_ext/settings.py tags settings with {unknown}: not capabilities")
  if untagged:
    problems.append(f"tf_ext/settings.py has no capability tag for {untagged}")
  return problems


def test_every_capability_has_one_name_everywhere():
  from tf_ext import settings

  assert check(ROOT, settings.CAPABILITIES) == []


SOURCES_BZL = """
CAPABILITIES = {
    "a": {"core_hdrs": ["kernels/a/core/a.h"], "core_srcs": ["kernels/a/core/a.cc"],
          "kernel_hdrs": [], "kernel_srcs": ["kernels/a/a_kernels.cc"],
          "op_srcs": ["ops/a_ops.cc"], "deps": []},
    "b": {"core_hdrs": [], "core_srcs": [], "kernel_hdrs": [], "kernel_srcs": [], "op_srcs": [],
          "deps": []},
}
OP_LIBRARY = {"path": "tf_ext/ops.so", "srcs": []}
"""

CLEAN_TREE = {
  "third_party/sources.bzl": SOURCES_BZL,
  "tf_ext/a/__init__.py": "",
  "tf_ext/b/__init__.py": "",
  "kernels/a/core/a.h": "",
  "tests/a/test_a.py": "",
  "tests/b/nested/test_b.py": "",
  "tests/kernels/a/a_test.cc": "",
  "tests/build/test_layout.py": "",
  "docs/a.md": "",
  "docs/b.md": "",
}


def make_tree(root, replace=None, drop=()):
  files = {k: v for k, v in dict(CLEAN_TREE, **(replace or {})).items() if k not in drop}
  for path, text in files.items():
    os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(root, path), "w") as f:
      f.write(text)


def test_a_clean_tree_passes(tmp_path):
  make_tree(tmp_path)
  assert check(str(tmp_path), ["tf_ext", "a", "b"]) == []


@pytest.mark.parametrize(
  "replace,drop,tags,expected",
  [
    ({}, ["tf_ext/b/__init__.py"], None, "no Python package tf_ext/b/"),
    ({}, ["tests/b/nested/test_b.py"], None, "no tests in tests/b/"),
    ({}, ["docs/a.md"], None, "no page docs/a.md"),
    ({}, ["tests/kernels/a/a_test.cc"], None, "no googletest in tests/kernels/a/"),
    ({"kernels/old_a/x.h": ""}, [], None, "kernels/old_a/ is not a capability"),
    ({"tests/old_a/test_x.py": ""}, [], None, "tests/old_a/ is neither a capability"),
    (
      {
        "third_party/sources.bzl": SOURCES_BZL.replace('"kernels/a/a_kernels.cc"', '"kernels/x.cc"')
      },
      [],
      None,
      "it goes under kernels/a/",
    ),
    (
      {"third_party/sources.bzl": SOURCES_BZL.replace("ops/a_ops.cc", "ops/other_ops.cc")},
      [],
      None,
      "name it ops/a_*.cc",
    ),
    ({}, [], ["tf_ext", "a", "b", "amp"], "tags settings with ['amp']"),
    ({}, [], ["tf_ext", "a"], "no capability tag for ['b']"),
  ],
)
def test_another_name_is_reported(tmp_path, replace, drop, tags, expected):
  make_tree(tmp_path, replace, drop)
  problems = check(str(tmp_path), tags or ["tf_ext", "a", "b"])
  assert any(expected in p for p in problems), problems

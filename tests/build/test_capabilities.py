"""The per-capability build: third_party/sources.bzl describes every C++ file, and each file
includes only what its capability may reach. The op library's common headers (TensorFlow helpers
shared by several capabilities) are reachable from every capability's kernels and ops, and from
nothing TensorFlow-free; they reach no capability themselves.

Bazel enforces the same boundary when it compiles (each target sees only its declared headers);
this check is fast, runs without Bazel, and also covers what Bazel cannot see: files that no
target lists, and tests that link one core but include another's.
"""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "third_party"))
import build_description  # noqa: E402  (the one reader of sources.bzl)

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.MULTILINE)
# What only TensorFlow's headers provide (a core or a plugin must not include any of it).
TENSORFLOW_PREFIXES = (
  "tensorflow/",
  "tsl/",
  "xla/",
  "absl/",
  "Eigen/",
  "unsupported/Eigen/",
  "third_party/eigen3/",
  "google/protobuf/",
)
PROJECT_PREFIXES = ("kernels/", "ops/")
# C++ tests that run a graph pass with TensorFlow (tests/defs.bzl, capability_tf_tests).
TF_TEST_SUFFIXES = ("_tf_test.cc", "_tf_test.h")


def read_description(root):
  """CAPABILITIES and OP_LIBRARY of the sources.bzl of the tree at `root`, read as setup.py reads
  them."""
  values = build_description.read(os.path.join(root, "third_party", "sources.bzl"))
  return values["CAPABILITIES"], values["OP_LIBRARY"]


def owners(capabilities, op_library):
  """path -> (capability, part); part is core, kernels, ops or plugin; (None, "common") for the
  op library's own sources and (None, "common header") for its common headers. Also the problems
  found on the way (duplicates, unknown deps)."""
  owner, problems = {}, []

  def add(path, capability, part):
    if path in owner:
      problems.append(f"{path} is listed twice in sources.bzl ({owner[path]} and {capability})")
    owner[path] = (capability, part)

  for name, capability in capabilities.items():
    plugin = capability.get("plugin") or {}
    for part, files in (
      ("core", capability["core_hdrs"] + capability["core_srcs"]),
      # The CUDA sources and their fallback belong to the core: TensorFlow-free too.
      (
        "core",
        capability.get("cuda_srcs", [])
        + capability.get("cuda_hdrs", [])
        + capability.get("cuda_fallback_srcs", []),
      ),
      ("kernels", capability["kernel_hdrs"] + capability["kernel_srcs"]),
      ("ops", capability["op_srcs"]),
      ("plugin", plugin.get("srcs", [])),
    ):
      for path in files:
        add(path, name, part)
    for dep in capability["deps"]:
      if dep not in capabilities or dep == name:
        problems.append(f"capability {name} declares dep {dep!r}, which is not another capability")
  for path in op_library["srcs"]:
    add(path, None, "common")
  for path in op_library["hdrs"]:
    add(path, None, "common header")
  return owner, problems


def includes(path):
  with open(path, errors="replace") as f:
    return INCLUDE.findall(f.read())


def include_problem(capabilities, owner, path, capability, part, included):
  """Why `path` (of `capability`, `part`) may not include `included`, or None when it may."""
  where = f"{path} ({part} of {capability})" if capability else f"{path} (op library)"
  if included.startswith(TENSORFLOW_PREFIXES):
    if part in ("core", "plugin", "test"):
      return f"{where} includes {included}: a core, a plugin and its tests are TensorFlow-free"
    return None
  if not included.startswith(PROJECT_PREFIXES):
    return None  # the C++ library, gtest, the system
  if included not in owner:
    return f"{where} includes {included}, which no capability in sources.bzl lists"
  other, other_part = owner[included]
  if other_part == "common header":
    if part in ("core", "plugin", "test"):
      return (
        f"{where} includes {included}, a common header of the op library: only kernels and ops"
        " may (cores, plugins and their tests are TensorFlow-free)"
      )
    return None
  if other_part not in ("core", "kernels"):
    return f"{where} includes {included}, a source file ({other_part} of {other}), not a header"
  if part == "common header":
    return (
      f"{where} includes {included} of capability {other}: a common header of the op library is"
      " shared by every capability and reaches none"
    )
  if capability is None:  # the op library's own sources link every capability
    return None
  if other == capability:
    if other_part == "kernels" and part in ("core", "plugin", "test"):
      return f"{where} includes {included}: the TensorFlow kernels of its own capability"
    return None
  if other not in capabilities[capability]["deps"]:
    return (
      f"{where} includes {included} of capability {other}: declare {other!r} in the deps of "
      f"{capability!r} in third_party/sources.bzl (only its core is then reachable)"
    )
  if other_part != "core":
    return f"{where} includes {included}: only the core of a dependency ({other}) is reachable"
  return None


def check(root):
  """Every problem of the tree at `root` with its sources.bzl, as readable lines."""
  capabilities, op_library = read_description(root)
  owner, problems = owners(capabilities, op_library)
  for path in sorted(owner):
    if not os.path.isfile(os.path.join(root, path)):
      problems.append(f"{path} is listed in sources.bzl but does not exist")
  for top in ("kernels", "ops"):
    for dirpath, _, names in os.walk(os.path.join(root, top)):
      for name in names:
        path = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
        if path not in owner:
          problems.append(f"{path} is in no capability: add it to third_party/sources.bzl")
  for path, (capability, part) in sorted(owner.items(), key=lambda item: item[0]):
    if os.path.isfile(os.path.join(root, path)):
      for included in includes(os.path.join(root, path)):
        problems.append(include_problem(capabilities, owner, path, capability, part, included))
  # C++ tests: tests/kernels/<capability>/ links only that capability's core (tests/defs.bzl);
  # those that run a graph pass (*_tf_test.cc, and their *_tf_test.h helpers) link TensorFlow and
  # the op library's kernels, and include what their capability's kernels may.
  tests_dir = os.path.join(root, "tests", "kernels")
  for dirpath, _, names in os.walk(tests_dir):
    for name in names:
      if not name.endswith((".cc", ".h")):
        continue
      path = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
      capability = path.split("/")[2] if path.count("/") >= 3 else None
      if capability not in capabilities:
        problems.append(
          f"{path} is not under tests/kernels/<capability>/ (capabilities: {list(capabilities)}),"
          " so no cc_test is generated for it"
        )
        continue
      part = "tf test" if name.endswith(TF_TEST_SUFFIXES) else "test"
      for included in includes(os.path.join(root, path)):
        problem = include_problem(capabilities, owner, path, capability, part, included)
        if (
          problem is None
          and part == "test"
          and included in owner
          and owner[included][1] == "kernels"
        ):
          problem = f"{path} includes {included}: C++ tests link only TensorFlow-free cores"
        problems.append(problem)
  return [p for p in problems if p]


def test_the_tree_keeps_its_capability_boundaries():
  problems = check(ROOT)
  assert not problems, "\n".join(problems)


def test_makefile_copies_every_library_that_bazel_builds():
  capabilities, op_library = read_description(ROOT)
  expected = [op_library["path"]] + [
    c["plugin"]["path"] for c in capabilities.values() if c.get("plugin")
  ]
  with open(os.path.join(ROOT, "Makefile")) as f:
    found = re.search(r"^LIBRARIES\s*:=\s*(.*)$", f.read(), re.MULTILINE)
  assert found and found.group(1).split() == expected


# A two-capability tree to show that the check fails where it should.
SOURCES_BZL = """
CAPABILITIES = {
    "a": {
        "core_hdrs": ["kernels/a/core/a.h"], "core_srcs": ["kernels/a/core/a.cc"],
        "kernel_hdrs": ["kernels/a/a_kernel.h"], "kernel_srcs": ["kernels/a/a_kernels.cc"],
        "op_srcs": ["ops/a_ops.cc"], "deps": DEPS,
    },
    "b": {
        "core_hdrs": ["kernels/b/core/b.h"], "core_srcs": ["kernels/b/core/b.cc"],
        "kernel_hdrs": ["kernels/b/b_kernel.h"], "kernel_srcs": ["kernels/b/b_kernels.cc"],
        "op_srcs": ["ops/b_ops.cc"], "deps": [],
    },
}
OP_LIBRARY = {"path": "x/ops.so", "srcs": ["kernels/build_info.cc"], "hdrs": ["kernels/common.h"]}
"""


def make_tree(root, deps, extra=None):
  files = {
    "kernels/a/core/a.h": "",
    "kernels/a/core/a.cc": '#include "kernels/a/core/a.h"\n',
    "kernels/a/a_kernel.h": '#include "tensorflow/core/framework/op_kernel.h"\n',
    "kernels/a/a_kernels.cc": '#include "kernels/a/a_kernel.h"\n#include "kernels/a/core/a.h"\n',
    "ops/a_ops.cc": '#include "tensorflow/core/framework/op.h"\n',
    "kernels/b/core/b.h": "#include <vector>\n",
    "kernels/b/core/b.cc": '#include "kernels/b/core/b.h"\n',
    "kernels/b/b_kernel.h": "",
    "kernels/b/b_kernels.cc": '#include "kernels/b/core/b.h"\n',
    "ops/b_ops.cc": "",
    "kernels/build_info.cc": '#include "tensorflow/core/public/version.h"\n',
    "kernels/common.h": '#include "tensorflow/core/graph/graph.h"\n',
    "tests/kernels/a/a_test.cc": '#include "kernels/a/core/a.h"\n#include <gtest/gtest.h>\n',
    "third_party/sources.bzl": SOURCES_BZL.replace("DEPS", repr(deps)),
  }
  for path, text in dict(files, **(extra or {})).items():
    os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(root, path), "a") as f:
      f.write(text)


def test_a_clean_tree_passes(tmp_path):
  make_tree(
    tmp_path,
    deps=["b"],
    extra={
      "kernels/a/a_kernels.cc": '#include "kernels/b/core/b.h"\n#include "kernels/common.h"\n',
      "ops/b_ops.cc": '#include "kernels/common.h"\n',
    },
  )
  assert check(str(tmp_path)) == []


@pytest.mark.parametrize(
  "deps,extra,expected",
  [
    # kernels reaching another capability's core without declaring it
    ([], {"kernels/a/a_kernels.cc": '#include "kernels/b/core/b.h"\n'}, "declare 'b' in the deps"),
    # a declared dependency opens its core only
    (["b"], {"kernels/a/a_kernels.cc": '#include "kernels/b/b_kernel.h"\n'}, "only the core"),
    # a core with TensorFlow in it
    (
      [],
      {"kernels/a/core/a.cc": '#include "tensorflow/core/lib/core/status.h"\n'},
      "TensorFlow-free",
    ),
    ([], {"kernels/a/core/a.h": "#include <absl/strings/str_cat.h>\n"}, "TensorFlow-free"),
    # a core reaching its own or another capability's kernels
    ([], {"kernels/a/core/a.cc": '#include "kernels/a/a_kernel.h"\n'}, "TensorFlow kernels"),
    (["b"], {"kernels/a/core/a.h": '#include "kernels/b/b_kernel.h"\n'}, "only the core"),
    # a file nobody lists, and an include of it
    ([], {"kernels/a/forgotten.cc": ""}, "kernels/a/forgotten.cc is in no capability"),
    ([], {"ops/a_ops.cc": '#include "kernels/a/missing.h"\n'}, "which no capability"),
    # a C++ test outside its capability's folder, or reaching another core
    ([], {"tests/kernels/c_test.cc": ""}, "not under tests/kernels/<capability>/"),
    ([], {"tests/kernels/a/a_test.cc": '#include "kernels/b/core/b.h"\n'}, "declare 'b'"),
    # the op library's common headers: for kernels and ops only, and reaching no capability
    ([], {"kernels/a/core/a.cc": '#include "kernels/common.h"\n'}, "only kernels and ops"),
    ([], {"tests/kernels/a/a_test.cc": '#include "kernels/common.h"\n'}, "only kernels and ops"),
    # a test that runs a pass may include TensorFlow and its kernels, but no other capability's
    (
      [],
      {"tests/kernels/a/p_tf_test.cc": '#include "kernels/b/b_kernel.h"\n'},
      "declare 'b' in the deps",
    ),
    (["b"], {"tests/kernels/a/p_tf_test.cc": '#include "kernels/b/b_kernel.h"\n'}, "only the core"),
    ([], {"kernels/common.h": '#include "kernels/a/core/a.h"\n'}, "reaches none"),
  ],
)
def test_a_crossing_is_reported(tmp_path, deps, extra, expected):
  make_tree(tmp_path, deps, extra)
  problems = check(str(tmp_path))
  assert any(expected in p for p in problems), problems


def test_a_test_that_runs_a_pass_may_include_tensorflow_and_its_kernels(tmp_path):
  make_tree(
    tmp_path,
    deps=[],
    extra={
      "tests/kernels/a/p_tf_test.cc": (
        '#include "kernels/a/a_kernel.h"\n#include "kernels/common.h"\n'
        '#include "tensorflow/core/graph/graph.h"\n#include "tests/kernels/a/p_tf_test.h"\n'
      ),
      "tests/kernels/a/p_tf_test.h": '#include "tensorflow/core/graph/graph.h"\n',
    },
  )
  assert check(str(tmp_path)) == []


def test_a_listed_file_that_does_not_exist_is_reported(tmp_path):
  make_tree(tmp_path, deps=[])
  os.remove(tmp_path / "kernels" / "b" / "core" / "b.cc")
  assert "kernels/b/core/b.cc is listed in sources.bzl but does not exist" in check(str(tmp_path))

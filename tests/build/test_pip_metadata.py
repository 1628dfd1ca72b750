"""`pip install -e .` stays fast in a tree that Bazel has built.

Bazel's convenience links (bazel-bin, bazel-out, ...) lead into its output tree and on, through
external repositories, to /usr. setuptools' package discovery once followed them (namespace
packages, the pyproject default) and `pip install -e .` ran for over 18 minutes in
prepare_metadata_for_build_editable. This builds the metadata of a copy of the packaging files
with such a link, as pip does.
"""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What setup.py and pyproject.toml read when pip asks for the metadata.
PACKAGING = [".bazelrc", "pyproject.toml", "setup.py", "MANIFEST.in", "requirements-bench.txt"]
TREES = ["tf_ext", "kernels", "ops", "third_party"]
METADATA = """
import sys
from setuptools import build_meta
print(build_meta.prepare_metadata_for_build_editable(sys.argv[1]))
"""


def copy_project(target):
  for name in PACKAGING:
    shutil.copy(os.path.join(ROOT, name), target / name)
  for name in TREES:
    shutil.copytree(
      os.path.join(ROOT, name),
      target / name,
      ignore=shutil.ignore_patterns("*.so", "__pycache__", "BUILD", "*.bzl", "*.tpl")
      if name != "third_party"
      else shutil.ignore_patterns("__pycache__"),
    )


def test_editable_metadata_ignores_bazel_links(tmp_path):
  project, out = tmp_path / "project", tmp_path / "metadata"
  project.mkdir()
  out.mkdir()
  copy_project(project)
  # What Bazel leaves in a checkout, in effect: links into a huge tree (with cycles: /usr/bin/X11).
  for link in ("bazel-out", "bazel-bin", "bazel-project"):
    os.symlink("/usr", project / link)
  proc = subprocess.run(
    [sys.executable, "-c", METADATA, str(out)],
    cwd=project,
    env=dict(os.environ, PYTHONPATH=""),
    capture_output=True,
    text=True,
    timeout=120,  # a hang guard: this takes seconds; before the fix it ran for many minutes
  )
  assert proc.returncode == 0, proc.stderr
  dist_info = out / proc.stdout.split()[-1]
  assert (dist_info / "METADATA").read_text().startswith("Metadata-Version")

  # Every Python file of the package is in it: namespaces = false drops directories without an
  # __init__.py, so a new subpackage must have one.
  listed = set((out / "tf_ext.egg-info" / "SOURCES.txt").read_text().split())
  package = [
    os.path.relpath(os.path.join(d, f), project).replace(os.sep, "/")
    for d, _, files in os.walk(project / "tf_ext")
    for f in files
    if f.endswith(".py")
  ]
  assert package and not [p for p in package if p not in listed], sorted(set(package) - listed)

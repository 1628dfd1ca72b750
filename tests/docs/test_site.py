"""The docs site builds in strict mode, and the API reference check (docs/hooks) holds.

The strict build fails on a broken link or anchor, an unresolved cross-reference, a docstring
griffe cannot parse, a public name without a docstring or missing from the reference, and a
reference path that does not import. The check's own failure cases run on a small package made
here.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from _code_blocks import ROOT

HOOK = os.path.join(ROOT, "docs", "hooks", "public_api.py")


def load_hook():
  spec = importlib.util.spec_from_file_location("public_api", HOOK)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def pages(directory):
  found = {}
  for folder, _, files in os.walk(directory):
    for file in files:
      if file.endswith(".md"):
        with open(os.path.join(folder, file)) as f:
          found[os.path.relpath(os.path.join(folder, file), directory)] = f.read()
  return found


def test_site_builds_in_strict_mode(tmp_path):
  site = tmp_path / "site"
  proc = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    + ["--config-file", os.path.join(ROOT, "mkdocs.yml")],
    env=dict(os.environ, PYTHONPATH=ROOT, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3"),
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-6000:]
  jit = (site / "api" / "jit.html").read_text()
  assert 'id="tf_ext.jit.Bucketing"' in jit and 'id="tf_ext.jit.function.function"' in jit
  lightcc = (site / "api" / "lightcc.html").read_text()
  assert "https://horovod.readthedocs.io/" in lightcc and "<code>allgather</code>" in lightcc
  assert "external-names" not in lightcc  # every marker was replaced
  assert not os.path.exists(site / "hooks")  # the hook is not published


def test_every_documented_name_imports():
  hook = load_hook()
  paths = [
    (page, path, heading)
    for page, text in sorted(pages(os.path.join(ROOT, "docs")).items())
    for path, heading in hook.directives(text)
  ]
  assert len(paths) > 50
  for page, path, heading in paths:
    obj = hook.resolve_defined(path)
    if heading:
      assert hook.resolve(heading) is obj, (page, heading, path)


def test_the_reference_covers_every_public_name_with_a_docstring():
  hook = load_hook()
  report = hook.check(hook.ROOTS, ROOT, pages(os.path.join(ROOT, "docs")))
  assert report.errors == []
  horovod = report.external["tf_ext.lightcc"]["horovod.tensorflow"]
  assert "allgather" in horovod and "init" not in horovod  # LightCC's own init is documented


FIXTURE = {
  "__init__.py": '''
    """A package for the check's failure cases."""
    from docs_check_fixture import sub
    from docs_check_fixture.function import function
    from docs_check_fixture.impl import CONSTANT, UNDOCUMENTED_CONSTANT, documented, undocumented
    from os.path import join

    __all__ = [
      "CONSTANT", "UNDOCUMENTED_CONSTANT", "documented", "function", "join", "sub", "undocumented",
    ]
  ''',
  "function.py": '''
    """A module whose function of the same name shadows it in the package (griffe's blind spot)."""

    def function():
      pass
  ''',
  "impl.py": '''
    CONSTANT = "value"
    """A constant's docstring: the string under its assignment."""
    UNDOCUMENTED_CONSTANT = 2

    def documented():
      """Documented."""

    def undocumented():
      pass
  ''',
  "sub.py": '''
    """A public module without __all__."""
  ''',
}


@pytest.fixture
def fixture_package(tmp_path, monkeypatch):
  package = tmp_path / "docs_check_fixture"
  package.mkdir()
  for name, source in FIXTURE.items():
    (package / name).write_text(textwrap.dedent(source).lstrip())
  monkeypatch.syspath_prepend(str(tmp_path))
  yield str(tmp_path)
  for name in [m for m in sys.modules if m.split(".")[0] == "docs_check_fixture"]:
    del sys.modules[name]


def test_the_check_fails_on_missing_docstrings_and_references(fixture_package):
  hook = load_hook()
  page = textwrap.dedent("""
    # Reference

    ::: docs_check_fixture.CONSTANT

    ::: docs_check_fixture.documented
        options:
          heading: docs_check_fixture.undocumented

    ::: docs_check_fixture.function.function
        options:
          heading: docs_check_fixture.function

    ::: docs_check_fixture.gone
  """)
  report = hook.check(("docs_check_fixture",), fixture_package, {"api.md": page})
  assert report.errors == [
    "api.md: the heading `docs_check_fixture.undocumented` names another object than "
    "`docs_check_fixture.documented`",
    "api.md: `docs_check_fixture.gone` does not import "
    "(module 'docs_check_fixture' has no attribute 'gone')",
    "docs_check_fixture re-exports 1 names from another package, but no page has "
    "<!-- external-names: docs_check_fixture -->",
    "docs_check_fixture.sub has no __all__ (its public names)",
    "public names without a docstring: docs_check_fixture.UNDOCUMENTED_CONSTANT, "
    "docs_check_fixture.function, docs_check_fixture.undocumented",
    "public names on no reference page (add a `::: path` block): "
    "docs_check_fixture.UNDOCUMENTED_CONSTANT, docs_check_fixture.sub, "
    "docs_check_fixture.undocumented",
  ]
  assert report.external == {"docs_check_fixture": {"os.path": ["join"]}}


def test_the_check_passes_a_complete_reference(fixture_package):
  hook = load_hook()
  for name in ("function.py", "impl.py", "sub.py", "__init__.py"):
    path = os.path.join(fixture_package, "docs_check_fixture", name)
    with open(path) as f:
      source = f.read()
    source = source.replace("  pass\n", '  """Documented now."""\n')
    source = source.replace(
      "UNDOCUMENTED_CONSTANT = 2\n", 'UNDOCUMENTED_CONSTANT = 2\n"""Two."""\n'
    )
    source = source.replace(
      '"""A public module without __all__."""\n', '"""Sub."""\n__all__ = []\n'
    )
    with open(path, "w") as f:
      f.write(source)
  page = "\n\n".join(
    f"::: docs_check_fixture.{name}"
    for name in ("CONSTANT", "UNDOCUMENTED_CONSTANT", "documented", "undocumented", "sub")
  )
  page += (
    "\n\n::: docs_check_fixture.function.function\n\n<!-- external-names: docs_check_fixture -->\n"
  )
  report = hook.check(("docs_check_fixture",), fixture_package, {"api.md": page})
  assert report.errors == []
  listed = hook.external_names_markdown(report.external["docs_check_fixture"])
  assert listed.strip() == "From `os.path`: `join`."  # no link: os is not in EXTERNAL_DOCS

"""MkDocs hook: the API reference documents every public name, and each has a docstring.

Public names are the `__all__` of each public module: the ROOTS below, and every module of the
package that a public `__all__` names (tf_ext's names its subpackages). A module without `__all__`
is an error: the reference would not know its public names.

Docstrings are read as the reference shows them: from griffe's static view of the sources (the
mkdocstrings handler renders from griffe too), so a constant's docstring is the string literal
under its assignment, and a class made by a call (a namedtuple, a config dataclass) needs one too.
The objects themselves come from importing them: a function or class is looked up in griffe where
it is defined (`__module__.__qualname__`), which also sees past griffe's one blind spot here, a
submodule shadowed by a function of the same name (`tf_ext.jit.function`).

A reference page documents an object with a `::: path` block; each path is imported and objects are
compared, so a name documented under its defining path (with `heading:` showing the public one)
counts. Every such path, and every `heading:`, must import: the reference names nothing that
`import` cannot find.

Names a module re-exports from another package (LightCC's Horovod API) are not documented again:
a page lists them where it has the marker `<!-- external-names: MODULE -->`, linked to that
package's own documentation (EXTERNAL_DOCS).

Both kinds of error stop `mkdocs build` (strict or not); tests/docs/test_site.py runs the same
check on its own bad cases.
"""

import dataclasses
import importlib
import inspect
import os
import re
import sys
import types

# Public modules that no public __all__ names: tf_ext imports neither LightCC (it imports Horovod)
# nor HARP, and LightCC loads its Keras module on first use.
ROOTS = ("tf_ext", "tf_ext.lightcc", "tf_ext.lightcc.keras", "tf_ext.harp")

# Documentation of the packages whose names public modules re-export: top-level package ->
# (title, URL of the API reference, with {module} for the module's anchor).
EXTERNAL_DOCS = {
  "horovod": (
    "Horovod 0.28.1",
    "https://horovod.readthedocs.io/en/v0.28.1/api.html#module-{module}",
  ),
}

_DIRECTIVE = re.compile(r"^::: *(\S+)[ \t]*\n((?:[ \t]+\S.*\n|[ \t]*\n)*)", re.M)
_HEADING = re.compile(r"^\s+heading:\s*[\"']?([\w.]+)[\"']?\s*$", re.M)
_EXTERNAL_MARKER = re.compile(r"<!-- external-names: ([\w.]+) -->")
# `<!-- generated: module.function -->`: replaced by what that function of tf_ext returns (Markdown
# generated from a declaration in the code, e.g. tf_ext.jit's options).
_GENERATED_MARKER = re.compile(r"<!-- generated: (tf_ext[\w.]*)\.(\w+) -->")


@dataclasses.dataclass
class Report:
  """What the check found: errors, and the re-exported names to list (module -> source -> names)."""

  errors: list
  external: dict


def resolve(path):
  """The object a public path names, as code reads it after `import`: attribute by attribute from
  the top-level package, importing a submodule where there is no attribute yet."""
  parts = path.split(".")
  obj = importlib.import_module(parts[0])
  for i, name in enumerate(parts[1:], start=2):
    if not hasattr(obj, name) and isinstance(obj, types.ModuleType):
      importlib.import_module(".".join(parts[:i]))
    obj = getattr(obj, name)
  return obj


def resolve_defined(path):
  """The object a `:::` path names in the module tree (griffe's paths): the longest prefix that
  imports as a module, then attributes. This also reaches a submodule that a function of the same
  name shadows as an attribute (tf_ext.jit.function.function)."""
  parts = path.split(".")
  for split in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:split]))
    except ModuleNotFoundError:
      continue
    for name in parts[split:]:
      obj = getattr(obj, name)
    return obj
  raise ImportError(f"no module in {path!r}")


def directives(text):
  """[(path, heading or None)] of the `::: path` blocks of a page."""
  found = []
  for match in _DIRECTIVE.finditer(text):
    heading = _HEADING.search(match.group(2))
    found.append((match.group(1), heading.group(1) if heading else None))
  return found


def public_modules(roots):
  """{name: module} for the roots and every module of their package that a public __all__ names."""
  package = roots[0].split(".")[0]
  found, todo = {}, list(roots)
  while todo:
    name = todo.pop(0)
    if name in found:
      continue
    found[name] = module = importlib.import_module(name)
    for member in getattr(module, "__all__", ()):
      value = getattr(module, member, None)
      if isinstance(value, types.ModuleType) and value.__name__.startswith(package + "."):
        todo.append(value.__name__)
  return found


def _griffe_object(collection, path):
  try:
    return collection.get_member(path)
  except KeyError:
    return None


def _docstring_holder(collection, module_name, name, obj, package):
  """The griffe object whose docstring the reference shows for `module_name.name` (= obj)."""
  if isinstance(obj, types.ModuleType):
    return _griffe_object(collection, obj.__name__)
  defined_in = getattr(obj, "__module__", None) if inspect.isclass(obj) or callable(obj) else None
  qualname = getattr(obj, "__qualname__", "")
  if defined_in and defined_in.startswith(package) and "<locals>" not in qualname:
    found = _griffe_object(collection, f"{defined_in}.{qualname}")
    if found is not None:
      return found
  member = _griffe_object(collection, f"{module_name}.{name}")
  return member.final_target if member is not None and member.is_alias else member


def check(roots, source_dir, pages):
  """The check, for the package of `roots` under `source_dir` and the pages {name: markdown}."""
  import griffe

  package = roots[0].split(".")[0]
  collection = griffe.load(
    package, search_paths=[source_dir], resolve_aliases=True, resolve_external=False
  ).modules_collection
  errors, external = [], {}

  documented = {}  # id(object) -> (object, page): keeps the objects alive while ids are compared
  for page, text in sorted(pages.items()):
    for path, heading in directives(text):
      shown = {}
      for what, how in ((path, resolve_defined), (heading, resolve)):
        if what is None:
          continue
        try:
          shown[what] = how(what)
        except (ImportError, AttributeError) as error:
          errors.append(f"{page}: `{what}` does not import ({error})")
      if heading in shown and path in shown and shown[heading] is not shown[path]:
        errors.append(f"{page}: the heading `{heading}` names another object than `{path}`")
      if path in shown:
        documented.setdefault(id(shown[path]), (shown[path], page))
  listed = {m for text in pages.values() for m in _EXTERNAL_MARKER.findall(text)}

  missing_docstring, not_documented = [], []
  for module_name, module in public_modules(roots).items():
    names = getattr(module, "__all__", None)
    if names is None:
      errors.append(f"{module_name} has no __all__ (its public names)")
      continue
    static = _griffe_object(collection, module_name)
    if static is None or sorted(static.exports or ()) != sorted(names):
      errors.append(f"{module_name}.__all__ is not a plain list of names in its source")
      continue
    for name in names:
      obj = getattr(module, name)
      member = static.members.get(name)
      if member is not None and member.is_alias and not member.target_path.startswith(package):
        source = member.target_path.rsplit(".", 1)[0]
        external.setdefault(module_name, {}).setdefault(source, []).append(name)
        continue
      holder = _docstring_holder(collection, module_name, name, obj, package)
      if holder is None or holder.docstring is None or not holder.docstring.value.strip():
        missing_docstring.append(f"{module_name}.{name}")
      if id(obj) not in documented:
        not_documented.append(f"{module_name}.{name}")
    if module_name in external and module_name not in listed:
      errors.append(
        f"{module_name} re-exports {sum(map(len, external[module_name].values()))} names from "
        f"another package, but no page has <!-- external-names: {module_name} -->"
      )
  if missing_docstring:
    errors.append("public names without a docstring: " + ", ".join(missing_docstring))
  if not_documented:
    errors.append(
      "public names on no reference page (add a `::: path` block): " + ", ".join(not_documented)
    )
  return Report(errors, external)


def external_names_markdown(sources):
  """The list that replaces an external-names marker: per source module, its names and a link."""
  lines = []
  for source, names in sorted(sources.items()):
    title, url = EXTERNAL_DOCS.get(source.split(".")[0], (None, None))
    where = f"[`{source}`]({url.format(module=source)}) ({title})" if url else f"`{source}`"
    lines.append(f"From {where}: " + ", ".join(f"`{name}`" for name in sorted(names)) + ".")
    lines.append("")
  return "\n".join(lines)


# ---- MkDocs hook events -------------------------------------------------------------------------

_report = None


def on_config(config):
  """Imports the package from the directory of mkdocs.yml, the tree the reference is read from."""
  source_dir = os.path.dirname(os.path.abspath(config.config_file_path))
  if source_dir not in sys.path:
    sys.path.insert(0, source_dir)
  return config


def on_pre_build(config):
  """Runs the check; an error stops the build."""
  from mkdocs.exceptions import PluginError

  global _report
  source_dir = os.path.dirname(os.path.abspath(config.config_file_path))
  pages = {}
  for directory, _, files in os.walk(config.docs_dir):
    for file in files:
      if file.endswith(".md"):
        path = os.path.join(directory, file)
        with open(path) as f:
          pages[os.path.relpath(path, config.docs_dir)] = f.read()
  _report = check(ROOTS, source_dir, pages)
  module_file = os.path.abspath(sys.modules[ROOTS[0]].__file__)
  if not module_file.startswith(source_dir + os.sep):
    _report.errors.insert(0, f"{ROOTS[0]} was imported from {module_file}, not from {source_dir}")
  if _report.errors:
    raise PluginError("API reference:\n  " + "\n  ".join(_report.errors))


def on_page_markdown(markdown, page, **_):
  """Replaces each external-names marker by the list of those names, and each generated marker by
  its function's Markdown."""
  markdown = _EXTERNAL_MARKER.sub(
    lambda match: external_names_markdown(_report.external.get(match.group(1), {})), markdown
  )
  return _GENERATED_MARKER.sub(
    lambda match: getattr(importlib.import_module(match.group(1)), match.group(2))(), markdown
  )

"""Every example and benchmark runs on what its make target installs.

For each script under examples/ and benchmarks/: the make target whose recipe runs it, what that
target installs (the requirements files and Horovod of its recipes and its prerequisites', as
`make -n` shows them), and the third-party modules the script imports (anywhere in it, lazy
imports included). Nothing is run or installed. Also: the cluster benchmark, whose chart needs
matplotlib at the very end, stops at once without it and names the command that installs it.
"""

import ast
import glob
import importlib.metadata
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Import name -> distribution, for modules that may not be installed here (others: the same name).
DISTRIBUTION_OF = {
  "sklearn": "scikit-learn",
  "tensorflow_recommenders_addons": "tensorflow-recommenders-addons",
}

# Scripts whose make target runs them under an interpreter the user names (a GPU machine's Python
# with PyTorch and NCCL), with the modules that interpreter must bring: script -> (make variable
# naming the interpreter, modules).
OWN_INTERPRETER = {"benchmarks/harp_nccl_e2e.py": ("TORCH_PYTHON", {"torch"})}


def normalize(name):
  return re.sub(r"[-_.]+", "-", name).lower()


def scripts():
  """The runnable scripts; modules named _*.py are their shared code (checked through them)."""
  found = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))
  found += sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))
  return [
    os.path.relpath(path, ROOT) for path in found if not os.path.basename(path).startswith("_")
  ]


def third_party_imports(path):
  with open(os.path.join(ROOT, path)) as f:
    tree = ast.parse(f.read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names.add(node.module.split(".")[0])
  local = {
    os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.dirname(path) + "/*")
  }
  return sorted(
    n for n in names if n not in sys.stdlib_module_names and n not in local | {"tf_ext"}
  )


def makefile():
  with open(os.path.join(ROOT, "Makefile")) as f:
    return f.read()


def make_target_running(script):
  """The Makefile target whose own recipe runs `script`, or whose benchmark table entry
  (BENCH.TARGET := scripts under benchmarks/) names it."""
  text = makefile().replace("\\\n", " ")  # continuation lines joined
  if script.startswith("benchmarks/"):
    for target, names in re.findall(r"^BENCH\.([A-Za-z0-9_-]+)\s*:=(.*)$", text, re.M):
      if os.path.basename(script) in names.split():
        return target
  target = None
  for line in text.splitlines():
    rule = re.match(r"^([A-Za-z0-9_.-]+):(?!=)", line)
    if rule:
      target = rule.group(1)
    elif line.startswith("\t") and script in line:
      return target
  return None


def make_targets_listed():
  """The targets of the Makefile's header (`make help` prints it: the one list)."""
  header = makefile().split("\n\n", 1)[0]
  return set(re.findall(r"\bmake ([a-z][a-z-]*)", header))


def test_every_make_target_is_in_the_list_make_help_prints():
  defined = set(re.findall(r"^([a-z][a-z-]*):(?!=)", makefile(), re.M))
  defined |= set(re.findall(r"^BENCH\.([a-z][a-z-]*)\s*:=", makefile(), re.M))
  missing = sorted(defined - make_targets_listed() - {"all"})
  assert not missing, f"targets missing from the Makefile's header list: {missing}"
  proc = subprocess.run(
    ["make", "-s", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True
  )
  assert proc.returncode == 0 and "make bench-tfra-quality" in proc.stdout, proc.stderr


def installed_by(target):
  """Distributions the target's recipes (and its prerequisites') install, as `make -n` shows."""
  proc = subprocess.run(
    ["make", "-n", "--no-print-directory", target, f"VENV={sys.prefix}"],
    cwd=ROOT,
    env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")},
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  names = set()
  for requirements in set(re.findall(r"-r (requirements[\w-]*\.txt)", proc.stdout)):
    with open(os.path.join(ROOT, requirements)) as f:
      for line in f:
        requirement = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#")[0])
        if requirement:
          names.add(normalize(requirement.group(1)))
  if "install_horovod.sh" in proc.stdout:  # make setup builds Horovod from source
    names.add("horovod")
  return names


def with_dependencies(names):
  """`names` and, where installed here, everything they require (non-optional)."""
  todo, seen = list(names), set()
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    try:
      requires = importlib.metadata.distribution(name).requires or []
    except importlib.metadata.PackageNotFoundError:
      continue
    for requirement in requires:
      if "extra ==" not in requirement:
        todo.append(normalize(re.match(r"[A-Za-z0-9._-]+", requirement).group(0)))
  return seen


def test_every_script_imports_only_what_its_make_target_installs():
  installed_here = importlib.metadata.packages_distributions()
  problems = []
  assert scripts(), "no scripts found"
  for script in scripts():
    target = make_target_running(script)
    if target is None:
      problems.append(f"{script}: no make target runs it (the README documents each script's)")
      continue
    provided = with_dependencies(installed_by(target))
    variable, brought = OWN_INTERPRETER.get(script, (None, set()))
    if variable is not None and not re.search(
      rf"^{re.escape(target)}:.*\n(\t.*\n)*\t.*\$\(or \$\({variable}\)", makefile(), re.M
    ):
      problems.append(f"{script}: `make {target}` does not run it under $({variable})")
    for module in third_party_imports(script):
      if module in brought:
        continue
      candidates = installed_here.get(module) or [DISTRIBUTION_OF.get(module, module)]
      if not {normalize(c) for c in candidates} & provided:
        problems.append(
          f"{script} imports {module} ({candidates[0]}), which `make {target}` does not install"
        )
  assert not problems, "\n".join(problems)


def test_the_dependency_check_sees_a_missing_module():
  # The same analysis finds matplotlib in the cluster benchmark and requirements-bench.txt in its
  # target: a script whose target forgot bench-deps would be reported.
  script = os.path.join("benchmarks", "lightcc_cluster.py")
  assert "matplotlib" in third_party_imports(script)
  assert "matplotlib" in installed_by(make_target_running(script))
  assert "matplotlib" not in with_dependencies(installed_by("demo"))


def test_cluster_benchmark_without_matplotlib_stops_at_once():
  # matplotlib blocked as if not installed. The unknown configuration would stop the script before
  # any network set-up should the module check ever miss it: this test never builds a cluster.
  # (The timeout is a hang guard; it stops in well under a second.)
  script = os.path.join(ROOT, "benchmarks", "lightcc_cluster.py")
  code = (
    "import runpy, sys\n"
    "sys.modules['matplotlib'] = None\n"
    f"sys.argv = [{script!r}, '--configs', 'no-such-config']\n"
    f"runpy.run_path({script!r}, run_name='__main__')\n"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
  )
  assert proc.returncode != 0
  assert "lacks matplotlib" in proc.stderr and "make bench-cluster" in proc.stderr, proc.stderr
  # It stopped before the root check and the configuration check.
  assert "must run as root" not in proc.stderr and "no-such-config" not in proc.stderr

#!/usr/bin/env python3
"""Runs TFRA 0.7.2's own dynamic_embedding test suite, against TFRA itself or against tf_ext.tfra.

TFRA's test files are Apache-2.0 but are never copied into this repository: they are read out of
a git clone of TFRA at run time into a temporary folder, and (for --impl tf_ext) their imports are
rewritten by the MAPPING table below. Each file runs in its own pytest process, so a crash or a
hang costs one file only. Results are compared with the outcomes recorded for TFRA itself
(tfra_0.7.2_baseline.json): a test that passes on TFRA must pass on tf_ext unless excluded.json
says why not. Standard library only: it runs with any Python, the suite with --python.

  run_tfra_suite.py --impl tfra --out tests/dynamic_embedding/tfra/tfra_0.7.2_baseline.json
  run_tfra_suite.py --impl tf_ext [--files a_test.py,b_test.py] [-k EXPR] [--jobs 2]
"""

import argparse
import concurrent.futures
import datetime
import fnmatch
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

# Import rewrites for --impl tf_ext: (pattern, replacement), applied in order to every line.
SHIM = "_tfra_check_platform"
OPS = "math_ops|data_flow_ops|data_flow_grad|shadow_embedding_ops|ragged_embedding_ops"
MAPPING = [
  (
    r"from\s+tensorflow_recommenders_addons\s+import\s+dynamic_embedding\s+as\s+de\b",
    "import tf_ext.tfra as de",
  ),
  (
    r"tensorflow_recommenders_addons\.dynamic_embedding\.python\.ops(\s+import\s+|\.)(%s)\b" % OPS,
    r"tf_ext.tfra.ops\1\2",
  ),
  (
    r"tensorflow_recommenders_addons\.dynamic_embedding\.python\.keras\.callbacks\b",
    "tf_ext.tfra.keras.callbacks",
  ),
  (r"tensorflow_recommenders_addons\.utils\.check_platform\b", SHIM),
]
# TFRA's check_platform needs TFRA installed; this stand-in answers the same questions.
SHIM_SOURCE = """import platform
def is_windows(): return platform.system() == "Windows"
def is_macos(): return platform.system() == "Darwin"
def is_linux(): return platform.system() == "Linux"
def is_arm64(): return platform.machine() in ("arm64", "aarch64")
def is_raspi_arm(): return platform.machine() == "armv7l"
"""
# TF's run_in_graph_and_eager_modes runs a test twice, in subTest("graph_mode") then
# subTest("eager_mode"), and many TFRA tests skipTest() one of the halves. pytest >= 9 reports
# subtests itself, and its junit XML then marks such a test skipped even when a half ran and passed;
# pytest 8 marks it skipped when its eager half skips. This plugin makes both count alike: a skip
# in a subtest after an earlier subtest of the same test ran is dropped (the test stands on the half
# that ran); otherwise subTest() is plain (the first failure ends the test).
PLUGIN = "_tfra_subtests"
PLUGIN_SOURCE = """import contextlib, unittest
@contextlib.contextmanager
def _subtest(self, msg=None, **params):
  try:
    yield
  except unittest.SkipTest:
    if not getattr(self, "_tfra_subtest_ran", False):
      raise
    return
  self._tfra_subtest_ran = True
unittest.TestCase.subTest = _subtest
"""

SUITE_ROOT = "tensorflow_recommenders_addons/dynamic_embedding/python"
SUITE_RE = re.compile(r"^%s/(kernel_tests/[^/]+|keras/.+)_test\.py$" % SUITE_ROOT)
HOROVOD_FILES = {"horovod_sync_train_test.py"}
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_SOURCE = "/work/.mirror/tensorflow+recommenders-addons/repo"
DEFAULT_PYTHON = {"tfra": "/work/tfra-venv/bin/python", "tf_ext": str(REPO / ".venv/bin/python")}
DIST = {"tfra": "tensorflow-recommenders-addons", "tf_ext": "tf_ext"}
PASSED, FAILED, ERROR, SKIPPED, NOTRUN = "passed", "failed", "error", "skipped", "notrun"
OUTCOMES = (PASSED, FAILED, ERROR, SKIPPED, NOTRUN)
# Each file's pytest runs in a session of its own (so a hang can be killed whole), which also
# shields it from a kill of the runner: the runner kills these itself when it is stopped.
RUNNING = set()


def git(source, *args):
  return subprocess.run(
    ["git", "-C", source, *args], check=True, capture_output=True, text=True
  ).stdout


def suite_files(source, tag):
  """{basename: path in TFRA} of the suite at tag (basenames are unique in it)."""
  names = git(source, "ls-tree", "-r", "--name-only", tag, "--", SUITE_ROOT).split()
  return {os.path.basename(n): n for n in sorted(names) if SUITE_RE.match(n)}


def rewrite(text):
  """tf_ext version of a test file, and the TFRA references the mapping leaves behind."""
  out, leftovers = [], []
  for i, line in enumerate(text.splitlines(keepends=True), 1):
    for pattern, repl in MAPPING:
      line = re.sub(pattern, repl, line)
    if "recommenders_addons" in line:
      leftovers.append("line %d: %s" % (i, line.strip()))
    out.append(line)
  return "".join(out), leftovers


def probe(python, impl):
  """Versions as the interpreter under test sees them (for the JSON header)."""
  code = (
    "import json, platform, importlib.metadata as m\n"
    "def v(d):\n  try: return m.version(d)\n  except Exception: return 'not installed'\n"
    "print(json.dumps({'impl_version': v(%r), 'tensorflow': v('tensorflow'),"
    " 'python': platform.python_version()}))" % DIST[impl]
  )
  try:
    return json.loads(
      subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120).stdout
    )
  except (OSError, ValueError, subprocess.TimeoutExpired) as e:
    return {"probe_error": str(e)}


def cpu_model():
  models = re.findall(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
  return "%s (%d cores)" % (models[0], len(models)) if models else platform.processor()


def horovodrun_for(python):
  """horovodrun beside the interpreter, if Horovod's TensorFlow binding imports there."""
  hr = Path(python).parent / "horovodrun"
  if not hr.exists():
    return None, "horovodrun not found beside %s" % python
  r = subprocess.run([python, "-c", "import horovod.tensorflow"], capture_output=True, text=True)
  if r.returncode:
    return None, "horovod.tensorflow does not import: %s" % (
      r.stderr.strip().splitlines() or ["?"]
    )[-1]
  return str(hr), None


def parse_junit(xml_path, fname):
  """{id: (outcome, first line of message)} from a pytest junit XML file."""
  results, stem = {}, fname[:-3]
  for case in ET.parse(xml_path).iter("testcase"):
    cls = case.get("classname", "")
    cls = cls[len(stem) + 1 :] if cls.startswith(stem + ".") else ("" if cls == stem else cls)
    tid = "::".join(p for p in (fname, cls, case.get("name")) if p)
    outcome, msg = PASSED, ""
    for kind, tag in ((FAILED, "failure"), (ERROR, "error"), (SKIPPED, "skipped")):
      el = case.find(tag)
      if el is not None:
        outcome = kind
        msg = (el.get("message") or el.text or "").strip().splitlines()
        msg = msg[0][:300] if msg else ""
        break
    if tid in results and results[tid][0] in (FAILED, ERROR):
      continue  # a teardown error must not hide the failure before it
    results[tid] = (outcome, msg)
  return results


def run_file(fname, work, args, env, horovodrun):
  """Runs one test file; returns (file status, {id: (outcome, message)})."""
  xml = work / (fname + ".xml")
  pytest = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, str(work / fname)]
  # A test still running at half the file's time gets its stack dumped: a hang names itself.
  pytest += ["-o", "faulthandler_timeout=%d" % max(1, args.timeout // 2)]
  pytest += ["-k", args.k] if args.k else []
  if fname in HOROVOD_FILES:
    # One junit file per rank; a test counts as passed only if it passed on every rank.
    wrapper = (
      "import os, sys, pytest; sys.exit(pytest.main(sys.argv[1:] + ['--junitxml=%s.' +"
      " os.environ.get('HOROVOD_RANK', '0')]))" % xml
    )
    cmd = [horovodrun, "--gloo", "-np", "2", args.python, "-c", wrapper] + pytest[2:]
  else:
    cmd = [args.python] + pytest + ["--junitxml=%s" % xml]
  log = work / (fname + ".log")
  with open(log, "w") as out:
    proc = subprocess.Popen(
      cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    RUNNING.add(proc)
    try:
      rc = proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)  # the whole group: horovodrun's ranks too
      proc.wait()
      rc = None
    finally:
      RUNNING.discard(proc)
  if args.keep_logs:
    shutil.copy(log, Path(args.keep_logs) / log.name)
  if rc is None:
    hung = re.findall(
      r"%s\", line \d+ in (test\w+)" % re.escape(fname), log.read_text(errors="replace")
    )
    return "timeout after %ds%s" % (args.timeout, " in " + hung[-1] if hung else ""), {}
  xmls = sorted(work.glob(fname + ".xml*"))
  if rc not in (0, 1, 5) or not xmls:  # 2: a collection error (an import failed, most often)
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    why = next((ln[1:].strip() for ln in lines if ln.startswith("E ")), lines[-1] if lines else "?")
    return "%s (exit %d): %s" % ("collection error" if rc == 2 else "crashed", rc, why[:200]), {}
  merged = {}
  for x in xmls:
    for tid, res in parse_junit(x, fname).items():
      if tid not in merged or merged[tid][0] == PASSED:
        merged[tid] = res
  return "ok", merged


def collect(fname, work, args, env, why):
  """The ids of a file that cannot run, so that the JSON still lists them (as not run)."""
  cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", fname]
  cmd += ["-k", args.k] if args.k else []
  r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
  return {ln.strip(): (NOTRUN, why) for ln in r.stdout.splitlines() if ln.startswith(fname + "::")}


def prepare(work, args, files):
  """Writes the test files (rewritten for tf_ext) and helpers into work; returns the env."""
  (work / "tmp").mkdir()
  (work / (SHIM + ".py")).write_text(SHIM_SOURCE)
  (work / (PLUGIN + ".py")).write_text(PLUGIN_SOURCE)
  for fname, path in files.items():
    text = git(args.source, "show", "%s:%s" % (args.tag, path))
    if args.impl == "tf_ext":
      text, leftovers = rewrite(text)
      for ref in leftovers:
        print("%s: TFRA reference left after the mapping: %s" % (fname, ref))
    (work / fname).write_text(text)
  if args.keep_logs:
    Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
  env = dict(
    os.environ,
    CUDA_VISIBLE_DEVICES="",
    TF_CPP_MIN_LOG_LEVEL="2",
    TEST_TMPDIR=str(work / "tmp"),
    PYTHONPATH=str(work),
  )
  if args.impl == "tf_ext":  # the checkout's tf_ext, also when .venv has no editable install
    env["PYTHONPATH"] += os.pathsep + str(REPO)
  return env


def excluded_by(patterns, tid):
  """Whether an excluded.json key (a test id or a file glob) covers tid."""
  return any(
    fnmatch.fnmatchcase(tid, p) or fnmatch.fnmatchcase(tid.split("::")[0], p) for p in patterns
  )


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument(
    "--source", default=os.environ.get("TFRA_SOURCE", DEFAULT_SOURCE), help="TFRA git dir"
  )
  p.add_argument("--tag", default="v0.7.2")
  p.add_argument("--impl", choices=["tfra", "tf_ext"], default="tf_ext")
  p.add_argument("--python", help="interpreter to run the suite with (default per --impl)")
  p.add_argument("--files", help="comma-separated basenames (or globs) of test files to run")
  p.add_argument("-k", help="passed to pytest -k")
  # Some TFRA tests share fixed /tmp paths: keep 1 for a baseline.
  p.add_argument("--jobs", type=int, default=1, help="test files run at once")
  p.add_argument("--timeout", type=int, default=900, help="seconds per file")
  p.add_argument("--out", help="outcomes JSON (with --files, updates those files in it)")
  p.add_argument("--baseline", default=str(HERE / "tfra_0.7.2_baseline.json"))
  p.add_argument("--excluded", default=str(HERE / "excluded.json"))
  p.add_argument("--run-all", action="store_true", help="also files with no test passing on TFRA")
  p.add_argument("--keep-logs", metavar="DIR", help="copy each file's pytest output here")
  args = p.parse_args()
  args.python = args.python or DEFAULT_PYTHON[args.impl]

  verify = ["git", "-C", args.source, "rev-parse", "--verify", "-q", args.tag + "^{commit}"]
  if not Path(args.source).exists() or subprocess.run(verify, capture_output=True).returncode:
    print(
      "TFRA source with tag %s not found at %s.\nTo run TFRA's own test suite, clone the "
      "tensorflow/recommenders-addons repository (GitHub), e.g. `git clone --bare <url> DIR`,"
      " and pass --source DIR or set TFRA_SOURCE=DIR." % (args.tag, args.source)
    )
    print("tfra suite: skipped (no TFRA source)")
    return 0
  if not Path(args.python).exists():
    print("interpreter %s not found (see --python)" % args.python)
    return 2

  files = suite_files(args.source, args.tag)
  if args.files:
    sel = [s.strip() for s in args.files.split(",") if s.strip()]
    files = {f: path for f, path in files.items() if any(fnmatch.fnmatch(f, s) for s in sel)}
    if not files:
      print("no suite file matches --files %s" % args.files)
      return 2
  excluded = json.loads(Path(args.excluded).read_text()) if Path(args.excluded).exists() else {}
  baseline = {}
  if args.impl == "tf_ext":
    if not Path(args.baseline).exists():
      print("baseline %s not found: run --impl tfra --out it first" % args.baseline)
      return 2
    baseline = json.loads(Path(args.baseline).read_text())

  work = Path(tempfile.mkdtemp(prefix="tfra_suite_"))
  try:
    env = prepare(work, args, files)
    horovodrun, no_horovod = horovodrun_for(args.python)

    def one(fname):
      if fname in HOROVOD_FILES and not horovodrun:
        return fname, "not run: " + no_horovod, collect(fname, work, args, env, no_horovod)
      return (fname,) + run_file(fname, work, args, env, horovodrun)

    # For tf_ext, a file none of whose tests passes on TFRA (Redis, HKV without a GPU) is not
    # run unless asked: it cannot change the count, and some of its tests hang.
    baseline_passing = {
      t.split("::")[0] for t, o in baseline.get("tests", {}).items() if o == PASSED
    }
    skip = args.impl == "tf_ext" and not args.run_all
    to_run = [f for f in files if not skip or f in baseline_passing]
    status = {
      f: "not run: no test passes on TFRA (see --run-all)" for f in files if f not in to_run
    }
    results = {}
    for f in status:
      print("%-38s %s" % (f, status[f]))
    pool = concurrent.futures.ThreadPoolExecutor(max(1, args.jobs))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs the finally below
    try:
      for fname, st, res in pool.map(one, to_run):
        status[fname] = st
        results.update(res)
        counts = " ".join("%s=%d" % (o, sum(r[0] == o for r in res.values())) for o in OUTCOMES)
        print("%-38s %s  %s" % (fname, counts, st), flush=True)
    finally:
      pool.shutdown(wait=False, cancel_futures=True)
      for proc in list(RUNNING):
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      pool.shutdown()
  finally:
    shutil.rmtree(work, ignore_errors=True)

  if args.out:
    write_out(args, files, status, results)
  if args.impl == "tfra":
    print(
      "tfra suite (TFRA itself): "
      + ", ".join("%d %s" % (sum(r[0] == o for r in results.values()), o) for o in OUTCOMES)
    )
    return 0
  return compare(args, files, status, results, baseline, excluded)


def write_out(args, files, status, results):
  out = Path(args.out)
  doc = {"header": {}, "files": {}, "tests": {}, "messages": {}}
  if args.files and out.exists():  # a partial re-run updates only its own files
    doc = json.loads(out.read_text())
    for f in files:
      doc["files"].pop(f, None)
      for key in ("tests", "messages"):
        doc[key] = {t: v for t, v in doc[key].items() if t.split("::")[0] != f}
  cmd = " ".join([os.path.basename(sys.executable)] + sys.argv)
  header = dict(
    probe(args.python, args.impl),
    impl=args.impl,
    tag=args.tag,
    interpreter=args.python,
    date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    cpu=cpu_model(),
    command=cmd,
  )
  if args.files and doc["header"]:
    doc["header"].setdefault("reruns", []).append(header)
  else:
    doc["header"] = header
  for f in files:
    ran = [r[0] for t, r in results.items() if t.split("::")[0] == f]
    doc["files"][f] = dict({o: ran.count(o) for o in OUTCOMES}, status=status.get(f, "not run"))
  for tid, (outcome, msg) in results.items():
    doc["tests"][tid] = outcome
    if outcome != PASSED and msg:
      doc["messages"][tid] = msg
  for key in ("files", "tests", "messages"):
    doc[key] = dict(sorted(doc[key].items()))
  # One entry per line: small diffs when the baseline is re-recorded.
  lines = ["{"]
  for i, key in enumerate(("header", "files", "tests", "messages")):
    items = ["  %s: %s" % (json.dumps(k), json.dumps(v)) for k, v in doc[key].items()]
    lines.append(" %s: {\n%s\n }%s" % (json.dumps(key), ",\n".join(items), "," if i < 3 else ""))
  lines.append("}")
  out.write_text("\n".join(lines) + "\n")


def compare(args, files, status, results, baseline, excluded):
  base = {t: o for t, o in baseline.get("tests", {}).items() if t.split("::")[0] in files}
  if args.k:  # -k deselects tests: compare only those that ran, or whose file did not finish
    base = {t: o for t, o in base.items() if t in results or status[t.split("::")[0]] != "ok"}
  passing = [t for t, o in base.items() if o == PASSED]
  n_pass = n_fail = n_excl = n_excl_pass = 0
  fails = {}
  for tid in sorted(passing):
    fname = tid.split("::")[0]
    got, msg = results.get(tid, (NOTRUN, ""))
    if excluded_by(excluded, tid):
      n_excl += 1
      n_excl_pass += got == PASSED
    elif got == PASSED:
      n_pass += 1
    else:
      n_fail += 1
      if got == NOTRUN:
        msg = status.get(fname, "not run") if status.get(fname, "ok") != "ok" else "not collected"
      fails.setdefault(fname, []).append("  %s [%s] %s" % (tid.split("::", 1)[1], got, msg))
  version = args.tag.lstrip("v")
  for fname in sorted(fails):
    print("%s: %d test(s) pass on TFRA %s but not on tf_ext:" % (fname, len(fails[fname]), version))
    print("\n".join(fails[fname]))
  if n_excl_pass:
    print(
      "%d excluded test(s) pass on tf_ext: candidates to drop from %s"
      % (n_excl_pass, os.path.basename(args.excluded))
    )
  print(
    "tfra suite: %d passed, %d failed, %d excluded (of %d passing on TFRA %s; %d not passing"
    " on TFRA itself)" % (n_pass, n_fail, n_excl, len(passing), version, len(base) - len(passing))
  )
  return 1 if n_fail else 0


if __name__ == "__main__":
  sys.exit(main())

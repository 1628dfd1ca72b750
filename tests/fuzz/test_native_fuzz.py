"""The C++ parsers and cores under libFuzzer (issue 37): each harness of
tests/kernels/<capability>/fuzz/ built with AddressSanitizer and UndefinedBehaviorSanitizer and
run for a short, bounded time on its checked-in corpus by tests/fuzz/native_fuzz.sh. Any crash,
sanitizer report, failed model check or allocation past the script's bound fails the test, with
the harness's log. `make fuzz` runs the same harnesses longer."""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "fuzz", "native_fuzz.sh")
# Short in `make test` (a smoke run on the corpus); `make fuzz` runs FUZZ_SECONDS (300) each.
SECONDS_EACH = int(os.environ.get("NATIVE_FUZZ_SECONDS", "5"))
HARNESSES = sorted(
  os.path.basename(path)[: -len("_fuzzer.cc")]
  for path in glob.glob(os.path.join(ROOT, "tests", "kernels", "*", "fuzz", "*_fuzzer.cc"))
)


def test_every_harness_has_a_seed_corpus():
  assert HARNESSES, "no harness found under tests/kernels/*/fuzz/"
  for path in glob.glob(os.path.join(ROOT, "tests", "kernels", "*", "fuzz", "*_fuzzer.cc")):
    name = os.path.basename(path)[: -len("_fuzzer.cc")]
    corpus = os.path.join(os.path.dirname(path), "corpus", name)
    assert os.path.isdir(corpus) and os.listdir(corpus), f"{name} has no seeds in {corpus}"


@pytest.mark.parametrize("name", HARNESSES)
def test_harness_runs_clean(name, tmp_path):
  clang = os.environ.get("FUZZ_CXX", "clang++")
  assert shutil.which(clang), (
    f"{clang} not found: the native fuzzers need clang with libFuzzer (Debian's clang package;"
    " `make setup` installs it)"
  )
  result = subprocess.run(
    ["bash", SCRIPT, "--seconds", str(SECONDS_EACH), "--out", str(tmp_path), name],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    timeout=SECONDS_EACH + 600,  # the build (a few minutes on a loaded machine) and the run
  )
  print(result.stdout)
  assert result.returncode == 0, result.stdout[-8000:]
  assert f"[fuzz] {name}: " in result.stdout

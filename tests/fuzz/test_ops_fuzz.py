"""Every op tf_ext registers, fuzzed from Python, eagerly and in a graph (issue 37).

The ops are read from the op registry after loading tf_ext's library, so a new op is fuzzed
without anyone listing it. Hypothesis draws each call from the op's OpDef (_op_calls.py); a child
process runs it (_op_worker.py), and the call must end in a result or an error (a TensorFlow
error, or the op's Python wrapper refusing the arguments): never a signal, a hang (no answer in
FUZZ_OPS_CALL_TIMEOUT_S, default 60 s) or an allocation past the bound (the child's address space
is capped at FUZZ_OPS_MEMORY_BOUND_MB, default 4096 MiB, above its size once loaded).

The calls of corpus.json (each one took the process down once) run first, then
FUZZ_OPS_EXAMPLES (default 100) drawn calls per op and mode: the same ones at every run unless
FUZZ_OPS_SEED is set. `make fuzz-ops EXAMPLES=N` runs more, with a new seed each time, and shrinks
a failure to a small call; add it to corpus.json, fix the kernel, and add a regression test.
"""

import collections
import json
import os
import tempfile

import pytest
from _op_calls import op_calls
from _workers import Workers
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.configuration import set_hypothesis_home_dir
from tensorflow.python.framework import op_def_registry

from tf_ext import _ops_loader

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = int(os.environ.get("FUZZ_OPS_EXAMPLES", "100"))
SEED = os.environ.get("FUZZ_OPS_SEED")
# Shrinking restarts a child at each crash it retries: worth it for a long run, not in CI.
SHRINK = os.environ.get("FUZZ_OPS_SHRINK", "0") == "1"
MODES = ["eager", "graph"]
VERBOSE = os.environ.get("FUZZ_OPS_VERBOSE", "0") == "1"
# Hypothesis keeps a cache in ./.hypothesis by default: not in the source tree (or the runfiles).
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "tf_ext_fuzz_ops_hypothesis"))


def registered_ops():
  module = _ops_loader.load()
  # The library's ops are those the generated module has a wrapper for (it also holds other
  # names, such as typing's Any, which is a TensorFlow op too).
  wrappers = {name.replace("_", "") for name in dir(module) if name.islower()}
  return sorted(
    name
    for name in dir(module)
    if name.lower() in wrappers and op_def_registry.get(name) is not None
  )


OPS = registered_ops()


def corpus(op_name, mode):
  with open(os.path.join(HERE, "corpus.json")) as f:
    return [c for c in json.load(f)["calls"] if c["op"] == op_name and c["mode"] == mode]


@pytest.fixture(scope="module")
def workers():
  pool = Workers()
  yield pool
  pool.close()


def test_every_op_of_the_library_is_fuzzed():
  assert len(OPS) >= 30, OPS
  assert {"TfExtTableFind", "TfExtAmpProbe", "TfExtXlaSpeedGateReady"} <= set(OPS)
  # Every corpus entry names an op that still exists.
  with open(os.path.join(HERE, "corpus.json")) as f:
    assert {c["op"] for c in json.load(f)["calls"]} <= set(OPS)


def _settings():
  phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if SHRINK else [])
  return settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=SEED is None,
    phases=phases,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
  )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op_name", OPS)
def test_op_survives_fuzzed_input(op_name, mode, workers):
  outcomes, details = collections.Counter(), collections.Counter()

  def check(call):
    outcome = workers.call(call)
    outcomes[outcome.kind] += 1
    details[outcome.detail[:100]] += 1
    assert outcome.clean, f"{op_name} ({mode}) failed.\ncall: {json.dumps(call)}\n{outcome!r}"

  for call in corpus(op_name, mode):
    check(call)

  if EXAMPLES == 0:  # the corpus only
    return
  fuzz = given(op_calls(op_def_registry.get(op_name), mode))(check)
  if SEED is not None:
    fuzz = seed(int(SEED))(fuzz)
  _settings()(fuzz)()
  print(f"{op_name} {mode}: {sum(outcomes.values())} calls, {dict(sorted(outcomes.items()))}")
  if VERBOSE:  # what stopped the calls that did not get through
    for detail, count in details.most_common(6):
      print(f"  {count:4d} {detail}")

# tf_ext developer entry points. Everything runs offline except `setup` (apt + PyPI). This list
# is the one list of targets: `make help` prints it, and .PHONY is read from it.
#
#   make help    this list
#   make setup   system packages (apt) + .venv with requirements.txt + Horovod (built from source
#                once per machine, wheel cached in TF_EXT_CACHE_DIR); a no-op when already done
#   make build   bazel build the op library and HARP's plugin library, copy them into tf_ext/, then
#                `make develop`
#   make develop editable install of this checkout into .venv (pip install -e .; reuses the
#                libraries make build copied), so .venv/bin/python imports tf_ext from anywhere
#   make lint    ruff (format check + lint) and clang-format --dry-run; `make format` fixes
#   make test    lint and build, then bazel test //... (googletest for the cores, pytest for the
#                rest; tests/docs builds the docs site strictly and runs the pages' Python examples)
#   make docs    the docs site (MkDocs, API reference from the docstrings) into site/, offline;
#                open site/index.html, or serve it: python3 -m http.server -d site
#   make sanitize  the C++ core tests under ThreadSanitizer and AddressSanitizer
#   make fuzz-ops  every op of the library fuzzed from Python (tests/fuzz), EXAMPLES calls per op
#                and mode (default 1000; `make test` runs 100), a new seed per run (SEED=N repeats
#                one), a failure shrunk to a small call
#   make fuzz    the C++ parsers and cores under libFuzzer with ASan and UBSan (tests/kernels/*/fuzz/,
#                tests/fuzz/native_fuzz.sh): FUZZ_SECONDS each (default 300; `make test` runs 5)
#   make apt, make venv, make horovod, make docs-deps, make bench-deps  setup's parts, and the
#                benchmarks' requirements (requirements-bench.txt)
#   make format  rewrites the sources as `make lint` wants them
#   make demo    examples/train_ctr.py
#   make demo-estimator  examples/estimator_columns.py (a canned Estimator over dynamic embedding
#                columns: train_and_evaluate, export_saved_model, serving in a fresh process)
#   make bench   benchmarks/lookup.py, BENCH_RUNS (5) fresh runs, their ratios' median and range
#                (installs requirements-bench.txt: the TFRA baseline)
#   make bench-lifecycle  benchmarks/eviction.py, bulk_insert.py, admission.py, small_tables.py,
#                checkpoint.py and serving_export.py
#                (installs requirements-bench.txt: TFRA, for eviction's comparison)
#   make soak    benchmarks/soak.py: a model with a table trains on the Criteo-like stream for
#                SOAK_MINUTES (default 30) with admission, TTL eviction, delta and full links and
#                lookups from a second thread, killed with SIGKILL at random moments and restarted
#                from the last link; checks memory, lost rows, restores and AUC (writes soak.png)
#   make bench-quality  benchmarks/quality.py: DeepFM on a drifting Criteo-like stream, tf_ext
#                against a memory-matched hashed tf.Variable and TFRA (installs requirements-bench.txt)
#   make bench-initial-rows  benchmarks/initial_rows.py: the cost of a missing id's initial row,
#                per initializer and version
#   make bench-amp  benchmarks/amp.py: loss-aware mixed precision against float32 and TensorFlow's
#                own AMP (speed on a DLRM-style tower, accuracy on three tasks; writes amp.png)
#   make bench-fusion  benchmarks/embedding_fusion.py: training steps/s with tf_ext's graph passes
#                on and off (TF1 Session and Keras; 26 fields, batch 4096, three dense towers)
#   make bench-jit  benchmarks/jit_cache.py: tf_ext.jit against plain TF, jit_compile, auto-jit and
#                static shapes on two varying-shape workloads (writes jit_cache.png)
#   make bench-jit-profile  benchmarks/jit_op_profile.py: where bench-jit's steps spend their time,
#                XLA's code against TensorFlow's kernels op by op, and the best mix of the two
#   make bench-jit-session  benchmarks/jit_cache_session.py: tf_ext.jit.Bucketing against
#                TensorFlow's XLA options in a TF1 Session (writes jit_cache_session.png)
#   make bench-jit-verdicts  benchmarks/speed_check_verdicts.py: how often tf_ext.jit's speed check
#                decides right on simulated calls, against the median rule it replaced
#   make bench-cluster  benchmarks/lightcc_cluster.py (root: via sudo when not root; installs
#                requirements-bench.txt: matplotlib for its chart)
#   make bench-scaling  benchmarks/lightcc_scaling.py: LightCC's scaling efficiency against Horovod
#                on bench-cluster's emulated cluster with sleeping, GPU-like compute (root: via sudo
#                when not root; writes lightcc_scaling.png and its timeline); BENCH_ARGS=--quick
#   make bench-alltoall  benchmarks/alltoall_tables.py: tables split across ranks (all-to-all)
#                against replicated tables and TFRA's HvdAllToAllEmbedding on bench-cluster's
#                emulated 2-node cluster (root: via sudo when not root; installs
#                requirements-bench.txt: TFRA, matplotlib); BENCH_ARGS=--quick for a short run
#   make bench-tfra  benchmarks/tfra_compat.py: the same TFRA-API programs (a DeepFM-like Keras
#                model, a TF1 graph) with TFRA 0.7.2 and with tf_ext.tfra, and the native API, in
#                interleaved rounds (installs requirements-bench.txt: TFRA); BENCH_ARGS=--quick
#   make bench-tfra-quality  benchmarks/tfra_quality.py: model quality against TFRA over seeds (one
#                process, no cluster; about 12 min)
#   make test-tfra  TFRA 0.7.2's own dynamic-embedding tests with `import tf_ext.tfra as de`
#                (tests/dynamic_embedding/tfra/run_tfra_suite.py; needs TFRA's source, fetched
#                outside the checkout: TFRA_SOURCE=<its git dir>; skips with a message without it)
#   make bench-harp  benchmarks/harp_transport.py: HARP's NCCL plugin against a stand-in for NCCL's
#                default socket transport over veth with tc-shaped profiles (root: via sudo when
#                not root; writes harp_transport.png)
#   make bench-harp-nccl  benchmarks/harp_nccl_e2e.py: NCCL end to end through HARP's plugin against
#                NCCL's Socket transport, two ranks on one GPU (a GPU machine with PyTorch and NCCL;
#                TORCH_PYTHON=its Python; BENCH_ARGS=--dry-run prints the commands only)
#   make gpu-checks  builds the GPU table's test binary and benchmark into build/gpu/ (nvcc, no
#                GPU needed; HKV_DIR=<HierarchicalKV checkout> adds HKV's own benchmark), then
#                dry-runs tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh here
#   make test-gpu  on a GPU machine: gpu-checks' build, then
#                tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh (googletest on the GPU,
#                compute-sanitizer, benchmarks/gpu_table.py against HKV); prints
#                "GPU checks: passed" or "failed"
#   make bench-gpu-table  benchmarks/gpu_table.py --chart: the report and chart of a GPU run of
#                the GPU table against HierarchicalKV (RESULTS=its gpu_table.json; writes
#                benchmarks/gpu_table.png). The run itself is part of make test-gpu.
#   make clean   bazel clean + built artefacts
#   make distclean  clean, and the venv and Bazel's cached repositories
#
# Knobs: BAZEL_FLAGS="--jobs=1" (e.g. while something else compiles), PYTHON=python3.11,
#        TESTS="//tests:..." (targets for `make test`), DEMO_ARGS="--quick", BENCH_ARGS="--no-tfra" and BENCH_RUNS=N
#        (make bench) or "--configs horovod,2d" (make bench-cluster), EXAMPLES=N and SEED=N
#        (make fuzz-ops), SOAK_MINUTES=N and SOAK_KILL_INTERVAL=S (make soak: mean seconds
#        between kills, default 150),
#        TFRA_ARGS="--files dynamic_embedding_ops_test.py" (make test-tfra),
#        VERBOSE=1 (TensorFlow's full C++ log; see "Quiet by default" below).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

ROOT        := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV        := $(ROOT)/.venv
PYTHON      ?= python3.11
BAZEL       ?= bazel
BAZEL_FLAGS ?=
TESTS       ?= //...
DEMO_ARGS   ?=
BENCH_ARGS  ?=
TFRA_ARGS   ?=
APT_PKGS    := bazel-bootstrap bazel-bootstrap-source libgtest-dev build-essential \
               cmake libopenmpi-dev openmpi-bin clang-format clang
STAMP       := $(ROOT)/.setup-stamp
BENCH_STAMP := $(ROOT)/.bench-stamp
DOCS_STAMP  := $(ROOT)/.docs-stamp
DEVELOP_STAMP := $(ROOT)/.develop-stamp
# The built libraries, as paths in the package and (prefixed with //:) Bazel targets: OP_LIBRARY
# and every plugin of third_party/sources.bzl (tests/build/test_capabilities.py checks the list).
LIBRARIES   := tf_ext/_tf_ext_ops.so tf_ext/harp/libnccl-net-harp.so

# Horovod's wheel is cached outside the work tree (third_party/install_horovod.sh, which holds its
# one pin): in TF_EXT_CACHE_DIR, declared in tf_ext/settings.py.
TF_EXT_CACHE_DIR  := $(or $(TF_EXT_CACHE_DIR),$(HOME)/.cache/tf_ext)

# Every command (bazel included) sees the venv first: the @local_tensorflow repository rule and
# py_test both use the first python3 on PATH. Build actions run with a fixed PATH
# (--incompatible_strict_action_env), so a different PATH costs only a re-run of the TensorFlow
# probe (seconds) and of the tests (--test_env=PATH), never a rebuild.
export PATH := $(VENV)/bin:$(PATH)

# Quiet by default. TensorFlow's C++ log below ERROR is off (TF_CPP_MIN_LOG_LEVEL=2: INFO lines
# such as the oneDNN and CPU-feature notices, WARNING lines such as "TF-TRT Warning: Could not
# find TensorRT"); errors stay visible, except three ERROR lines that every `import tensorflow`
# of TF 2.15 prints, GPU or not ("Unable to register cuDNN/cuFFT/cuBLAS factory": its XLA CUDA
# plugins register twice; harmless), which `quiet` drops from the stderr of demo and benchmarks.
# Level 3 would hide those too, but also every real C++ error. VERBOSE=1 shows everything, and a
# TF_CPP_MIN_LOG_LEVEL in the environment is respected.
TF_IMPORT_NOISE := Unable to register (cuDNN|cuFFT|cuBLAS) factory
ifeq ($(VERBOSE),1)
export TF_CPP_MIN_LOG_LEVEL := 0
quiet = $(1)
BAZEL_BUILD_UI :=
else
# `make build`: Bazel's progress and INFO lines off (errors and warnings stay).
BAZEL_BUILD_UI := --noshow_progress --ui_event_filters=-info,-progress --show_result=0
export TF_CPP_MIN_LOG_LEVEL ?= 2
# $(call quiet,COMMAND): COMMAND with the lines above dropped from its stderr. Only stderr goes
# through grep (stdout stays the terminal, for Keras's progress bar); the status is COMMAND's.
quiet = { $(1) 2>&1 1>&3 3>&- | { grep --line-buffered -v -E '$(TF_IMPORT_NOISE)' || true; } 1>&2; } 3>&1
endif

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# The header above, the one list of targets (it ends at the first line that is not a comment).
MAKEFILE_HEADER := sed -n '/^[^\#]/q;p' $(ROOT)/Makefile
.PHONY: $(sort all $(shell $(MAKEFILE_HEADER) | grep -oE 'make [a-z][a-z-]*' | cut -c6-))

all: build

help:
	@$(MAKEFILE_HEADER) | sed 's/^# \{0,1\}//'

# docs-deps too: make test builds the docs site (tests/docs).
setup: apt venv horovod docs-deps

# apt only when a package is missing. Debian's own python3.11 (used when there is no pyenv one) needs
# python3.11-venv for `python3.11 -m venv`.
apt:
	@pkgs="$(APT_PKGS)"; py="$$(command -v $(PYTHON) || true)"; \
	case "$$py" in ""|/usr/bin/*) pkgs="$$pkgs python3.11 python3.11-venv";; esac; \
	missing=""; \
	for p in $$pkgs; do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "[setup] apt-get install:$$missing"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else \
	  echo "[setup] system packages present"; \
	fi

# The stamp records the interpreter and a hash of requirements.txt: pip runs only when either changed
# or the venv is missing.
venv: apt
	@want="$$($(PYTHON) -c 'import sys; print(sys.version.split()[0])') $$(sha256sum requirements.txt | cut -d' ' -f1)"; \
	if [ -x "$(VENV)/bin/python" ] && [ -f "$(STAMP)" ] && [ "$$(cat $(STAMP))" = "$$want" ]; then \
	  echo "[setup] .venv up to date"; \
	else \
	  [ -x "$(VENV)/bin/python" ] || { echo "[setup] creating .venv with $(PYTHON)"; $(PYTHON) -m venv "$(VENV)"; }; \
	  echo "[setup] pip install -r requirements.txt"; \
	  "$(VENV)/bin/python" -m pip install -q -r requirements.txt; \
	  echo "$$want" > "$(STAMP)"; \
	fi

horovod: venv
	@$(ROOT)/third_party/install_horovod.sh "$(VENV)/bin/python" "$(TF_EXT_CACHE_DIR)"

# $(call pip_when_changed,REQUIREMENTS,STAMP,TAG): pip install -r REQUIREMENTS into .venv, unless
# STAMP holds the file's hash from the last install.
pip_when_changed = want="$$(sha256sum $(1) | cut -d' ' -f1)"; \
	if [ -f "$(2)" ] && [ "$$(cat $(2))" = "$$want" ]; then :; else \
	  echo "[$(3)] pip install -r $(1)"; \
	  "$(VENV)/bin/python" -m pip install -q -r $(1); \
	  echo "$$want" > "$(2)"; \
	fi

bench-deps: setup
	@$(call pip_when_changed,requirements-bench.txt,$(BENCH_STAMP),bench)

# The docs site's generator (requirements-docs.txt, pinned), when that file changed.
docs-deps: venv
	@$(call pip_when_changed,requirements-docs.txt,$(DOCS_STAMP),setup)

# Strict: a broken link or anchor, a public name without a docstring or missing from the API
# reference fails the build (mkdocs.yml, docs/hooks/public_api.py). tf_ext is read from this
# checkout; the op library is not needed. Horovod is: the reference imports tf_ext.lightcc.
docs: horovod docs-deps
	@cd $(ROOT) && start=$$(date +%s) && \
	  $(call quiet,NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(ROOT) $(VENV)/bin/mkdocs build --strict --quiet --site-dir site) && \
	  echo "[docs] site/index.html ($$(( $$(date +%s) - start ))s)"

# `install` replaces each file (a new inode, a fresh mtime): running processes keep the library they
# loaded, and setup.py sees the copies as newer than the sources (so `develop` compiles nothing).
build: setup
	@start=$$(date +%s); \
	$(BAZEL) build $(BAZEL_BUILD_UI) $(BAZEL_FLAGS) $(addprefix //:,$(LIBRARIES)); \
	for lib in $(LIBRARIES); do install -m 0755 "bazel-bin/$$lib" "$$lib"; done; \
	echo "[build] $(LIBRARIES) ($$(( $$(date +%s) - start ))s)"
	@$(MAKE) --no-print-directory develop

# Editable install of this checkout into .venv: `.venv/bin/python my_script.py` imports tf_ext from
# any directory. Runs pip only when the packaging inputs changed or .venv's tf_ext is not this
# checkout (a new venv, another clone). Without `make build` first, pip compiles the libraries
# itself with g++ (minutes).
DEVELOP_CHECK := import json, sys, importlib.metadata as m; \
                 url = json.loads(m.distribution("tf_ext").read_text("direct_url.json"))["url"]; \
                 sys.exit(url != "file://$(ROOT)")
develop:
	@want="$(ROOT) $$(cd $(ROOT) && cat pyproject.toml setup.py third_party/sources.bzl | sha256sum | cut -c1-16)"; \
	if [ -f "$(DEVELOP_STAMP)" ] && [ "$$(cat $(DEVELOP_STAMP))" = "$$want" ] && \
	   "$(VENV)/bin/python" -c '$(DEVELOP_CHECK)' 2>/dev/null; then :; else \
	  echo "[build] pip install -e . (editable tf_ext in .venv)"; \
	  "$(VENV)/bin/python" -m pip install -q --no-build-isolation --no-deps -e "$(ROOT)"; \
	  echo "$$want" > "$(DEVELOP_STAMP)"; \
	fi

# C++ sources under the project's own folders (not bazel-*, not .venv), the benchmarks' included.
CXX_SOURCES = $$(find kernels ops tests benchmarks -name '*.cc' -o -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')

lint: venv
	@$(VENV)/bin/ruff format --check --quiet . || { echo "[lint] Python is not formatted: run make format"; exit 1; }
	@$(VENV)/bin/ruff check --quiet .
	@clang-format --dry-run --Werror $(CXX_SOURCES)
	@echo "[lint] ok"

format: venv
	@$(VENV)/bin/ruff format --quiet .
	@$(VENV)/bin/ruff check --quiet --fix . || true
	@clang-format -i $(CXX_SOURCES)

# build first: the tests of the editable install need it (and bazel test reuses the build).
test: setup lint build
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	rc=0; $(BAZEL) test $(BAZEL_FLAGS) $(TESTS) 2>&1 | tee "$$log" || rc=$$?; \
	echo; echo "================================ test summary ================================"; \
	grep -E '^//[^ ]+ +.*(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|SKIPPED|INCOMPLETE|FAILED TO BUILD)' "$$log" || true; \
	grep -E '^(Executed|INFO: Build completed|FAILED: Build did NOT complete)' "$$log" | awk '!seen[$$0]++' | tail -n 3 || true; \
	$(VENV)/bin/python tests/count_results.py "$$($(BAZEL) info bazel-testlogs 2>/dev/null)" "$$log" || true; \
	if [ $$rc -eq 0 ]; then echo "RESULT: all tests passed"; \
	else echo "RESULT: FAILED (bazel exit code $$rc; logs under bazel-testlogs/)"; fi; \
	exit $$rc

# The C++ core tests (TensorFlow-free: tests/kernels/) under ThreadSanitizer and AddressSanitizer;
# not the *_tf_test.cc, which link TensorFlow's prebuilt libraries (built without sanitizers).
CORE_TESTS = $(patsubst tests/%.cc,//tests:%,$(filter-out %_tf_test.cc,$(wildcard tests/kernels/*/*_test.cc)))
sanitize: setup
	@cd $(ROOT) && $(BAZEL) test --config=tsan $(BAZEL_FLAGS) $(CORE_TESTS) && \
	  $(BAZEL) test --config=asan $(BAZEL_FLAGS) $(CORE_TESTS) && echo "RESULT: sanitizers clean"

# The op fuzzer, longer than `make test`'s run of it: EXAMPLES calls per op and mode, a new
# seed each run (printed; SEED=N repeats a run), a failing call shrunk and printed as corpus JSON.
EXAMPLES  ?= 1000
SEED      ?=
FUZZ_SEED := $(or $(SEED),$(shell echo $$RANDOM))
fuzz-ops: build
	@cd $(ROOT) && start=$$(date +%s) && echo "[fuzz-ops] $(EXAMPLES) calls per op and mode, SEED=$(FUZZ_SEED)" && \
	  $(call quiet,FUZZ_OPS_EXAMPLES=$(EXAMPLES) FUZZ_OPS_SEED=$(FUZZ_SEED) FUZZ_OPS_SHRINK=1 PYTHONPATH=$(ROOT) \
	    $(VENV)/bin/python -m pytest -q -s -p no:cacheprovider tests/fuzz/test_ops_fuzz.py) && \
	  echo "[fuzz-ops] no crash, hang or allocation past the bound ($$(( $$(date +%s) - start ))s)"

# The native fuzzers, longer than `make test`'s 5 s each: every libFuzzer harness under
# tests/kernels/*/fuzz/ for FUZZ_SECONDS (clang from `make setup`). New inputs go to build/fuzz/;
# a crashing input is printed and left in build/fuzz/artifacts/.
FUZZ_SECONDS ?= 300
fuzz: apt
	@cd $(ROOT) && tests/fuzz/native_fuzz.sh --seconds $(FUZZ_SECONDS)

# tests/build/test_quiet_output.py runs `make -o build demo DEMO_ARGS=--quick` and checks its output.
demo: build
	@cd $(ROOT) && $(call quiet,PYTHONPATH=$(ROOT) $(VENV)/bin/python examples/train_ctr.py $(DEMO_ARGS))

demo-estimator: build
	@cd $(ROOT) && $(call quiet,PYTHONPATH=$(ROOT) $(VENV)/bin/python examples/estimator_columns.py $(DEMO_ARGS))

# The benchmarks: `make TARGET` runs the scripts BENCH.TARGET names (under benchmarks/, in order),
# each with BENCH_FLAGS.TARGET and BENCH_ARGS (BENCH_ARGS=--quick: a short run, for those that
# have one). Their charts go to build/charts/ (--png benchmarks/NAME.png, or --plot / --out, updates
# a committed one). Those in BENCH_AS_ROOT build network namespaces: they run as root (sudo when not
# root; sudo drops the environment, so the settings they need are passed explicitly).
BENCH.bench              := lookup.py
BENCH.bench-lifecycle    := eviction.py bulk_insert.py admission.py small_tables.py checkpoint.py \
                            serving_export.py
BENCH.soak               := soak.py
BENCH.bench-quality      := quality.py
BENCH.bench-initial-rows := initial_rows.py
BENCH.bench-fusion       := embedding_fusion.py
BENCH.bench-jit          := jit_cache.py
BENCH.bench-jit-profile  := jit_op_profile.py
BENCH.bench-jit-session  := jit_cache_session.py
BENCH.bench-jit-verdicts := speed_check_verdicts.py
BENCH.bench-amp          := amp.py
BENCH.bench-cluster      := lightcc_cluster.py
BENCH.bench-scaling      := lightcc_scaling.py
BENCH.bench-alltoall     := alltoall_tables.py
BENCH.bench-tfra         := tfra_compat.py
BENCH.bench-tfra-quality := tfra_quality.py
BENCH.bench-harp         := harp_transport.py
BENCH_TARGETS := $(patsubst BENCH.%,%,$(filter BENCH.%,$(.VARIABLES)))
BENCH_AS_ROOT := bench-cluster bench-scaling bench-alltoall bench-harp
# Those that need only the op library (no requirements-bench.txt).
BENCH_BUILD_ONLY := bench-jit-profile bench-jit-verdicts bench-initial-rows

# Headline figures are the median of several fresh processes (benchmarks/repeat.py): a lookup's
# ratio moves with the process by more than the changes it is there to catch.
BENCH_RUNS ?= 5
BENCH_RUNS.bench := $(BENCH_RUNS)

# The soak run exits 1 on a lost row, a restore that differs from its save or a child that fails.
SOAK_MINUTES       ?= 30
SOAK_KILL_INTERVAL ?= 150
BENCH_FLAGS.soak := --minutes $(SOAK_MINUTES) --kill-interval $(SOAK_KILL_INTERVAL) \
                    --json build/soak/soak.json

bench_runner = $(if $(filter $(1),$(BENCH_AS_ROOT)),$(SUDO) env PYTHONPATH=$(ROOT) \
  TF_CPP_MIN_LOG_LEVEL=$(TF_CPP_MIN_LOG_LEVEL),env PYTHONPATH=$(ROOT))

$(BENCH_TARGETS): build
$(filter-out $(BENCH_BUILD_ONLY),$(BENCH_TARGETS)): bench-deps
$(BENCH_TARGETS):
	@cd $(ROOT) && for script in $(BENCH.$@); do \
	  $(call quiet,$(call bench_runner,$@) $(VENV)/bin/python $(if $(BENCH_RUNS.$@),benchmarks/repeat.py --runs $(BENCH_RUNS.$@) $$script,benchmarks/$$script) $(BENCH_FLAGS.$@) $(BENCH_ARGS)); \
	done

test-tfra: build
	@cd $(ROOT) && $(VENV)/bin/python tests/dynamic_embedding/tfra/run_tfra_suite.py --impl tf_ext \
	  --python $(VENV)/bin/python $(TFRA_ARGS)

# NCCL end to end through HARP's plugin, for a GPU machine with PyTorch and NCCL (the script needs no
# TensorFlow; its ranks run under TORCH_PYTHON, default the venv's Python): two ranks on one GPU,
# HARP's plugin against NCCL's Socket transport, results and NCCL's logs checked. Root (sudo when
# not root) only with BENCH_ARGS="--netns aggregate" or "--netns cloud"; BENCH_ARGS=--dry-run
# prints each rank's command and environment without a GPU. It runs the ranks under an MPS daemon
# of its own (--mps auto): without one, two processes on one GPU take turns and hide the network.
bench-harp-nccl: build bench-deps
	@cd $(ROOT) && $(if $(findstring --netns,$(BENCH_ARGS)),$(SUDO)) \
	  $(or $(TORCH_PYTHON),$(VENV)/bin/python) benchmarks/harp_nccl_e2e.py $(BENCH_ARGS)

gpu-checks:
	@cd $(ROOT) && sh tests/kernels/dynamic_embedding/gpu/build_gpu_checks.sh

test-gpu: gpu-checks
	@cd $(ROOT) && sh tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh

bench-gpu-table: bench-deps
	@cd $(ROOT) && $(VENV)/bin/python benchmarks/gpu_table.py \
	  --chart $(or $(RESULTS),build/gpu/out/gpu_table.json) --png benchmarks/gpu_table.png

clean:
	-$(BAZEL) clean
	rm -rf $(LIBRARIES) build/ dist/ site/ *.egg-info .pytest_cache $(DEVELOP_STAMP)
	find . -path ./.venv -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Also drop the venv and Bazel's cached repositories.
distclean: clean
	-$(BAZEL) clean --expunge
	rm -rf $(VENV) $(STAMP) $(BENCH_STAMP) $(DOCS_STAMP)

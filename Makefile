# tf_ext developer entry points. Everything runs offline except `setup` (apt + PyPI).
#
#   make setup   system packages (apt) + .venv with requirements.txt; a no-op when already done
#   make build   bazel build the op library, copy it to tf_ext/_tf_ext_ops.so
#   make test    bazel test //... (googletest for the core, pytest for the Python package)
#   make demo    examples/train_ctr.py
#   make bench   benchmarks/lookup.py (installs requirements-bench.txt: the TFRA baseline)
#   make clean   bazel clean + built artefacts
#
# Knobs: BAZEL_FLAGS="--jobs=1" (e.g. while something else compiles), PYTHON=python3.11,
#        TESTS="//tests:..." (targets for `make test`), DEMO_ARGS="--quick", BENCH_ARGS="--no-tfra".

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
APT_PKGS    := bazel-bootstrap bazel-bootstrap-source libgtest-dev build-essential
STAMP       := $(ROOT)/.setup-stamp
BENCH_STAMP := $(ROOT)/.bench-stamp
SO_TARGET   := //:tf_ext/_tf_ext_ops.so
SO          := tf_ext/_tf_ext_ops.so

# Every command (bazel included) sees the venv first: the @local_tensorflow repository rule and
# py_test both use the first python3 on PATH. Build actions run with a fixed PATH
# (--incompatible_strict_action_env), so a different PATH costs only a re-run of the TensorFlow
# probe (seconds) and of the tests (--test_env=PATH), never a rebuild.
export PATH := $(VENV)/bin:$(PATH)
export TF_CPP_MIN_LOG_LEVEL ?= 1

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: all setup apt venv bench-deps build test demo bench clean distclean

all: build

setup: apt venv

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

bench-deps: setup
	@want="$$(sha256sum requirements-bench.txt | cut -d' ' -f1)"; \
	if [ -f "$(BENCH_STAMP)" ] && [ "$$(cat $(BENCH_STAMP))" = "$$want" ]; then :; else \
	  echo "[bench] pip install -r requirements-bench.txt"; \
	  "$(VENV)/bin/python" -m pip install -q -r requirements-bench.txt; \
	  echo "$$want" > "$(BENCH_STAMP)"; \
	fi

build: setup
	@start=$$(date +%s); \
	$(BAZEL) build $(BAZEL_FLAGS) $(SO_TARGET); \
	install -m 0755 bazel-bin/$(SO) $(SO); \
	echo "[build] $(SO) ($$(( $$(date +%s) - start ))s)"

test: setup
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	rc=0; $(BAZEL) test $(BAZEL_FLAGS) $(TESTS) 2>&1 | tee "$$log" || rc=$$?; \
	echo; echo "================================ test summary ================================"; \
	grep -E '^//[^ ]+ +.*(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|SKIPPED|INCOMPLETE|FAILED TO BUILD)' "$$log" || true; \
	grep -E '^(Executed|INFO: Build completed|FAILED: Build did NOT complete)' "$$log" | awk '!seen[$$0]++' | tail -n 3 || true; \
	labels=$$(grep -oE '^//[^ ]+' "$$log" | sort -u); \
	$(VENV)/bin/python tests/count_results.py "$$($(BAZEL) info bazel-testlogs 2>/dev/null)" $$labels || true; \
	if [ $$rc -eq 0 ]; then echo "RESULT: all tests passed"; \
	else echo "RESULT: FAILED (bazel exit code $$rc; logs under bazel-testlogs/)"; fi; \
	exit $$rc

demo: build
	cd $(ROOT) && PYTHONPATH=$(ROOT) $(VENV)/bin/python examples/train_ctr.py $(DEMO_ARGS)

bench: build bench-deps
	cd $(ROOT) && PYTHONPATH=$(ROOT) $(VENV)/bin/python benchmarks/lookup.py $(BENCH_ARGS)

clean:
	-$(BAZEL) clean
	rm -rf $(SO) build/ dist/ *.egg-info .pytest_cache
	find . -path ./.venv -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Also drop the venv and Bazel's cached repositories.
distclean: clean
	-$(BAZEL) clean --expunge
	rm -rf $(VENV) $(STAMP) $(BENCH_STAMP)

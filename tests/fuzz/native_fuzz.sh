#!/usr/bin/env bash
# Issue 37's native fuzzers: builds each libFuzzer harness (tests/kernels/<capability>/fuzz/
# <name>_fuzzer.cc) with AddressSanitizer and UndefinedBehaviorSanitizer against its capability's
# TensorFlow-free core (the core_srcs of third_party/sources.bzl, with those of its deps), then runs
# it for SECONDS on its checked-in corpus (tests/kernels/<capability>/fuzz/corpus/<name>/).
#
#   tests/fuzz/native_fuzz.sh [--seconds N] [--out DIR] [NAME ...]   (default: 20 s each, all)
#
# New inputs go to a scratch corpus under DIR (default build/fuzz), never into the checked-in one;
# a crashing input is written to DIR/artifacts/ and the script fails, naming it. Each harness's last
# libFuzzer status line (executions, cov:, ft:) is printed as "[fuzz] <name>: ...".
# Any sanitizer report, and any allocation over MALLOC_LIMIT_MB (the readers must not allocate what
# an untrusted size field asks for), is a crash.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_EACH=20
OUT="$ROOT/build/fuzz"
MALLOC_LIMIT_MB="${MALLOC_LIMIT_MB:-32}"
CXX="${FUZZ_CXX:-clang++}"
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done

if ! command -v "$CXX" >/dev/null; then
  echo "[fuzz] $CXX not found: the native fuzzers need clang with libFuzzer (Debian's clang;" \
       "\`make setup\` installs it)" >&2
  exit 2
fi

cd "$ROOT"
mapfile -t harnesses < <(find tests/kernels -path '*/fuzz/*_fuzzer.cc' | sort)
if [ ${#names[@]} -gt 0 ]; then
  selected=()
  for name in "${names[@]}"; do
    match=$(printf '%s\n' "${harnesses[@]}" | grep "/${name}_fuzzer.cc$" || true)
    [ -n "$match" ] || { echo "[fuzz] no harness named $name" >&2; exit 2; }
    selected+=("$match")
  done
  harnesses=("${selected[@]}")
fi
[ ${#harnesses[@]} -gt 0 ] || { echo "[fuzz] no harness found under tests/kernels/*/fuzz/" >&2; exit 2; }

# A capability's core sources and those of its deps, from the one source list.
core_sources() {
  python3 third_party/build_description.py core-sources "$1"
}

mkdir -p "$OUT/bin" "$OUT/artifacts"
failed=()
for harness in "${harnesses[@]}"; do
  capability=$(echo "$harness" | cut -d/ -f3)
  name=$(basename "$harness" _fuzzer.cc)
  binary="$OUT/bin/${name}_fuzzer"
  mapfile -t sources < <(core_sources "$capability")
  echo "[fuzz] building $name (${#sources[@]} core sources of $capability)"
  "$CXX" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -pthread -I. "$harness" "${sources[@]}" -o "$binary"
  seeds="tests/kernels/$capability/fuzz/corpus/$name"
  work="$OUT/corpus/$name"
  mkdir -p "$work"
  log="$OUT/$name.log"
  rm -f "$OUT/artifacts/$name-"*
  echo "[fuzz] running $name for ${SECONDS_EACH}s on $seeds"
  if UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     "$binary" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
       -malloc_limit_mb="$MALLOC_LIMIT_MB" -print_final_stats=1 \
       -artifact_prefix="$OUT/artifacts/$name-" "$work" "$seeds" >"$log" 2>&1; then
    status=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    runs=$(grep -E 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    rate=$(grep -E 'stat::average_exec_per_sec' "$log" | awk '{print $2}')
    echo "[fuzz] $name: $runs executions, $rate/s; last status: $status"
  else
    echo "[fuzz] $name FAILED; the end of its log ($log):"
    tail -n 60 "$log"
    ls "$OUT/artifacts/$name-"* 2>/dev/null | sed 's/^/[fuzz] crashing input: /' || true
    failed+=("$name")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "[fuzz] FAILED: ${failed[*]}"
  exit 1
fi
echo "[fuzz] no crash in ${#harnesses[@]} harnesses (${SECONDS_EACH}s each)"

#!/bin/sh
# The GPU checks of the GPU table core, in one short run on a GPU machine (no TensorFlow needed):
# the googletest cases on the CUDA table (every operation, and the CPU-vs-GPU equivalence run),
# compute-sanitizer memcheck and racecheck where the machine has it, and the benchmark side by side
# with HierarchicalKV (benchmarks/gpu_table.py). Needs build/gpu/ from tests/kernels/dynamic_embedding/gpu/build_gpu_checks.sh
# (make gpu-checks). Logs and results go to $OUT (default build/gpu/out). Prints
# "GPU checks: passed" or "GPU checks: failed (...)".
#
# --dry-run: on a machine without a GPU, run what runs there (the host backends) and check that the
# GPU parts fail cleanly with "no CUDA device".
set -u
cd "$(dirname "$0")/../../../.."
bin=build/gpu
out=${OUT:-build/gpu/out}
mkdir -p "$out"
failed=""
step() {  # step NAME SECONDS COMMAND...: runs it for at most SECONDS, logs to $out/NAME.log
  name=$1
  seconds=$2
  shift 2
  echo "== $name: $*"
  start=$(date +%s)
  # A hung step must not take the lease's few minutes from the steps after it.
  if timeout "$seconds" "$@" >"$out/$name.log" 2>&1; then
    echo "   ok ($(($(date +%s) - start)) s)"
  else
    echo "   FAILED ($(($(date +%s) - start)) s); last lines:"
    tail -20 "$out/$name.log" | sed 's/^/   | /'
    failed="$failed $name"
  fi
}

if [ "${1:-}" = "--dry-run" ]; then
  step device_table_test 120 "$bin/device_table_test"
  if "$bin/gpu_table_bench" --dims 8 --load-factors 0.5 >"$out/bench_dry.log" 2>&1 ||
    ! grep -q "no CUDA device" "$out/bench_dry.log"; then
    failed="$failed gpu_table_bench(expected 'no CUDA device')"
  fi
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1
  cat "$out/gpu.txt"
  step device_table_test 90 env TF_EXT_REQUIRE_GPU=1 "$bin/device_table_test"
  # The figures before the sanitizers: they are what a short lease must not lose.
  step benchmark 200 python3 benchmarks/gpu_table.py --run --bin "$bin" --out "$out"
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$sanitizer" ]; then
    # The cuda cases only, small enough for the sanitizers' slowdown. memcheck leaves out the case
    # that exhausts device memory on purpose (it reports each failed cudaMalloc as an error);
    # racecheck, the slowest, takes the cases of the tiled probes and row copies.
    memcheck_cases='*/cuda:-*LongRandom*:*ExhaustedMemory*'
    racecheck_cases='*MissingKeys*/cuda:*FindOrInsert*/cuda:*InsertOrAssign*/cuda:*Admission*/cuda'
    step memcheck 100 "$sanitizer" --tool memcheck --error-exitcode 1 "$bin/device_table_test" --gtest_filter="$memcheck_cases"
    step racecheck 100 "$sanitizer" --tool racecheck --error-exitcode 1 "$bin/device_table_test" --gtest_filter="$racecheck_cases"
  else
    echo "== compute-sanitizer: not on this machine" | tee "$out/sanitizer.log"
  fi
fi
if [ -z "$failed" ]; then
  echo "GPU checks: passed"
else
  echo "GPU checks: failed ($failed )"
  exit 1
fi

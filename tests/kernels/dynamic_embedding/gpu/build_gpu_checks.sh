#!/bin/sh
# Builds, on a machine with nvcc and no GPU, everything the GPU checks run (make gpu-checks), into
# build/gpu/ (git-ignored), each binary needing only libc (CUDA runtime, libstdc++ and googletest
# linked statically), for sm_80 and sm_90:
#   device_table_test   tests/kernels/dynamic_embedding/device_table_test.cc with the CUDA table
#   gpu_table_bench     benchmarks/gpu_table_bench.cc
#   hkv_benchmark       HierarchicalKV's own benchmark (benchmarks/hkv_benchmark_driver.cu), only
#                       when HKV_DIR names a checkout of github.com/NVIDIA-Merlin/HierarchicalKV;
#                       HKV's code stays outside tf_ext
# then dry-runs tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh here (its host backends; the GPU parts report no
# device). On a GPU machine, run tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh.
set -eu
cd "$(dirname "$0")/../../../.."
out=build/gpu
mkdir -p "$out"
# The table core's sources (it depends on no other capability), from the one source list.
sources=$(python3 third_party/build_description.py core-sources dynamic_embedding | tr '\n' ' ')
TF_EXT_CUDA=1 third_party/cuda_library.sh "$out/libdynamic_embedding_cuda.a" \
  kernels/dynamic_embedding/core/gpu/cuda_table.cu kernels/dynamic_embedding/core/gpu/no_cuda_table.cc
# The code-generation flags of the op library's builds (declared once, in .bazelrc).
CXXFLAGS="-std=c++17 $(python3 third_party/build_description.py codegen-flags) -pthread -I."
STATIC="-static-libstdc++ -static-libgcc"
libs="$out/libdynamic_embedding_cuda.a -ldl -lrt -pthread"
# shellcheck disable=SC2086
g++ $CXXFLAGS $STATIC -o "$out/device_table_test" tests/kernels/dynamic_embedding/device_table_test.cc \
  $sources /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgtest.a $libs
# shellcheck disable=SC2086
g++ $CXXFLAGS $STATIC -o "$out/gpu_table_bench" benchmarks/gpu_table_bench.cc $sources $libs
if [ -n "${HKV_DIR:-}" ]; then
  nvcc -std=c++17 -O3 --extended-lambda -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_80,code=sm_80 -I"$HKV_DIR" -I"$HKV_DIR/include" \
    -I"$HKV_DIR/benchmark" -Xcompiler -static-libstdc++ -o "$out/hkv_benchmark" \
    benchmarks/hkv_benchmark_driver.cu
fi
ls -la "$out"
echo "[gpu-checks] built; dry run (no GPU here):"
sh tests/kernels/dynamic_embedding/gpu/run_gpu_checks.sh --dry-run

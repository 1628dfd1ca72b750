#!/bin/sh
# Builds a capability's CUDA sources into a static archive, for both builds (Bazel's genrule in
# third_party/capabilities.bzl, and setup.py). With TF_EXT_CUDA (settings: tf_ext) set to
#   auto (default)  CUDA where nvcc is found, else the fallback
#   1               CUDA, and an error without nvcc
#   0               the fallback
# the archive holds the nvcc-compiled sources and the CUDA runtime (linked statically: the op
# library then needs no CUDA library at load time, and a machine without a GPU loads it as before),
# or the fallback sources compiled by the C++ compiler, which say that this build has no CUDA.
#
# usage: cuda_library.sh OUT_ARCHIVE "CUDA_SOURCES" "FALLBACK_SOURCES"   (run at the source root)
set -eu
out=$1
cuda_sources=$2
fallback_sources=$3
mode=${TF_EXT_CUDA:-auto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

case "$mode" in
  auto | 0 | 1) ;;
  *) echo "TF_EXT_CUDA must be auto, 0 or 1, got '$mode'" >&2; exit 1 ;;
esac

nvcc=""
if [ "$mode" != 0 ]; then nvcc=$(command -v nvcc || true); fi
if [ -z "$nvcc" ] && [ "$mode" = 1 ]; then
  echo "TF_EXT_CUDA=1 but nvcc is not on the PATH" >&2
  exit 1
fi

cudart=""
if [ -n "$nvcc" ]; then
  for root in "${CUDA_HOME:-}" "$(dirname "$(dirname "$nvcc")")" /usr/local/cuda; do
    if [ -n "$root" ] && [ -f "$root/lib64/libcudart_static.a" ]; then
      cudart="$root/lib64/libcudart_static.a"
      break
    fi
  done
  if [ -z "$cudart" ]; then
    echo "nvcc found at $nvcc, but not libcudart_static.a (set CUDA_HOME)" >&2
    exit 1
  fi
fi

# sm_80 (A100), sm_90 (H100, H200), and PTX of sm_90 for newer GPUs. No fused multiply-adds: the
# GPU table computes exactly what the CPU table does (kernels/dynamic_embedding/core/host_device.h).
NVCC_FLAGS="-std=c++17 -O3 -fmad=false --extended-lambda -Xcompiler -fPIC
  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  -gencode arch=compute_90,code=compute_90 -I."

n=0
if [ -n "$nvcc" ]; then
  for src in $cuda_sources; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    "$nvcc" $NVCC_FLAGS -c "$src" -o "$work/$n.o"
  done
  # The runtime's objects go into the same archive, so linking it needs only -ldl -lrt.
  mkdir "$work/cudart" && (cd "$work/cudart" && ar x "$cudart")
  for obj in "$work"/cudart/*.o; do mv "$obj" "$work/cudart_$(basename "$obj")"; done
else
  for src in $fallback_sources; do
    n=$((n + 1))
    "${CXX:-g++}" -std=c++17 -O2 -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -I. -c "$src" -o "$work/$n.o"
  done
fi
rm -f "$out"
ar rcs "$out" "$work"/*.o

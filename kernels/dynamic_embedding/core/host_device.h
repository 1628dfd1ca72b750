// What lets one function body run both on the CPU and in a CUDA kernel: the table core's
// initial rows and optimizer steps are written once, so the GPU table computes exactly what the
// CPU table does.
//
// TF_EXT_HOST_DEVICE marks such a function: __host__ __device__ under nvcc, nothing otherwise.
// In it, call the global C math functions (::sqrt, ::log, ::cos, ::pow, sqrtf, powf), which both
// sides have. The GPU code is compiled without contracting a * b + c into one fused multiply-add
// (nvcc -fmad=false), as the CPU build (-march=x86-64-v2, which has no FMA) never does, so every
// float and double operation rounds the same on both sides. The remaining difference is the
// double log, cos and pow of the device's math library, within 2 ulp of glibc's.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_HOST_DEVICE_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define TF_EXT_HOST_DEVICE __host__ __device__
#else
#define TF_EXT_HOST_DEVICE
#endif

namespace tf_ext {
namespace de {

// std::max and std::min, including their answer when an argument is NaN (the first one), which
// fmaxf and fminf do not share.
template <typename T>
TF_EXT_HOST_DEVICE inline T MaxOf(T a, T b) {
  return (a < b) ? b : a;
}
template <typename T>
TF_EXT_HOST_DEVICE inline T MinOf(T a, T b) {
  return (b < a) ? b : a;
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_HOST_DEVICE_H_

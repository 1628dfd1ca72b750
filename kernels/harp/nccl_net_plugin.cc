// The exported C interface of tf_ext/harp/libnccl-net-harp.so (NCCL finds network plugins by the
// file name libnccl-net-<name>.so). The library is built with hidden visibility, so only what is
// marked here is exported. For now that is harp_build_info(); the ncclNetPlugin_v* tables follow.
#include "kernels/harp/core/build_info.h"

extern "C" __attribute__((visibility("default"))) const char* harp_build_info() {
  return tf_ext::harp::BuildInfo();
}

// HARP, tf_ext's NCCL network plugin: what the plugin library reports about itself.
// Plain C++17 with no TensorFlow: NCCL loads the plugin into processes that may not run
// TensorFlow at all. The NCCL net interface itself (ncclNetPlugin_v*) comes later.
#ifndef TF_EXT_KERNELS_HARP_CORE_BUILD_INFO_H_
#define TF_EXT_KERNELS_HARP_CORE_BUILD_INFO_H_

// The package version (pyproject.toml); tests/build/test_harp_library.py checks they agree.
#define TF_EXT_HARP_VERSION "0.1.0"

// Everything of HARP's C++ is hidden from the plugin's dynamic symbol table, including the
// template instantiations (std::function, std::thread state) that involve its types: NCCL's
// process sees only the exported C tables. -fvisibility=hidden alone leaves those instantiations
// default-visible, as the std namespace is declared default-visible.
#define HARP_HIDDEN __attribute__((visibility("hidden")))

namespace tf_ext {
namespace harp HARP_HIDDEN {

// "tf_ext-harp <version>", a static string.
const char* BuildInfo();

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_HARP_CORE_BUILD_INFO_H_

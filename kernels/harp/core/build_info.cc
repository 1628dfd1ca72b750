#include "kernels/harp/core/build_info.h"

namespace tf_ext {
namespace harp {

const char* BuildInfo() { return "tf_ext-harp " TF_EXT_HARP_VERSION; }

}  // namespace harp
}  // namespace tf_ext

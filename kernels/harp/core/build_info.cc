#include "kernels/harp/core/build_info.h"

namespace tf_ext {
namespace harp HARP_HIDDEN {

const char* BuildInfo() { return "tf_ext-harp " TF_EXT_HARP_VERSION; }

}  // namespace HARP_HIDDEN
}  // namespace tf_ext

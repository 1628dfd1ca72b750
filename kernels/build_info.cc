// What this op library was compiled against, as a marked string the Python loader finds in the
// file's bytes before loading it, so a TensorFlow version or ABI mismatch is reported plainly
// instead of as an undefined symbol or a crash. (Loading the file to ask would register the
// ops before tf.load_op_library could see them.) setup.py reads it too: it reuses an up-to-date
// library only if it was built for the running TensorFlow.
#include "tensorflow/core/public/version.h"

#define TF_EXT_STRINGIFY_INNER(x) #x
#define TF_EXT_STRINGIFY(x) TF_EXT_STRINGIFY_INNER(x)

extern "C" __attribute__((visibility("default"), used)) const char kTfExtBuildInfo[] =
    "TF_EXT_BUILD_INFO[tensorflow=" TF_EXT_STRINGIFY(TF_MAJOR_VERSION) "." TF_EXT_STRINGIFY(
        TF_MINOR_VERSION) "." TF_EXT_STRINGIFY(TF_PATCH_VERSION) TF_VERSION_SUFFIX
    ";cxx11_abi=" TF_EXT_STRINGIFY(_GLIBCXX_USE_CXX11_ABI) "]";

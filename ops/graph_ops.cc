// Op interfaces of the graph capability (graph passes and the compilation cache).
// Kernels: kernels/graph/.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_ext {

REGISTER_OP("TfExtXlaOngoingCompilations")
    .Output("ongoing: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Counts the asynchronous XLA compilations still running for this op's device.

TensorFlow's asynchronous compilation (--tf_xla_async_compilation) keeps compiling after the
step that asked for it, using the Session's function library: a Session closed meanwhile would
leave the compiler reading freed memory. tf_ext.jit.Bucketing runs this op before a Session
closes and waits until it returns 0. 0 when nothing has compiled on the device, and -1 where
this TensorFlow does not expose the count.

ongoing: the number of compilations in flight, or -1.
)doc");

}  // namespace tf_ext

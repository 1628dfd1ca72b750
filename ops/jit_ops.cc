// Op interfaces of the jit capability (tf_ext.jit's compilation cache in a Session).
// Kernels: kernels/jit/.
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

REGISTER_OP("TfExtXlaSpeedGate")
    .Input("args: T")
    .Output("ask: bool")
    .Attr("T: list(type) >= 0")
    .Attr("gate: string")
    .Attr("clusters: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Decides whether an XLA cluster asks XLA for its executable this step (the speed gate).

If not, the lazily compiled cluster runs as TensorFlow's function call.

Put in by tf_ext's speed-gate pass before a cluster's _XlaCompile; never built by hand. The
graph's timed steps decide (kernels/jit/core/speed_gate.h).

args: the cluster's inputs, counted in elements to compare steps of different shapes.
ask: whether _XlaCompile runs.
gate: the gate's key (one per graph instance, shared by its clusters).
clusters: the gated clusters' names, for the verdicts' log.
)doc");

REGISTER_OP("TfExtXlaSpeedGateReady")
    .Input("ready: bool")
    .Attr("gate: string")
    .Attr("clusters: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs)
    .Doc(R"doc(
Tells a cluster's speed gate whether XLA had an executable ready (_XlaCompile's second output).

ready: _XlaCompile's "compilation successful".
gate: the gate's key.
clusters: the gated clusters' names.
)doc");

}  // namespace tf_ext

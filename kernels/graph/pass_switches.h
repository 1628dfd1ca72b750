// The switches that apply to one graph: a session's own (its ConfigProto names
// graph::kConfigName among the custom optimizers) or else the process's.
#ifndef TF_EXT_KERNELS_GRAPH_PASS_SWITCHES_H_
#define TF_EXT_KERNELS_GRAPH_PASS_SWITCHES_H_

#include "kernels/graph/core/pass_switches.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"

namespace tf_ext {
namespace graph {

// Fails on a switch the ConfigProto names but this library does not know.
::tensorflow::Status SwitchesFor(const ::tensorflow::GraphOptimizationPassOptions& options,
                                 PassSwitches* switches);

}  // namespace graph
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_GRAPH_PASS_SWITCHES_H_

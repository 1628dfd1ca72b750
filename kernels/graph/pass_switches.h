// What tf_ext's graph passes share: the switches that apply to one graph (a session's own, when
// its ConfigProto names graph::kConfigName among the custom optimizers, or else the process's),
// and the edge surgery of a node's replacement.
#ifndef TF_EXT_KERNELS_GRAPH_PASS_SWITCHES_H_
#define TF_EXT_KERNELS_GRAPH_PASS_SWITCHES_H_

#include "kernels/graph/core/pass_switches.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/graph/graph.h"

namespace tf_ext {
namespace graph {

// The graph a pass rewrites: *graph is null when there is none or the pass's switch (a member of
// PassSwitches) is off for it. Fails on a switch the ConfigProto names but this library does not
// know.
::tensorflow::Status GraphToRewrite(const ::tensorflow::GraphOptimizationPassOptions& options,
                                    bool PassSwitches::*pass, ::tensorflow::Graph** graph);

// Moves the consumers of `from`'s output `from_output` (none for -1), and its control successors,
// to `to`'s output `to_output`.
::tensorflow::Status MoveConsumers(::tensorflow::Graph* graph, ::tensorflow::Node* from,
                                   int from_output, ::tensorflow::Node* to, int to_output);

}  // namespace graph
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_GRAPH_PASS_SWITCHES_H_

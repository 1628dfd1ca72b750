// Which nodes of a TensorFlow graph a walk along its edges reaches, over TensorFlow's own DFSFrom
// and ReverseDFSFrom. Shared by the graph passes of several capabilities (graph's embedding fusion
// and XLA dense clustering, mixed_precision's half rewrite): a common header of the op library.
#ifndef TF_EXT_KERNELS_REACHABLE_NODES_H_
#define TF_EXT_KERNELS_REACHABLE_NODES_H_

#include <vector>

#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/graph.h"

namespace tf_ext {

enum class Direction { kDownstream, kUpstream };  // along the edges, or against them

// Indexed by node id: the nodes a walk from `start` reaches in `direction`, the start nodes
// included, taking only the edges `follow` accepts (every edge when it is empty).
inline std::vector<bool> ReachableFrom(const ::tensorflow::Graph& graph,
                                       ::tensorflow::gtl::ArraySlice<::tensorflow::Node*> start,
                                       Direction direction,
                                       const ::tensorflow::EdgeFilter& follow = {}) {
  std::vector<bool> reached(graph.num_node_ids(), false);
  const auto enter = [&reached](::tensorflow::Node* node) { reached[node->id()] = true; };
  if (direction == Direction::kDownstream) {
    ::tensorflow::DFSFrom(graph, start, enter, /*leave=*/nullptr, /*stable_comparator=*/{}, follow);
  } else {
    ::tensorflow::ReverseDFSFrom(graph, start, enter, /*leave=*/nullptr, /*stable_comparator=*/{},
                                 follow);
  }
  return reached;
}

// Indexed by node id: the nodes at the end of a downstream path of one edge or more from `start`,
// taking only the edges `follow` accepts; so a start node only where such a path returns to it.
inline std::vector<bool> DownstreamOf(const ::tensorflow::Graph& graph,
                                      ::tensorflow::gtl::ArraySlice<::tensorflow::Node*> start,
                                      const ::tensorflow::EdgeFilter& follow = {}) {
  std::vector<::tensorflow::Node*> first_steps;
  for (const ::tensorflow::Node* node : start) {
    for (const ::tensorflow::Edge* edge : node->out_edges()) {
      if (!follow || follow(*edge)) first_steps.push_back(edge->dst());
    }
  }
  return ReachableFrom(graph, first_steps, Direction::kDownstream, follow);
}

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_REACHABLE_NODES_H_

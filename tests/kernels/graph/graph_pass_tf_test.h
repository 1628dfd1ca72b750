// For the C++ tests that run a graph pass (*_tf_test.cc): the pass as TensorFlow registered it,
// and a small graph builder. The passes are private to their files; a test runs the very object
// that TensorFlow runs, found by the phase kernels/pass_phases.h gives it and its class name.
#ifndef TF_EXT_TESTS_KERNELS_GRAPH_GRAPH_PASS_TF_TEST_H_
#define TF_EXT_TESTS_KERNELS_GRAPH_GRAPH_PASS_TF_TEST_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/pass_phases.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/public/session_options.h"

namespace tf_ext {
namespace pass_test {

// Success, or the status's message.
inline ::testing::AssertionResult Ok(const ::tensorflow::Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status.ToString();
}

// The registered pass named `name` (its class name) at `at`, or null.
inline ::tensorflow::GraphOptimizationPass* RegisteredPass(const PassPhase& at,
                                                           const std::string& name) {
  const auto& groups = ::tensorflow::OptimizationPassRegistry::Global()->groups();
  const auto group = groups.find(at.grouping);
  if (group == groups.end()) return nullptr;
  const auto phase = group->second.find(at.phase);
  if (phase == group->second.end()) return nullptr;
  for (const auto& pass : phase->second) {
    if (pass->name() == name) return pass.get();
  }
  return nullptr;
}

// The phase at which a pass named `name` is registered in `grouping`, or -1.
inline int RegisteredPhase(::tensorflow::OptimizationPassRegistry::Grouping grouping,
                           const std::string& name) {
  const auto& groups = ::tensorflow::OptimizationPassRegistry::Global()->groups();
  const auto group = groups.find(grouping);
  if (group == groups.end()) return -1;
  for (const auto& [phase, passes] : group->second) {
    for (const auto& pass : passes) {
      if (pass->name() == name) return phase;
    }
  }
  return -1;
}

// Runs `pass` on `graph` as TensorFlow would (session_options may be null: the process's
// switches then apply). The graph is first given the edges from its source and to its sink that
// TensorFlow's graphs have (the passes' walks start there), which NodeBuilder does not add.
inline ::tensorflow::Status RunPass(::tensorflow::GraphOptimizationPass* pass,
                                    std::unique_ptr<::tensorflow::Graph>* graph,
                                    const ::tensorflow::SessionOptions* session_options = nullptr) {
  ::tensorflow::FixupSourceAndSinkEdges(graph->get());
  ::tensorflow::GraphOptimizationPassOptions options;
  options.graph = graph;
  options.session_options = session_options;
  return pass->Run(options);
}

// The op types of a graph's op nodes, sorted: what a test compares before and after a pass.
inline std::vector<std::string> OpTypes(const ::tensorflow::Graph& graph) {
  std::vector<std::string> types;
  for (const ::tensorflow::Node* node : graph.op_nodes()) types.push_back(node->type_string());
  std::sort(types.begin(), types.end());
  return types;
}

inline int CountOps(const ::tensorflow::Graph& graph, const std::string& op) {
  int count = 0;
  for (const ::tensorflow::Node* node : graph.op_nodes()) count += node->type_string() == op;
  return count;
}

inline ::tensorflow::Node* FindNode(const ::tensorflow::Graph& graph, const std::string& name) {
  for (::tensorflow::Node* node : graph.op_nodes()) {
    if (node->name() == name) return node;
  }
  return nullptr;
}

// The node and output that feed `node`'s input `index`.
inline std::pair<const ::tensorflow::Node*, int> InputTo(const ::tensorflow::Node* node,
                                                         int index) {
  const ::tensorflow::Edge* edge = nullptr;
  if (!node->input_edge(index, &edge).ok()) return {nullptr, -1};
  return {edge->src(), edge->src_output()};
}

// Adds nodes to a graph, failing the test's CHECK on a malformed node (a bug in the test).
class GraphBuilder {
 public:
  GraphBuilder() : graph_(new ::tensorflow::Graph(::tensorflow::OpRegistry::Global())) {}

  ::tensorflow::Node* Add(::tensorflow::NodeBuilder builder) {
    ::tensorflow::Node* node = nullptr;
    const ::tensorflow::Status status = builder.Finalize(graph_.get(), &node);
    CHECK(status.ok()) << status;
    return node;
  }

  ::tensorflow::Node* Placeholder(const std::string& name, ::tensorflow::DataType dtype) {
    return Add(::tensorflow::NodeBuilder(name, "Placeholder").Attr("dtype", dtype));
  }

  template <typename T>
  ::tensorflow::Node* Const(const std::string& name, const T& value) {
    const ::tensorflow::Tensor tensor(value);
    return Add(::tensorflow::NodeBuilder(name, "Const")
                   .Attr("dtype", tensor.dtype())
                   .Attr("value", tensor));
  }

  ::tensorflow::Node* Identity(const std::string& name, ::tensorflow::Node* input, int output = 0) {
    return Add(::tensorflow::NodeBuilder(name, "Identity").Input(input, output));
  }

  ::tensorflow::Graph* graph() { return graph_.get(); }
  std::unique_ptr<::tensorflow::Graph>* owner() { return &graph_; }

 private:
  std::unique_ptr<::tensorflow::Graph> graph_;
};

}  // namespace pass_test
}  // namespace tf_ext

#endif  // TF_EXT_TESTS_KERNELS_GRAPH_GRAPH_PASS_TF_TEST_H_

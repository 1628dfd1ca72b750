// XLA around the tables: marks the dense part of a recommendation model (everything computed from
// the embedding outputs: the tower, the loss, the dense gradients and the dense variables' updates)
// for XLA, and leaves the table ops outside, so the user writes no jit_scope.
//
// The tables cannot be compiled (hash maps behind a resource, data-dependent shapes), but the dense
// part is ordinary arithmetic over [batch, ...] tensors. The pass sets `_XlaCompile=true` and one
// `_XlaScope` on it, as tf.xla.experimental.jit_scope would; XLA's own passes (MarkForCompilation
// at POST_REWRITE_FOR_EXEC phase 10, then declustering, encapsulation, launch ops) take it from
// there. This pass runs after the embedding fusion pass and before XLA (kernels/pass_phases.h).
//
// The region: nodes reached along data edges from the embedding outputs (TfExtTableFind,
// TfExtEmbeddingField, TfExtFusedEmbeddingLookup), except
//   - every TfExt op, and the nodes whose every consumer is a TfExt op or such a node ("table
//     side": a lookup's combiner before its marker, the gradient of the rows on its way to the
//     table update). Their shapes follow the number of ids in a batch, which changes every step,
//     and XLA would recompile for each;
//   - control flow, _Arg/_Retval/_Send/_Recv, and nodes inside loop frames;
//   - stateful ops other than the resource-variable reads and updates XLA compiles
//     (ReadVariableOp, Assign*VariableOp, ResourceApply*): XLA would also take random ops (other
//     numbers than TensorFlow's, so different results) and drop Asserts and CheckNumerics;
//   - nodes that already carry an XLA attribute: the user's own choice stands.
// Grappler has already fused MatMul + BiasAdd (+ activation) into _FusedMatMul, which has no XLA
// kernel and would cut the region into several clusters; inside the region the pass puts the
// unfused ops back (XLA fuses them itself).
// Ops without an XLA kernel, types XLA does not take, and clusters whose inputs may be dead
// (tf.cond) are left out by XLA's own checks at phase 10; the XLA kernel registry is not filled yet
// when this pass runs, so it could not check them itself.
//
// Graphs without tf_ext tables are left unchanged; the switch cluster_dense_for_xla
// (pass_switches.h) turns the pass on.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "kernels/graph/pass_switches.h"
#include "kernels/pass_phases.h"
#include "kernels/reachable_nodes.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/control_flow.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ext {
namespace graph {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::Edge;
using ::tensorflow::Graph;
using ::tensorflow::GraphOptimizationPass;
using ::tensorflow::GraphOptimizationPassOptions;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::Status;

// The attributes of tf.xla.experimental.jit_scope (tensorflow/compiler/jit/defs.h).
constexpr char kXlaCompileAttr[] = "_XlaCompile";
constexpr char kXlaScopeAttr[] = "_XlaScope";
constexpr char kDenseScope[] = "tf_ext_dense";

bool IsTfExtOp(const Node* node) { return absl::StartsWith(node->type_string(), "TfExt"); }

bool TakesTable(const Node* node) {
  if (!IsTfExtOp(node)) return false;
  for (DataType type : node->input_types()) {
    if (type == ::tensorflow::DT_RESOURCE) return true;
  }
  return false;
}

bool GivesEmbeddings(const Node* node) {
  const std::string& op = node->type_string();
  return op == "TfExtTableFind" || op == "TfExtEmbeddingField" || op == "TfExtFusedEmbeddingLookup";
}

// The stateful ops XLA compiles with the same result as TensorFlow: dense variables' reads and
// optimizer updates. (A ResourceApply* without an XLA kernel is left out by XLA's check.)
bool IsVariableReadOrUpdate(const Node* node) {
  const std::string& op = node->type_string();
  return op == "ReadVariableOp" || op == "AssignVariableOp" || op == "AssignAddVariableOp" ||
         op == "AssignSubVariableOp" || absl::StartsWith(op, "ResourceApply");
}

bool Clusterable(const Node* node, const ::tensorflow::ControlFlowInfo& frame) {
  if (!node->IsOp() || IsTfExtOp(node)) return false;
  if (node->IsControlFlow() || node->IsLoopCond() || node->IsControlTrigger()) return false;
  if (node->IsArg() || node->IsRetval() || node->IsSend() || node->IsRecv()) return false;
  if (!frame.frame_name.empty()) return false;
  if (node->attrs().Find(kXlaCompileAttr) != nullptr ||
      node->attrs().Find(kXlaScopeAttr) != nullptr) {
    return false;
  }
  return !node->op_def().is_stateful() || IsVariableReadOrUpdate(node);
}

// Nodes reached along data edges from the embedding outputs.
std::vector<bool> DownstreamOfEmbeddings(const Graph& graph) {
  std::vector<Node*> embeddings;
  for (Node* node : graph.op_nodes()) {
    if (GivesEmbeddings(node)) embeddings.push_back(node);
  }
  return DownstreamOf(graph, embeddings, [](const Edge& edge) { return !edge.IsControlEdge(); });
}

// Nodes whose every consumer (data or control) is a TfExt op or such a node.
std::vector<bool> TableSide(const Graph& graph) {
  std::vector<bool> table_side(graph.num_node_ids(), false);
  std::vector<Node*> consumers_first;
  ::tensorflow::GetPostOrder(graph, &consumers_first);
  for (const Node* node : consumers_first) {
    bool has_consumer = false, all_table_side = true;
    for (const Edge* edge : node->out_edges()) {
      const Node* consumer = edge->dst();
      if (consumer->IsSink()) continue;
      has_consumer = true;
      all_table_side = all_table_side && (IsTfExtOp(consumer) || table_side[consumer->id()]);
    }
    table_side[node->id()] = node->IsOp() && has_consumer && all_table_side;
  }
  return table_side;
}

// Replaces `fused`, a _FusedMatMul of BiasAdd and at most one plain activation, by MatMul, BiasAdd
// and the activation, and returns them in *unfused. Other fusions stay (*unfused is empty).
Status Unfuse(Graph* graph, Node* fused, std::vector<Node*>* unfused) {
  unfused->clear();
  std::vector<std::string> fused_ops;
  TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(fused->attrs(), "fused_ops", &fused_ops));
  const bool plain_activation =
      fused_ops.size() == 2 &&
      (fused_ops[1] == "Relu" || fused_ops[1] == "Relu6" || fused_ops[1] == "Elu" ||
       fused_ops[1] == "Tanh" || fused_ops[1] == "Sigmoid");
  if (fused->num_inputs() != 3 || fused_ops.empty() || fused_ops[0] != "BiasAdd" ||
      (fused_ops.size() > 1 && !plain_activation)) {
    return ::tensorflow::OkStatus();
  }
  std::vector<const Edge*> inputs;
  TF_RETURN_IF_ERROR(fused->input_edges(&inputs));
  std::vector<Node*> control_inputs;
  for (const Edge* edge : fused->in_edges()) {
    if (edge->IsControlEdge()) control_inputs.push_back(edge->src());
  }
  const auto add = [&](NodeBuilder builder) {
    Node* node;
    TF_RETURN_IF_ERROR(builder.Attr("T", *fused->attrs().Find("T"))
                           .ControlInputs(unfused->empty() ? control_inputs : std::vector<Node*>{})
                           .Device(fused->requested_device())
                           .AssignedDevice(fused->assigned_device_name())
                           .Finalize(graph, &node));
    unfused->push_back(node);
    return ::tensorflow::OkStatus();
  };
  const std::string prefix = fused->name() + "/";
  TF_RETURN_IF_ERROR(add(NodeBuilder(graph->NewName(prefix + "MatMul"), "MatMul")
                             .Input(inputs[0]->src(), inputs[0]->src_output())
                             .Input(inputs[1]->src(), inputs[1]->src_output())
                             .Attr("transpose_a", *fused->attrs().Find("transpose_a"))
                             .Attr("transpose_b", *fused->attrs().Find("transpose_b"))));
  TF_RETURN_IF_ERROR(add(NodeBuilder(graph->NewName(prefix + "BiasAdd"), "BiasAdd")
                             .Input(unfused->back())
                             .Input(inputs[2]->src(), inputs[2]->src_output())));
  if (plain_activation) {
    TF_RETURN_IF_ERROR(add(
        NodeBuilder(graph->NewName(prefix + fused_ops[1]), fused_ops[1]).Input(unfused->back())));
  }
  TF_RETURN_IF_ERROR(MoveConsumers(graph, fused, 0, unfused->back(), 0));
  graph->RemoveNode(fused);
  return ::tensorflow::OkStatus();
}

// The nodes to mark: the region (header comment), with its _FusedMatMuls unfused.
Status DenseRegion(Graph* graph, const std::vector<::tensorflow::ControlFlowInfo>& frames,
                   std::vector<bool>* marked) {
  const std::vector<bool> downstream = DownstreamOfEmbeddings(*graph);
  const std::vector<bool> table_side = TableSide(*graph);
  std::vector<Node*> region;
  for (Node* node : graph->op_nodes()) {
    const int id = node->id();
    if (downstream[id] && !table_side[id] && Clusterable(node, frames[id])) region.push_back(node);
  }
  for (Node* node : region) {
    std::vector<Node*> unfused;
    if (node->type_string() == "_FusedMatMul") {
      TF_RETURN_IF_ERROR(Unfuse(graph, node, &unfused));
    }
    if (unfused.empty()) unfused.push_back(node);
    marked->resize(graph->num_node_ids(), false);
    for (const Node* kept : unfused) (*marked)[kept->id()] = true;
  }
  return ::tensorflow::OkStatus();
}

// Constants used only inside the region join it, so XLA sees their values when it compiles (shapes,
// axes) instead of taking them as inputs; and so do NoOps that only order region nodes
// (tf.gradients' tuple/group_deps): outside, they would cut the region in two.
void AddConstantsAndNoOps(const Graph& graph,
                          const std::vector<::tensorflow::ControlFlowInfo>& frames,
                          std::vector<bool>* marked) {
  const auto only_marked = [&](const Node* node, bool inputs) {
    bool any = false, all_marked = true;
    for (const Edge* edge : inputs ? node->in_edges() : node->out_edges()) {
      const Node* other = inputs ? edge->src() : edge->dst();
      if (!other->IsOp()) continue;
      any = true;
      all_marked = all_marked && (*marked)[other->id()];
    }
    return any && all_marked;
  };
  std::vector<Node*> producers_first;
  ::tensorflow::GetReversePostOrder(graph, &producers_first);
  for (const Node* node : producers_first) {
    // Nodes Unfuse added are marked already, and have no frame information.
    if ((*marked)[node->id()] || !Clusterable(node, frames[node->id()])) continue;
    if ((node->IsConstant() && only_marked(node, /*inputs=*/false)) ||
        (node->type_string() == "NoOp" && only_marked(node, /*inputs=*/true))) {
      (*marked)[node->id()] = true;
    }
  }
}

class XlaDenseClusterPass : public GraphOptimizationPass {
 public:
  Status Run(const GraphOptimizationPassOptions& options) override {
    Graph* graph;
    TF_RETURN_IF_ERROR(GraphToRewrite(options, &PassSwitches::cluster_dense_for_xla, &graph));
    if (graph == nullptr) return ::tensorflow::OkStatus();
    bool has_tables = false;
    for (const Node* node : graph->op_nodes()) has_tables = has_tables || TakesTable(node);
    if (!has_tables) return ::tensorflow::OkStatus();

    std::vector<::tensorflow::ControlFlowInfo> frames;
    TF_RETURN_IF_ERROR(::tensorflow::BuildControlFlowInfo(graph, &frames));
    std::vector<bool> marked(graph->num_node_ids(), false);
    TF_RETURN_IF_ERROR(DenseRegion(graph, frames, &marked));
    AddConstantsAndNoOps(*graph, frames, &marked);
    int num_marked = 0;
    for (Node* node : graph->op_nodes()) {
      if (!marked[node->id()]) continue;
      ++num_marked;
      node->AddAttr(kXlaCompileAttr, true);
      node->AddAttr(kXlaScopeAttr, std::string(kDenseScope));
    }
    if (num_marked > 0) RecordClustering(num_marked);
    VLOG(1) << "tf_ext XLA dense clustering: " << num_marked << " of " << graph->num_op_nodes()
            << " nodes marked for XLA";
    return ::tensorflow::OkStatus();
  }
};

REGISTER_OPTIMIZATION(kXlaDenseClusterPhase.grouping, kXlaDenseClusterPhase.phase,
                      XlaDenseClusterPass);

}  // namespace
}  // namespace graph
}  // namespace tf_ext

// The graph rewrite of loss-aware mixed precision: both precisions of a training step in one
// graph, and a predicate that picks one per step.
//
// It runs on every graph TensorFlow executes (a Session's graph and every tf.function), after
// Grappler and placement, after XLA has taken its clusters (kernels/pass_phases.h says why), and
// changes only graphs that hold a TfExtAmpHalfMode node (which
// tf_ext.mixed_precision.LossAwareOptimizer adds to the training step). Its output is the
// predicate: true runs the half version.
//
// For each node painted half (core/half_precision_plan.h) a copy with T = the half type is added:
//   - an fp32 tensor entering the painted region goes through Switch(tensor, predicate): the
//     true side, cast to half, feeds the half copies; the false side feeds the original nodes;
//   - a value leaving the region goes through Merge(Cast(half copy -> fp32), original);
//     a control edge leaving it starts at that Merge.
// So in half mode the originals get dead inputs and do not execute, in full mode the half copies
// do not, and a switch needs no new graph, session, trace or compilation.
//
// The precision probe: for a TfExtAmpProbe node (inputs loss, reference, probed) the pass adds an
// fp32 copy of every node between the painted region and the loss, fed through
// Switch(tensor, probed), and connects its loss as the probe's reference (a Merge: the loss itself
// on steps that do not probe). A probe step thus computes the loss in both precisions on one batch.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mixed_precision/core/half_precision_plan.h"
#include "kernels/pass_phases.h"
#include "kernels/reachable_nodes.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/kernel_def.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/control_flow.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/util/device_name_utils.h"
#include "tensorflow/core/util/util.h"

namespace tf_ext {
namespace {

using ::tensorflow::DataType;
using ::tensorflow::DeviceNameUtils;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::Edge;
using ::tensorflow::Graph;
using ::tensorflow::GraphOptimizationPass;
using ::tensorflow::GraphOptimizationPassOptions;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::NodeDef;
using ::tensorflow::OpDef;
using ::tensorflow::Status;

constexpr char kHalfModeOp[] = "TfExtAmpHalfMode";
constexpr char kProbeOp[] = "TfExtAmpProbe";
constexpr char kDoneAttr[] = "_tf_ext_amp_rewritten";

std::string DeviceTypeOf(const Node* node) {
  const std::string& device = node->assigned_device_name().empty() ? node->requested_device()
                                                                   : node->assigned_device_name();
  DeviceNameUtils::ParsedName parsed;
  if (!device.empty() && DeviceNameUtils::ParseFullName(device, &parsed) && parsed.has_type) {
    return parsed.type;
  }
  return "CPU";
}

constexpr char kFusedMatMul[] = "_FusedMatMul";

bool HasHalfKernel(const Node* node, const std::string& op, DataType half) {
  NodeDef def = node->def();
  def.set_op(op);
  (*def.mutable_attr())["T"].set_type(half);
  return ::tensorflow::FindKernelDef(::tensorflow::DeviceType(DeviceTypeOf(node)), def, nullptr,
                                     nullptr)
      .ok();
}

// Grappler's remapper fuses MatMul + BiasAdd (+ Add) (+ activation) into _FusedMatMul. Its
// half kernels compute only with oneDNN (bf16 on CPU); elsewhere the half version is the
// unfused chain.
bool KeepFused(const Node* node, DataType half) {
  return half == ::tensorflow::DT_BFLOAT16 && DeviceTypeOf(node) == "CPU" &&
         ::tensorflow::IsMKLEnabled();
}

// The ops of a _FusedMatMul's chain after the MatMul, or {} when the rewrite cannot unfuse it.
std::vector<std::string> UnfusedOps(const Node* node) {
  std::vector<std::string> fused;
  if (!::tensorflow::TryGetNodeAttr(node->attrs(), "fused_ops", &fused) || fused.empty() ||
      fused[0] != "BiasAdd" || fused.size() > 3) {
    return {};
  }
  static const std::set<std::string> kActivations = {"Relu",      "Relu6", "Elu",
                                                     "LeakyRelu", "Tanh",  "Sigmoid"};
  size_t next = 1;
  if (next < fused.size() && fused[next] == "Add") ++next;
  if (next < fused.size() && kActivations.count(fused[next])) ++next;
  if (next != fused.size()) return {};
  fused[0] = "BiasAdd";
  for (std::string& op : fused) {
    if (op == "Add") op = "AddV2";
  }
  return fused;
}

// Whether every float argument of `node` is typed by its attribute T (so that setting T converts
// all of them), T is float, and a kernel exists for the half type on the node's device.
bool Convertible(const Node* node, DataType half) {
  DataType t;
  if (!::tensorflow::TryGetNodeAttr(node->attrs(), "T", &t) || t != DT_FLOAT) return false;
  const OpDef& op_def = node->op_def();
  for (const auto* args : {&op_def.input_arg(), &op_def.output_arg()}) {
    for (const auto& arg : *args) {
      if (arg.type_attr() == "T") continue;
      if (!arg.type_list_attr().empty()) return false;
      DataType resolved = arg.type();
      if (!arg.type_attr().empty() &&
          !::tensorflow::TryGetNodeAttr(node->attrs(), arg.type_attr(), &resolved)) {
        return false;
      }
      if (resolved == DT_FLOAT) return false;
    }
  }
  if (node->type_string() == kFusedMatMul && !KeepFused(node, half)) {
    return !UnfusedOps(node).empty() && HasHalfKernel(node, "MatMul", half);
  }
  return HasHalfKernel(node, node->type_string(), half);
}

bool IsParameter(const Node* node, const std::vector<bool>& parameter) {
  const std::string& op = node->type_string();
  if (op == "ReadVariableOp" || op == "Const" || op == "VariableV2" || op == "Variable") {
    return true;
  }
  if (op == "Identity") {  // a TF1 reference variable's read
    const Edge* in = nullptr;
    return node->input_edge(0, &in).ok() && parameter[in->src()->id()];
  }
  return false;
}

std::vector<std::string> ListAttr(const Node* node, const char* name) {
  std::vector<std::string> values;
  if (!::tensorflow::TryGetNodeAttr(node->attrs(), name, &values)) values.clear();
  return values;
}

// The half version of a node: where its inputs go (per input index), and its output node.
struct HalfVersion {
  std::vector<std::pair<Node*, int>> inputs;
  Node* output = nullptr;
};

// Adds nodes with unique names next to `near`, on its device.
class Builder {
 public:
  explicit Builder(Graph* graph) : graph_(graph) {}

  // A copy of `node` without inputs, with T = `type` (unchanged when DT_INVALID).
  Node* Copy(const Node* node, const char* suffix, DataType type) {
    NodeDef def = node->def();
    def.set_name(Name(node, suffix));
    def.clear_input();
    if (type != ::tensorflow::DT_INVALID) (*def.mutable_attr())["T"].set_type(type);
    def.mutable_attr()->erase(kDoneAttr);
    return Insert(std::move(def), node);
  }

  // The half version of `node`: a copy with T = half, or the unfused chain of a _FusedMatMul.
  HalfVersion HalfOf(const Node* node, DataType half) {
    HalfVersion version;
    if (node->type_string() != kFusedMatMul || KeepFused(node, half)) {
      version.output = Copy(node, "/tf_ext_amp_half", half);
      for (int i = 0; i < node->num_inputs(); ++i) version.inputs.emplace_back(version.output, i);
      return version;
    }
    bool transpose_a = false, transpose_b = false;
    float alpha = 0.2f;
    ::tensorflow::TryGetNodeAttr(node->attrs(), "transpose_a", &transpose_a);
    ::tensorflow::TryGetNodeAttr(node->attrs(), "transpose_b", &transpose_b);
    ::tensorflow::TryGetNodeAttr(node->attrs(), "leakyrelu_alpha", &alpha);
    Node* last = Bare(node, "/tf_ext_amp_half_matmul", "MatMul", [&](NodeDef* def) {
      ::tensorflow::AddNodeAttr("T", half, def);
      ::tensorflow::AddNodeAttr("transpose_a", transpose_a, def);
      ::tensorflow::AddNodeAttr("transpose_b", transpose_b, def);
    });
    version.inputs = {{last, 0}, {last, 1}};
    for (const std::string& op : UnfusedOps(node)) {
      Node* next = Bare(node, "/tf_ext_amp_half_unfused", op, [&](NodeDef* def) {
        ::tensorflow::AddNodeAttr("T", half, def);
        if (op == "LeakyRelu") ::tensorflow::AddNodeAttr("alpha", alpha, def);
      });
      graph_->AddEdge(last, 0, next, 0);
      if (op == "BiasAdd" || op == "AddV2") version.inputs.emplace_back(next, 1);
      last = next;
    }
    version.output = last;
    return version;
  }

  // A node of type `op` without inputs, on `near`'s device (its attributes' defaults filled in).
  Node* Bare(const Node* near, const char* suffix, const std::string& op,
             const std::function<void(NodeDef*)>& set_attrs) {
    NodeDef def;
    def.set_name(Name(near, suffix));
    def.set_op(op);
    def.set_device(near->requested_device());
    set_attrs(&def);
    const ::tensorflow::OpDef* op_def = nullptr;
    Status status = ::tensorflow::OpRegistry::Global()->LookUpOpDef(op, &op_def);
    CHECK(status.ok()) << status;
    ::tensorflow::AddDefaultsToNodeDef(*op_def, &def);
    return Insert(std::move(def), near);
  }

  // Switch(src:port, predicate:predicate_port): output 1 is live when the predicate is true.
  Node* Switch(Node* src, int port, Node* predicate, int predicate_port, Node* near,
               const char* suffix) {
    return Add(
        NodeBuilder(Name(near, suffix), "Switch").Input(src, port).Input(predicate, predicate_port),
        near);
  }

  Node* Cast(Node* src, int port, DataType from, DataType to, Node* near) {
    return Add(NodeBuilder(Name(near, "/tf_ext_amp_cast"), "Cast")
                   .Input(src, port)
                   .Attr("SrcT", from)
                   .Attr("DstT", to)
                   .Attr("Truncate", false),
               near);
  }

  Node* Merge(std::vector<NodeBuilder::NodeOut> inputs, Node* near) {
    return Add(NodeBuilder(Name(near, "/tf_ext_amp_merge"), "Merge").Input(inputs), near);
  }

 private:
  std::string Name(const Node* near, const char* suffix) {
    return graph_->NewName(near->name() + suffix);
  }

  Node* Add(NodeBuilder builder, const Node* near) {
    Node* node = nullptr;
    Status status = builder.Finalize(graph_, &node);
    CHECK(status.ok()) << status;  // only fails on a malformed builder: a bug here
    node->set_assigned_device_name(near->assigned_device_name());
    node->set_requested_device(near->requested_device());
    return node;
  }

  // Adds `def` (no inputs) to the graph, placed on `near`'s assigned device.
  Node* Insert(NodeDef def, const Node* near) {
    Status status;
    Node* node = graph_->AddNode(std::move(def), &status);
    CHECK(status.ok()) << status;
    node->set_assigned_device_name(near->assigned_device_name());
    return node;
  }

  Graph* graph_;
};

struct Port {
  Node* node;
  int port;
  bool operator<(const Port& other) const {
    return node->id() != other.node->id() ? node->id() < other.node->id() : port < other.port;
  }
};

class HalfRewritePass : public GraphOptimizationPass {
 public:
  Status Run(const GraphOptimizationPassOptions& options) override {
    if (options.graph == nullptr) return ::tensorflow::OkStatus();
    Graph* graph = options.graph->get();
    Node* mode = nullptr;
    std::vector<Node*> probes;
    for (Node* node : graph->op_nodes()) {
      if (node->type_string() == kHalfModeOp) {
        bool done = false;
        if (::tensorflow::TryGetNodeAttr(node->attrs(), kDoneAttr, &done) && done) continue;
        if (mode == nullptr) mode = node;
        node->AddAttr(kDoneAttr, true);
      } else if (node->type_string() == kProbeOp) {
        probes.push_back(node);
      }
    }
    if (mode == nullptr) return ::tensorflow::OkStatus();
    return Rewrite(graph, mode, probes);
  }

 private:
  static Status Rewrite(Graph* graph, Node* mode, const std::vector<Node*>& probes) {
    DataType half;
    TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(mode->attrs(), "half_dtype", &half));
    const amp::OpLists lists = amp::OpLists::Default(
        ListAttr(mode, "allow_ops"), ListAttr(mode, "infer_ops"), ListAttr(mode, "deny_ops"));
    std::vector<::tensorflow::ControlFlowInfo> frames;
    TF_RETURN_IF_ERROR(::tensorflow::BuildControlFlowInfo(graph, &frames));

    // Describe the graph to the core, in topological order.
    std::vector<Node*> order;
    ::tensorflow::GetReversePostOrder(*graph, &order);
    std::vector<int> index(graph->num_node_ids(), -1);
    std::vector<bool> parameter(graph->num_node_ids(), false);
    std::vector<amp::PlanNode> plan;
    for (Node* node : order) {
      if (!node->IsOp()) continue;
      index[node->id()] = static_cast<int>(plan.size());
      parameter[node->id()] = IsParameter(node, parameter);
      amp::PlanNode entry;
      entry.op = node->type_string();
      entry.parameter = parameter[node->id()];
      const bool root_frame =
          static_cast<size_t>(node->id()) < frames.size() && frames[node->id()].frame_name.empty();
      const bool known = lists.Allowed(entry.op) || lists.Inferred(entry.op);
      entry.convertible = known && root_frame && Convertible(node, half);
      for (const Edge* edge : node->in_edges()) {
        if (edge->IsControlEdge() || !edge->src()->IsOp()) continue;
        if (node->input_type(edge->dst_input()) != DT_FLOAT) continue;
        const int producer = index[edge->src()->id()];
        if (producer >= 0)
          entry.float_inputs.push_back(producer);
        else
          entry.convertible = false;  // a back edge: not a plain data flow
      }
      plan.push_back(std::move(entry));
    }
    const std::vector<bool> painted_by_plan = amp::PaintHalf(plan, lists);
    std::vector<bool> painted(graph->num_node_ids(), false);
    std::vector<Node*> region;
    for (Node* node : order) {
      if (node->IsOp() && painted_by_plan[index[node->id()]]) {
        painted[node->id()] = true;
        region.push_back(node);
      }
    }
    Builder builder(graph);
    for (Node* probe : probes) AddProbeShadow(graph, &builder, order, region, probe);
    const Status status = SplitRegion(graph, &builder, painted, region, mode, half);
    VLOG(1) << "tf_ext AMP: " << region.size() << " of " << plan.size() << " ops have a "
            << ::tensorflow::DataTypeString(half) << " version";
    ::tensorflow::FixupSourceAndSinkEdges(graph);
    return status;
  }

  static Status SplitRegion(Graph* graph, Builder* builder, const std::vector<bool>& painted,
                            const std::vector<Node*>& region, Node* mode, DataType half) {
    std::map<int, HalfVersion> half_copy;  // original id -> its half version
    for (Node* node : region) half_copy[node->id()] = builder->HalfOf(node, half);

    std::map<Port, Node*> switches, casts_in, merges;
    auto switch_for = [&](Port tensor, Node* near) {
      Node*& sw = switches[tensor];
      if (sw == nullptr) {
        sw = builder->Switch(tensor.node, tensor.port, mode, 0, near, "/tf_ext_amp_switch");
      }
      return sw;
    };
    auto half_input = [&](Port tensor, Node* near) {
      Node*& cast = casts_in[tensor];
      if (cast == nullptr) cast = builder->Cast(switch_for(tensor, near), 1, DT_FLOAT, half, near);
      return cast;
    };
    auto merge_for = [&](Node* node, int port) {
      Node*& merge = merges[Port{node, port}];
      if (merge == nullptr) {
        Node* back = builder->Cast(half_copy[node->id()].output, port, half, DT_FLOAT, node);
        merge = builder->Merge({{back, 0}, {node, port}}, node);
      }
      return merge;
    };

    for (Node* node : region) {
      const HalfVersion& version = half_copy[node->id()];
      std::vector<const Edge*> in_edges(node->in_edges().begin(), node->in_edges().end());
      for (const Edge* edge : in_edges) {
        Node* src = edge->src();
        if (edge->IsControlEdge()) {
          if (src->IsSource()) continue;
          graph->AddControlEdge(painted[src->id()] ? half_copy[src->id()].output : src,
                                version.inputs[0].first);
          continue;
        }
        const int input = edge->dst_input();
        const auto [dst, dst_input] = version.inputs[input];
        if (painted[src->id()]) {
          graph->AddEdge(half_copy[src->id()].output, edge->src_output(), dst, dst_input);
        } else if (node->input_type(input) == DT_FLOAT) {
          const Port tensor{src, edge->src_output()};
          graph->AddEdge(half_input(tensor, node), 0, dst, dst_input);
          TF_RETURN_IF_ERROR(graph->UpdateEdge(switch_for(tensor, node), 0, node, input));
        } else {
          graph->AddEdge(src, edge->src_output(), dst, dst_input);
        }
      }
    }
    for (Node* node : region) {
      std::vector<const Edge*> out_edges(node->out_edges().begin(), node->out_edges().end());
      for (const Edge* edge : out_edges) {
        Node* dst = edge->dst();
        if (painted[dst->id()] || dst->IsSink()) continue;
        if (edge->IsControlEdge()) {
          graph->RemoveEdge(edge);
          graph->AddControlEdge(merge_for(node, 0), dst);
        } else {
          const int input = edge->dst_input();
          TF_RETURN_IF_ERROR(graph->UpdateEdge(merge_for(node, edge->src_output()), 0, dst, input));
        }
      }
    }
    return ::tensorflow::OkStatus();
  }

  // Adds the fp32 copy of the path from the painted region to the probe's loss; see the top.
  // `order`: the graph's nodes in topological order, before any rewrite.
  static void AddProbeShadow(Graph* graph, Builder* builder, const std::vector<Node*>& order,
                             const std::vector<Node*>& region, Node* probe) {
    const Edge *loss_edge = nullptr, *probed_edge = nullptr;
    if (!probe->input_edge(0, &loss_edge).ok() || !probe->input_edge(2, &probed_edge).ok()) return;
    // Ancestors of the loss and descendants of the painted region (both included), through op
    // nodes only.
    const std::vector<bool> ancestor =
        ReachableFrom(*graph, {loss_edge->src()}, Direction::kUpstream,
                      [](const Edge& edge) { return edge.src()->IsOp(); });
    const std::vector<bool> descendant =
        ReachableFrom(*graph, region, Direction::kDownstream,
                      [](const Edge& edge) { return edge.dst()->IsOp(); });
    std::vector<Node*> between;
    for (Node* node : order) {
      if (!node->IsOp() || !ancestor[node->id()] || !descendant[node->id()]) continue;
      if (node->op_def().is_stateful()) {
        LOG(WARNING) << "tf_ext AMP: no precision probe: the loss depends on the stateful op "
                     << node->name() << " (" << node->type_string() << ") after half ops";
        return;
      }
      between.push_back(node);
    }
    if (between.empty()) return;  // the loss does not depend on a half op
    Node* probed = probed_edge->src();
    const int probed_port = probed_edge->src_output();
    std::map<int, Node*> shadow;
    std::map<Port, Node*> switches;
    for (Node* node : between) {
      Node* copy = builder->Copy(node, "/tf_ext_amp_probe", ::tensorflow::DT_INVALID);
      shadow[node->id()] = copy;
      for (const Edge* edge : node->in_edges()) {
        Node* src = edge->src();
        const bool inside = shadow.count(src->id()) > 0;
        if (edge->IsControlEdge()) {
          if (!src->IsSource()) graph->AddControlEdge(inside ? shadow[src->id()] : src, copy);
        } else if (inside) {
          graph->AddEdge(shadow[src->id()], edge->src_output(), copy, edge->dst_input());
        } else {
          Node*& sw = switches[Port{src, edge->src_output()}];
          if (sw == nullptr) {
            sw = builder->Switch(src, edge->src_output(), probed, probed_port, node,
                                 "/tf_ext_amp_probe_switch");
          }
          graph->AddEdge(sw, 1, copy, edge->dst_input());
        }
      }
    }
    // The reference: the fp32 loss when probing, else the loss itself (ignored by the probe).
    Node* loss = loss_edge->src();
    Node* skip = builder->Switch(loss, loss_edge->src_output(), probed, probed_port, probe,
                                 "/tf_ext_amp_probe_skip");
    Node* reference =
        builder->Merge({{shadow[loss->id()], loss_edge->src_output()}, {skip, 0}}, probe);
    Status status = graph->UpdateEdge(reference, 0, probe, 1);
    CHECK(status.ok()) << status;
  }
};

REGISTER_OPTIMIZATION(kHalfRewritePhase.grouping, kHalfRewritePhase.phase, HalfRewritePass);

}  // namespace
}  // namespace tf_ext

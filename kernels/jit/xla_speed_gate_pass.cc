// The speed gate (core/speed_gate.h): a Session's XLA clusters run compiled only where that makes
// the steps faster. TensorFlow's BuildXlaOpsPass (POST_REWRITE_FOR_EXEC phase 60) turns each
// lazily compiled cluster into
//
//   (key, ready) = _XlaCompile(args...)
//   (uncompiled, compiled) = Switch(key, pred=ready)      // "<cluster>/predicated_compilation_key"
//   order = Identity(uncompiled)                           // "<cluster>/data_as_ctrl"
//   outputs = _XlaMerge(function call(args..., ^order), _XlaRun(args..., compiled))
//   (and the call's host-memory arguments through an IdentityN(^order))
//
// This pass (after it: kernels/pass_phases.h) makes the _XlaCompile conditional on the graph's
// speed gate:
//
//   ask = TfExtXlaSpeedGate(args...)                      // ask XLA this step?
//   (skip, asking) = Switch(ask, pred=ask)
//   _XlaCompile(..., ^Identity(asking))                    // dead when not asking
//   TfExtXlaSpeedGateReady(ready)                          // XLA's answer, for the check
//   function call(..., ^Merge(Identity(ask, ^order), Identity(skip)))   // and the IdentityN
//
// so that a step that does not ask runs the function call without _XlaCompile (no compilation of
// new shapes, no cache lookup), and one that asks runs as before. The gates of one graph share
// one SpeedGate, which decides per step and times whole steps. Only clusters on CPU are gated
// (the gate's args are the cluster's, for their element count: on another device they would be
// copied to the host), and only while the switch is on (tf_ext.jit.Bucketing turns it on,
// TF_EXT_JIT_ADAPTIVE). Clusters XLA must compile (no Switch) are left alone.
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "kernels/jit/core/speed_gate.h"
#include "kernels/pass_phases.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ext {
namespace jit {
namespace {

using ::tensorflow::Edge;
using ::tensorflow::Graph;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;

int64_t NowNanos() { return static_cast<int64_t>(::tensorflow::Env::Default()->NowNanos()); }

SpeedGate* GateOf(OpKernelConstruction* ctx) {
  std::string key, clusters;
  if (!ctx->GetAttr("gate", &key).ok() || !ctx->GetAttr("clusters", &clusters).ok()) {
    ctx->CtxFailure(
        ::tensorflow::errors::InvalidArgument("a speed gate op needs gate and clusters"));
    return nullptr;
  }
  return ProcessSpeedGates().Get(key, clusters);
}

class XlaSpeedGateOp : public OpKernel {
 public:
  explicit XlaSpeedGateOp(OpKernelConstruction* ctx) : OpKernel(ctx), gate_(GateOf(ctx)) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t elements = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) elements += ctx->input(i).NumElements();
    ::tensorflow::Tensor* ask = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {}, &ask));
    SpeedVerdict verdict;
    bool finished = false;
    ask->scalar<bool>()() = gate_->Begin(ctx->step_id(), elements, NowNanos(), &verdict, &finished);
    if (!finished) return;
    ProcessSpeedGates().Record(&verdict);
    VLOG(1) << "tf_ext XLA speed gate: " << verdict.clusters << " run "
            << (verdict.run_compiled ? "compiled" : "uncompiled") << " (" << verdict.compiled_ns
            << " ns per input element compiled, " << verdict.uncompiled_ns << " uncompiled)";
  }

 private:
  SpeedGate* const gate_;  // owned by ProcessSpeedGates()
};

class XlaSpeedGateReadyOp : public OpKernel {
 public:
  explicit XlaSpeedGateReadyOp(OpKernelConstruction* ctx) : OpKernel(ctx), gate_(GateOf(ctx)) {}

  void Compute(OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& ready = ctx->input(0);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(ready.shape()),
                ::tensorflow::errors::InvalidArgument(
                    "TfExtXlaSpeedGateReady: ready must be a scalar bool, got shape ",
                    ready.shape().DebugString()));
    gate_->Ready(ctx->step_id(), ready.scalar<bool>()());
  }

 private:
  SpeedGate* const gate_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtXlaSpeedGate").Device(::tensorflow::DEVICE_CPU), XlaSpeedGateOp);
REGISTER_KERNEL_BUILDER(Name("TfExtXlaSpeedGateReady").Device(::tensorflow::DEVICE_CPU),
                        XlaSpeedGateReadyOp);

// The two ways of the lazily compiled cluster around `compile` (an _XlaCompile node): the Switch on
// its "ready" output, the _XlaRun it feeds, and the function call its other output releases; or
// false.
struct LazyCluster {
  Node* predicate_switch = nullptr;
  Node* xla_run = nullptr;
  Node* order = nullptr;  // the Identity of the Switch's false output
  Node* function_call = nullptr;
};

bool FindLazyCluster(Node* compile, LazyCluster* cluster) {
  for (const Edge* edge : compile->out_edges()) {
    if (edge->src_output() == 1 && edge->dst()->type_string() == "Switch" &&
        edge->dst_input() == 1) {
      cluster->predicate_switch = edge->dst();
    }
  }
  if (cluster->predicate_switch == nullptr) return false;
  for (const Edge* edge : cluster->predicate_switch->out_edges()) {
    if (edge->IsControlEdge()) continue;
    Node* consumer = edge->dst();
    if (edge->src_output() == 1 && consumer->type_string() == "_XlaRun") {
      cluster->xla_run = consumer;
    } else if (edge->src_output() == 0) {
      // BuildXlaOpsPass: the Switch's false output, through an Identity, orders the call.
      for (const Edge* order : consumer->out_edges()) {
        if (order->IsControlEdge() &&
            absl::StrContains(order->dst()->type_string(), "PartitionedCall")) {
          cluster->order = consumer;
          cluster->function_call = order->dst();
        }
      }
    }
  }
  return cluster->xla_run != nullptr && cluster->function_call != nullptr;
}

class XlaSpeedGatePass : public ::tensorflow::GraphOptimizationPass {
 public:
  Status Run(const ::tensorflow::GraphOptimizationPassOptions& options) override {
    if (!SpeedGateEnabled() || options.graph == nullptr || *options.graph == nullptr) {
      return ::tensorflow::OkStatus();
    }
    Graph* graph = options.graph->get();
    std::vector<std::pair<Node*, LazyCluster>> gated;
    std::string names;
    for (Node* node : graph->op_nodes()) {
      LazyCluster cluster;
      if (node->type_string() != "_XlaCompile" ||
          !absl::StrContains(node->assigned_device_name(), "CPU") ||
          !FindLazyCluster(node, &cluster)) {
        continue;
      }
      gated.emplace_back(node, cluster);
      names += (names.empty() ? "" : ", ") + node->name();
    }
    if (gated.empty()) return ::tensorflow::OkStatus();
    // A gate of its own per graph instance: each executor is checked on its own steps.
    static std::atomic<int64_t> instances{0};
    const std::string key = "graph#" + std::to_string(++instances);
    for (const auto& [compile, cluster] : gated) {
      TF_RETURN_IF_ERROR(Gate(graph, compile, cluster, key, names));
    }
    VLOG(1) << "tf_ext XLA speed gate on " << names;
    return ::tensorflow::OkStatus();
  }

 private:
  static Status Gate(Graph* graph, Node* compile, const LazyCluster& cluster,
                     const std::string& key, const std::string& names) {
    std::vector<NodeBuilder::NodeOut> args;
    for (const Edge* edge : compile->in_edges()) {
      if (edge->IsControlEdge()) continue;
      if (edge->src()->output_type(edge->src_output()) == ::tensorflow::DT_RESOURCE) continue;
      args.emplace_back(edge->src(), edge->src_output());
    }
    const auto build = [&](const char* what, const char* op) {
      NodeBuilder builder(graph->NewName(compile->name() + "/tf_ext_speed_gate_" + what), op);
      builder.Device(compile->requested_device()).AssignedDevice(compile->assigned_device_name());
      return builder;
    };
    Node *ask, *ask_switch, *asking, *ask_after_order, *skipping, *call_order, *ready;
    TF_RETURN_IF_ERROR(build("ask", "TfExtXlaSpeedGate")
                           .Input(args)
                           .Attr("gate", key)
                           .Attr("clusters", names)
                           .Finalize(graph, &ask));
    TF_RETURN_IF_ERROR(
        build("switch", "Switch").Input(ask, 0).Input(ask, 0).Finalize(graph, &ask_switch));
    TF_RETURN_IF_ERROR(build("asking", "Identity").Input(ask_switch, 1).Finalize(graph, &asking));
    graph->AddControlEdge(asking, compile);
    TF_RETURN_IF_ERROR(build("ready", "TfExtXlaSpeedGateReady")
                           .Input(compile, 1)
                           .Attr("gate", key)
                           .Attr("clusters", names)
                           .Finalize(graph, &ready));
    // The call runs when XLA had nothing ready (as before) or was not asked.
    TF_RETURN_IF_ERROR(build("not_ready", "Identity")
                           .Input(ask, 0)
                           .ControlInput(cluster.order)
                           .Finalize(graph, &ask_after_order));
    TF_RETURN_IF_ERROR(
        build("skipping", "Identity").Input(ask_switch, 0).Finalize(graph, &skipping));
    TF_RETURN_IF_ERROR(
        build("call_order", "Merge")
            .Input(std::vector<NodeBuilder::NodeOut>{{ask_after_order, 0}, {skipping, 0}})
            .Finalize(graph, &call_order));
    // Whatever the Switch's false output ordered (the call, and the IdentityN that brings the
    // call's host-memory arguments) now follows the Merge.
    std::vector<const Edge*> ordered;
    for (const Edge* edge : cluster.order->out_edges()) {
      if (edge->IsControlEdge() && edge->dst() != ask_after_order) ordered.push_back(edge);
    }
    for (const Edge* edge : ordered) {
      graph->AddControlEdge(call_order, edge->dst());
      graph->RemoveControlEdge(edge);
    }
    return ::tensorflow::OkStatus();
  }
};

REGISTER_OPTIMIZATION(kXlaSpeedGatePhase.grouping, kXlaSpeedGatePhase.phase, XlaSpeedGatePass);

}  // namespace
}  // namespace jit
}  // namespace tf_ext

#include "kernels/graph/pass_switches.h"

#include <string>
#include <vector>

#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/protobuf/config.pb.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"
#include "tensorflow/core/public/session_options.h"

namespace tf_ext {
namespace graph {

namespace {

::tensorflow::Status SwitchesFor(const ::tensorflow::GraphOptimizationPassOptions& options,
                                 PassSwitches* switches) {
  *switches = ProcessSwitches();
  if (options.session_options == nullptr) return ::tensorflow::OkStatus();
  const auto& rewrite = options.session_options->config.graph_options().rewrite_options();
  for (const auto& custom : rewrite.custom_optimizers()) {
    if (custom.name() != kConfigName) continue;
    PassSwitches own;  // a session that names the passes sets every switch itself
    own.fuse_embeddings = own.cluster_dense_for_xla = true;
    for (const auto& [name, value] : custom.parameter_map()) {
      std::string error;
      if (!SetSwitch(name, value.b(), &own, &error)) {
        return ::tensorflow::errors::InvalidArgument("ConfigProto custom optimizer ", kConfigName,
                                                     ": ", error);
      }
    }
    *switches = own;
  }
  return ::tensorflow::OkStatus();
}

}  // namespace

::tensorflow::Status GraphToRewrite(const ::tensorflow::GraphOptimizationPassOptions& options,
                                    bool PassSwitches::*pass, ::tensorflow::Graph** graph) {
  *graph = nullptr;
  if (options.graph == nullptr || *options.graph == nullptr) return ::tensorflow::OkStatus();
  PassSwitches switches;
  TF_RETURN_IF_ERROR(SwitchesFor(options, &switches));
  if (switches.*pass) *graph = options.graph->get();
  return ::tensorflow::OkStatus();
}

::tensorflow::Status MoveConsumers(::tensorflow::Graph* graph, ::tensorflow::Node* from,
                                   int from_output, ::tensorflow::Node* to, int to_output) {
  const std::vector<const ::tensorflow::Edge*> edges(from->out_edges().begin(),
                                                     from->out_edges().end());
  for (const ::tensorflow::Edge* edge : edges) {
    if (edge->IsControlEdge()) {
      graph->AddControlEdge(to, edge->dst());  // the sink's too: `to` may have no consumer left
    } else if (edge->src_output() == from_output) {
      TF_RETURN_IF_ERROR(graph->UpdateEdge(to, to_output, edge->dst(), edge->dst_input()));
    }
  }
  return ::tensorflow::OkStatus();
}

namespace {

// Grappler looks up every custom optimizer a ConfigProto names. The passes themselves run after
// Grappler (kernels/graph/*_pass.cc); this one only makes the name known, and changes nothing.
class SwitchesCarrier : public ::tensorflow::grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return kConfigName; }
  bool UsesFunctionLibrary() const override { return false; }
  ::tensorflow::Status Init(const ::tensorflow::RewriterConfig_CustomGraphOptimizer*) override {
    return ::tensorflow::OkStatus();
  }
  ::tensorflow::Status Optimize(::tensorflow::grappler::Cluster*,
                                const ::tensorflow::grappler::GrapplerItem&,
                                ::tensorflow::GraphDef*) override {
    // Grappler's convention for "returned without changing anything".
    return ::tensorflow::errors::Aborted("nothing to do");
  }
};

REGISTER_GRAPH_OPTIMIZER_AS(SwitchesCarrier, kConfigName);

}  // namespace
}  // namespace graph
}  // namespace tf_ext

#include "kernels/graph/embedding_fusion_rewrite.h"

#include <set>
#include <string>
#include <vector>

#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ext {
namespace graph {
namespace embedding_fusion {

using ::tensorflow::DataType;
using ::tensorflow::Edge;
using ::tensorflow::Graph;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::Status;

namespace {

std::vector<NodeBuilder::NodeOut> Outs(const std::vector<Field>& fields, Output Field::*member) {
  std::vector<NodeBuilder::NodeOut> outs;
  for (const Field& field : fields) {
    const Output& out = field.*member;
    outs.emplace_back(const_cast<Node*>(out.first), out.second);
  }
  return outs;
}

// A Const node of `value` on `device`.
Status ConstOn(Graph* graph, const std::string& device, const std::string& name,
               const ::tensorflow::Tensor& value, Node** node) {
  return NodeBuilder(graph->NewName("tf_ext_fused/" + name), "Const")
      .Attr("dtype", value.dtype())
      .Attr("value", value)
      .Device(device)
      .AssignedDevice(device)
      .Finalize(graph, node);
}

// Ops that TensorFlow calls stateful (they read a resource) but that change nothing.
bool ReadsOnly(const Node* node) {
  const std::string& op = node->type_string();
  return op == "TfExtTableFind" || op == "ReadVariableOp" || op == kFieldOp ||
         op == kRowsGradientOp;
}

}  // namespace

Status BuildFused(Graph* graph, const std::string& op, const std::vector<Field>& fields,
                  const Node* apply, const ConcatPlan* concat,
                  const std::vector<NodeBuilder::NodeOut>& distinct_slots, Node** fused) {
  std::vector<DataType> key_dtypes;
  std::vector<int64_t> dims;
  std::vector<std::string> combiners;
  for (const Field& field : fields) {
    key_dtypes.push_back(field.key_dtype);
    dims.push_back(field.dim);
    combiners.push_back(field.combiner);
  }
  // A Session caches the kernels of stateful ops by node name across the graphs of its different
  // fetches, so the name must tell apart fused ops of different fields or of different
  // concatenation plans (one graph may read a field's own output that another leaves unwritten):
  // it hashes the nodes they replace and the plan.
  std::string replaced_names;
  for (const Field& field : fields) replaced_names += field.replaced->name() + ";";
  if (concat != nullptr) {
    replaced_names += concat->concat->name() + "|";
    for (int64_t entry : concat->layout) replaced_names += std::to_string(entry) + ",";
    replaced_names += "|";
    for (int64_t unread : concat->unread_fields) replaced_names += std::to_string(unread) + ",";
  }
  NodeBuilder builder(graph->NewName("tf_ext_fused/" + op + "_" +
                                     std::to_string(std::hash<std::string>()(replaced_names))),
                      op);
  builder.Input(Outs(fields, &Field::table))
      .Input(Outs(fields, &Field::keys))
      .Input(Outs(fields, &Field::segment_ids))
      .Input(Outs(fields, &Field::num_segments));
  if (apply != nullptr) {
    builder.Input(Outs(fields, &Field::output_gradients));
    // TfExtTableApplyGradient's inputs 3..7 are scalars (learning_rate .. global_step), then the
    // hyperparameters list.
    std::vector<NodeBuilder::NodeOut> hyperparameters;
    for (int i = 3; i < apply->num_inputs(); ++i) {
      Output input;
      TF_RETURN_IF_ERROR(InputOf(apply, i, &input));
      NodeBuilder::NodeOut out(const_cast<Node*>(input.first), input.second);
      if (i < 8) {
        builder.Input(out);
      } else {
        hyperparameters.push_back(out);
      }
    }
    builder.Input(hyperparameters);
    for (const char* name : kApplyAttrs) {
      builder.Attr(name, *apply->attrs().Find(name));
    }
    std::vector<NodeBuilder::NodeOut> split_sizes;
    ::tensorflow::DataTypeVector split_size_types;
    std::vector<int64_t> splits, axes;
    for (const Field& field : fields) {
      splits.push_back(field.split_index);
      axes.push_back(field.split_axis);
      if (field.split_index < 0) continue;
      split_sizes.emplace_back(const_cast<Node*>(field.split_sizes.first),
                               field.split_sizes.second);
      split_size_types.push_back(field.split_sizes.first->output_type(field.split_sizes.second));
    }
    // Consecutive fields of one update (its parts) share an update index.
    std::vector<int64_t> field_updates;
    int64_t update = -1;
    for (size_t i = 0; i < fields.size(); ++i) {
      if (!ContinuesUpdate(fields, i)) ++update;
      field_updates.push_back(update);
    }
    builder.Input(split_sizes)
        .Input(distinct_slots)
        .Attr("Tsplit_sizes", split_size_types)
        .Attr("gradient_splits", splits)
        .Attr("gradient_split_axes", axes)
        .Attr("field_updates", field_updates);
  } else {
    const ConcatPlan no_concat;
    const ConcatPlan& plan = concat != nullptr ? *concat : no_concat;
    std::vector<NodeBuilder::NodeOut> extras;
    for (const Output& extra : plan.extras) {
      extras.emplace_back(const_cast<Node*>(extra.first), extra.second);
    }
    builder.Input(extras)
        .Attr("num_concat_extras", static_cast<int64_t>(extras.size()))
        .Attr("concat_layout", plan.layout)
        .Attr("concat_axis", plan.axis)
        .Attr("unread_fields", plan.unread_fields);
  }
  builder.Attr("N", static_cast<int64_t>(fields.size()))
      .Attr("Tkeys", key_dtypes)
      .Attr("dims", dims)
      .Attr("combiners", combiners)
      .Device(fields[0].device)
      .AssignedDevice(fields[0].device);
  std::vector<const Node*> replaced;
  for (const Field& field : fields) replaced.push_back(field.replaced);
  if (concat != nullptr) replaced.push_back(concat->concat);
  std::set<Node*> control_inputs;
  for (const Node* node : replaced) {
    for (const Edge* edge : node->in_edges()) {
      if (edge->IsControlEdge() && !edge->src()->IsSource()) control_inputs.insert(edge->src());
    }
  }
  builder.ControlInputs(std::vector<Node*>(control_inputs.begin(), control_inputs.end()));
  return builder.Finalize(graph, fused);
}

Status EmptySlots(Graph* graph, const std::string& device, Node** node) {
  return ConstOn(graph, device, "no_distinct_slots",
                 ::tensorflow::Tensor(::tensorflow::DT_INT32, ::tensorflow::TensorShape({0})),
                 node);
}

Status NoSegments(Graph* graph, const std::string& device, Output* segment_ids,
                  Output* num_segments) {
  Node *ids, *count;
  TF_RETURN_IF_ERROR(
      ConstOn(graph, device, "no_segment_ids",
              ::tensorflow::Tensor(::tensorflow::DT_INT64, ::tensorflow::TensorShape({0})), &ids));
  TF_RETURN_IF_ERROR(
      ConstOn(graph, device, "no_num_segments", ::tensorflow::Tensor(int64_t{0}), &count));
  *segment_ids = {ids, 0};
  *num_segments = {count, 0};
  return ::tensorflow::OkStatus();
}

bool Removable(const Node* node, const std::set<const Node*>& kept) {
  if (!node->IsOp() || kept.count(node) > 0) return false;
  if (node->op_def().is_stateful() && !ReadsOnly(node)) return false;
  if (node->IsArg() || node->IsRetval() || node->IsRecv() || node->IsSend()) return false;
  for (const Edge* edge : node->out_edges()) {
    if (!edge->dst()->IsSink()) return false;
  }
  return true;
}

int RemoveReplaced(Graph* graph, const std::vector<Node*>& replaced,
                   const std::set<const Node*>& kept) {
  std::vector<Node*> orphans;
  std::set<Node*> queued(replaced.begin(), replaced.end());  // never queued as orphans
  const auto remove = [&](Node* node) {
    for (const Edge* edge : node->in_edges()) {
      if (!edge->src()->IsSource() && queued.insert(edge->src()).second) {
        orphans.push_back(edge->src());
      }
    }
    graph->RemoveNode(node);
  };
  for (Node* node : replaced) remove(node);
  int removed = static_cast<int>(replaced.size());
  while (!orphans.empty()) {
    Node* node = orphans.back();
    orphans.pop_back();
    queued.erase(node);
    if (!Removable(node, kept)) continue;
    remove(node);
    ++removed;
  }
  return removed;
}

}  // namespace embedding_fusion
}  // namespace graph
}  // namespace tf_ext

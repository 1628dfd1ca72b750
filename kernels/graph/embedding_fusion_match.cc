#include "kernels/graph/embedding_fusion_match.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/reachable_nodes.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/control_flow.h"

namespace tf_ext {
namespace graph {
namespace embedding_fusion {

using ::tensorflow::DataType;
using ::tensorflow::Edge;
using ::tensorflow::Graph;
using ::tensorflow::Node;
using ::tensorflow::Status;

namespace {

// The tensor behind `value`, looking through Identity nodes, and Reshape nodes too where
// `through_reshape` (a reshape keeps the elements and their order).
Output Behind(Output value, bool through_reshape) {
  while (value.first != nullptr && (value.first->type_string() == "Identity" ||
                                    (through_reshape && value.first->type_string() == "Reshape"))) {
    if (!InputOf(value.first, 0, &value).ok()) return {nullptr, 0};
  }
  return value;
}

// The value of a constant integer scalar (a SplitV's axis).
bool ConstantInteger(const Output& value, int64_t* out) {
  const Node* node = value.first;
  if (node == nullptr || !node->IsConstant()) return false;
  const ::tensorflow::TensorProto* proto;
  ::tensorflow::Tensor tensor;
  if (!::tensorflow::GetNodeAttr(node->attrs(), "value", &proto).ok() ||
      !tensor.FromProto(*proto) || tensor.NumElements() != 1) {
    return false;
  }
  if (tensor.dtype() == ::tensorflow::DT_INT32) {
    *out = tensor.flat<int32_t>()(0);
  } else if (tensor.dtype() == ::tensorflow::DT_INT64) {
    *out = tensor.flat<int64_t>()(0);
  } else {
    return false;
  }
  return true;
}

bool IsFloatOp(const Node* node, const char* op) {
  DataType dtype;
  return node != nullptr && node->type_string() == op &&
         ::tensorflow::GetNodeAttr(node->attrs(), "T", &dtype).ok() &&
         dtype == ::tensorflow::DT_FLOAT;
}

Status ReadField(const Node* marker, int first_ingredient, Field* field) {
  TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(marker->attrs(), "Tkey", &field->key_dtype));
  TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(marker->attrs(), "dim", &field->dim));
  TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(marker->attrs(), "combiner", &field->combiner));
  TF_RETURN_IF_ERROR(InputOf(marker, first_ingredient, &field->keys));
  TF_RETURN_IF_ERROR(InputOf(marker, first_ingredient + 1, &field->segment_ids));
  return InputOf(marker, first_ingredient + 2, &field->num_segments);
}

// What a hyperparameter input of a table update computes, so that the updates of one step group
// together: each table's update builds its own constants, variable reads (the learning rate, a
// Keras optimizer's step) and casts of them. Equal constants, reads of one variable and the same
// casts of equal values match; anything else is itself.
std::string ValueSignature(const Output& value, int depth = 0) {
  const Node* node = value.first;
  if (node == nullptr) return "?";
  if (node->IsConstant()) return "const " + node->attrs().Find("value")->ShortDebugString();
  const std::string& op = node->type_string();
  if (depth < 4 && node->num_inputs() == 1 && (op == "ReadVariableOp" || op == "Cast")) {
    const std::string cast = op == "Cast" ? node->attrs().Find("DstT")->ShortDebugString() : "";
    return op + cast + "(" + ValueSignature(SourceOf(node, 0), depth + 1) + ")";
  }
  return node->name() + ":" + std::to_string(value.second);
}

// An output gradient that is output k of a SplitV of floats along a constant axis, on the update's
// device, is read by the fused apply in the SplitV's input.
void ReadFromSplitInput(const Output& gradient, Field* field) {
  const Node* split = gradient.first;
  int64_t axis;
  Output value, sizes;
  if (!IsFloatOp(split, "SplitV") || DeviceOf(split) != field->device ||
      !ConstantInteger(SourceOf(split, 2), &axis) || !InputOf(split, 0, &value).ok() ||
      !InputOf(split, 1, &sizes).ok()) {
    return;
  }
  field->output_gradients = value;
  field->split_sizes = sizes;
  field->split_index = gradient.second;
  field->split_axis = axis;
}

// The consumers of a node's output, looking through Identity nodes: the edges into the first
// non-Identity nodes.
void ValueConsumers(const Node* node, int output, std::vector<const Edge*>* consumers) {
  for (const Edge* edge : node->out_edges()) {
    if (edge->IsControlEdge() || edge->src_output() != output) continue;
    if (edge->dst()->type_string() == "Identity") {
      ValueConsumers(edge->dst(), 0, consumers);
    } else {
      consumers->push_back(edge);
    }
  }
}

bool ReadsShapeOnly(const Node* node) {
  const std::string& op = node->type_string();
  return op == "Shape" || op == "ShapeN" || op == "Size" || op == "Rank";
}

// A ConcatV2 along axis 0 (how TensorFlow sums the gradients of several lookups of one table).
bool ConcatAlongFirstAxis(const Node* node) {
  int64_t axis;
  return node != nullptr && node->type_string() == "ConcatV2" &&
         ConstantInteger(SourceOf(node, node->num_inputs() - 1), &axis) && axis == 0;
}

// The rows-gradient markers whose rows an update sums, in order: `rows` itself where it is one
// whose keys are `keys`, or a ConcatV2 along axis 0 of such markers, `keys` then being the ConcatV2
// of their keys in the same order (one table looked up several times). False for anything else.
bool GradientParts(const Output& rows, const Output& keys, std::vector<const Node*>* markers) {
  const auto marks = [](const Output& marker, const Output& marker_keys) {
    return marker.first != nullptr && marker.first->type_string() == kRowsGradientOp &&
           SourceOf(marker.first, 2) == marker_keys;
  };
  markers->clear();
  if (marks(rows, keys)) {
    markers->push_back(rows.first);
    return true;
  }
  if (!ConcatAlongFirstAxis(rows.first) || !ConcatAlongFirstAxis(keys.first) ||
      rows.first->num_inputs() != keys.first->num_inputs()) {
    return false;
  }
  for (int k = 0; k + 1 < rows.first->num_inputs(); ++k) {
    const Output marker = SourceOf(rows.first, k);
    if (!marks(marker, SourceOf(keys.first, k))) return false;
    markers->push_back(marker.first);
  }
  return true;
}

}  // namespace

Status InputOf(const Node* node, int index, Output* out) {
  const Edge* edge;
  TF_RETURN_IF_ERROR(node->input_edge(index, &edge));
  *out = {edge->src(), edge->src_output()};
  return ::tensorflow::OkStatus();
}

Output SourceOf(const Node* node, int index) {
  Output out{nullptr, 0};
  if (!InputOf(node, index, &out).ok()) return {nullptr, 0};
  return Behind(out, /*through_reshape=*/false);
}

Output SameElementsAs(Output value) { return Behind(value, /*through_reshape=*/true); }

std::string DeviceOf(const Node* node) {
  return node->assigned_device_name().empty() ? node->requested_device()
                                              : node->assigned_device_name();
}

std::vector<bool> Unfusable(Graph* graph) {
  std::vector<bool> unfusable(graph->num_node_ids(), false);
  std::vector<::tensorflow::ControlFlowInfo> frames;
  if (!::tensorflow::BuildControlFlowInfo(graph, &frames).ok()) {
    std::fill(unfusable.begin(), unfusable.end(), true);
    return unfusable;
  }
  std::vector<Node*> order;
  ::tensorflow::GetReversePostOrder(*graph, &order);
  for (Node* node : order) {
    bool dead = node->IsSwitch() || !frames[node->id()].frame_name.empty();
    if (!node->IsMerge()) {
      for (const Edge* edge : node->in_edges()) dead = dead || unfusable[edge->src()->id()];
    }
    unfusable[node->id()] = dead;
  }
  return unfusable;
}

void DropCycles(Graph* graph, std::vector<Field>* fields) {
  std::vector<Node*> replaced;
  for (const Field& field : *fields) replaced.push_back(field.replaced);
  const std::vector<bool> downstream = DownstreamOf(*graph, replaced);
  std::vector<Field> kept;
  for (Field& field : *fields) {
    bool cycle = false;
    for (const Output& input : {field.table, field.keys, field.segment_ids, field.num_segments,
                                field.output_gradients, field.split_sizes}) {
      cycle = cycle || (input.first != nullptr && downstream[input.first->id()]);
    }
    for (const Edge* edge : field.replaced->in_edges()) {
      cycle = cycle || (edge->IsControlEdge() && downstream[edge->src()->id()]);
    }
    if (!cycle) kept.push_back(std::move(field));
  }
  *fields = std::move(kept);
}

bool ContinuesUpdate(const std::vector<Field>& fields, size_t i) {
  return i > 0 && fields[i].replaced == fields[i - 1].replaced;
}

void DropPartialUpdates(std::vector<Field>* fields) {
  std::map<const Node*, int> kept_parts;
  for (const Field& field : *fields) ++kept_parts[field.replaced];
  fields->erase(
      std::remove_if(fields->begin(), fields->end(),
                     [&](const Field& field) { return kept_parts[field.replaced] != field.parts; }),
      fields->end());
}

Status LookupFields(Graph* graph, const std::vector<bool>& unfusable,
                    std::map<std::string, std::vector<Field>>* groups) {
  for (Node* node : graph->op_nodes()) {
    if (node->type_string() != kFieldOp || unfusable[node->id()]) continue;
    Field field;
    field.replaced = node;
    TF_RETURN_IF_ERROR(InputOf(node, 2, &field.table));
    TF_RETURN_IF_ERROR(ReadField(node, 3, &field));
    Output rows;
    TF_RETURN_IF_ERROR(InputOf(node, 1, &rows));
    field.device = DeviceOf(rows.first);  // the find, placed with its table
    (*groups)[field.device].push_back(std::move(field));
  }
  return ::tensorflow::OkStatus();
}

Status ApplyFields(Graph* graph, const std::vector<bool>& unfusable,
                   std::map<std::string, std::vector<Field>>* groups) {
  for (Node* node : graph->op_nodes()) {
    if (node->type_string() != kApplyOp || unfusable[node->id()]) continue;
    const Output unique = SourceOf(node, 1);
    const Output summed = SourceOf(node, 2);
    if (unique.first == nullptr || unique.first->type_string() != "Unique" || unique.second != 0 ||
        summed.first == nullptr || summed.first->type_string() != "UnsortedSegmentSum" ||
        SourceOf(summed.first, 1) != Output{unique.first, 1}) {
      continue;
    }
    Field update;
    update.replaced = node;
    update.device = DeviceOf(node);
    TF_RETURN_IF_ERROR(InputOf(node, 0, &update.table));
    // Applies fuse only with the same optimizer and the same hyperparameter tensors.
    std::string key = update.device;
    for (const char* name : kApplyAttrs) {
      key += "|" + node->attrs().Find(name)->ShortDebugString();
    }
    for (int i = 3; i < node->num_inputs(); ++i) key += "|" + ValueSignature(SourceOf(node, i));
    std::vector<const Node*> markers;
    if (!GradientParts(SourceOf(summed.first, 0), SourceOf(unique.first, 0), &markers)) {
      // A gradient transformed on the way (clipping, loss scaling, an allgather): the update still
      // fuses, from its rows' gradients as TensorFlow computed them (only the dedup and the update
      // are the fused apply's; the gradient's graph stays).
      Field field = update;
      field.rows_given = true;
      field.combiner = "none";
      TF_RETURN_IF_ERROR(InputOf(unique.first, 0, &field.keys));
      TF_RETURN_IF_ERROR(InputOf(summed.first, 0, &field.output_gradients));
      TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(node->attrs(), "Tkey", &field.key_dtype));
      TF_RETURN_IF_ERROR(::tensorflow::GetNodeAttr(node->attrs(), "dim", &field.dim));
      (*groups)[key].push_back(std::move(field));
      continue;
    }
    for (const Node* marker : markers) {
      Field field = update;
      field.parts = static_cast<int>(markers.size());
      TF_RETURN_IF_ERROR(ReadField(marker, 2, &field));
      TF_RETURN_IF_ERROR(InputOf(marker, 1, &field.output_gradients));
      ReadFromSplitInput(SourceOf(marker, 1), &field);
      (*groups)[key].push_back(std::move(field));
    }
  }
  return ::tensorflow::OkStatus();
}

bool PlanConcat(Graph* graph, const std::vector<Field>& fields, const std::vector<bool>& unfusable,
                ConcatPlan* plan) {
  std::map<const Node*, int64_t> field_of;
  std::vector<Node*> markers;
  std::vector<std::vector<const Edge*>> consumers(fields.size());
  std::set<Node*> candidates;
  for (size_t i = 0; i < fields.size(); ++i) {
    field_of[fields[i].replaced] = static_cast<int64_t>(i);
    markers.push_back(fields[i].replaced);
    ValueConsumers(fields[i].replaced, 0, &consumers[i]);
    for (const Edge* edge : consumers[i]) {
      if (IsFloatOp(edge->dst(), "ConcatV2")) candidates.insert(edge->dst());
    }
  }
  const std::vector<bool> downstream = DownstreamOf(*graph, markers);
  int most_fields = 0;
  for (Node* concat : candidates) {
    const int pieces = concat->num_inputs() - 1;
    ConcatPlan candidate;
    candidate.concat = concat;
    if (unfusable[concat->id()] || DeviceOf(concat) != fields[0].device ||
        !ConstantInteger(SourceOf(concat, pieces), &candidate.axis)) {
      continue;
    }
    bool consumed = false, independent = true;
    for (const Edge* edge : concat->out_edges()) consumed = consumed || !edge->IsControlEdge();
    for (const Edge* edge : concat->in_edges()) {
      independent = independent && !(edge->IsControlEdge() && downstream[edge->src()->id()]);
    }
    int num_fields = 0;
    for (int k = 0; k < pieces; ++k) {
      const Output source = SourceOf(concat, k);
      const auto field = field_of.find(source.first);
      if (field != field_of.end() && source.second == 0) {
        candidate.layout.push_back(field->second);
        ++num_fields;
        continue;
      }
      Output input;
      independent =
          independent && InputOf(concat, k, &input).ok() && !downstream[input.first->id()];
      candidate.layout.push_back(-1 - static_cast<int64_t>(candidate.extras.size()));
      candidate.extras.push_back(input);
    }
    if (consumed && independent && num_fields > most_fields) {
      *plan = std::move(candidate);
      most_fields = num_fields;
    }
  }
  if (most_fields == 0) return false;
  for (size_t i = 0; i < fields.size(); ++i) {
    bool unread = !consumers[i].empty();
    for (const Edge* edge : consumers[i]) {
      unread = unread && (edge->dst() == plan->concat || ReadsShapeOnly(edge->dst()));
    }
    if (unread) plan->unread_fields.push_back(static_cast<int64_t>(i));
  }
  return true;
}

}  // namespace embedding_fusion
}  // namespace graph
}  // namespace tf_ext

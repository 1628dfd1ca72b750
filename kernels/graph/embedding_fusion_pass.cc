// Embedding subgraph fusion: every embedding lookup of a step becomes one
// TfExtFusedEmbeddingLookup, and every matching table update one TfExtFusedEmbeddingApply.
//
// tf_ext's lookups leave markers in the graph (tf_ext/dynamic_embedding/fusion_markers.py) that
// name what they compute, so the pass matches markers, not arithmetic that Grappler may change:
//   - TfExtEmbeddingField(embeddings, rows, table, keys, segment_ids, num_segments): the lookup's
//     result. Its consumers are moved to an output of the fused lookup.
//   - TfExtEmbeddingRowsGradient(row_gradients, output_gradients, keys, segment_ids, num_segments):
//     the gradient of the looked-up rows. A TfExtTableApplyGradient fed, through tf.unique and
//     UnsortedSegmentSum of the same keys, by such a marker becomes part of the fused apply,
//     which derives the rows' gradients from output_gradients itself. A table looked up several
//     times gets one update fed by ConcatV2s of the lookups' markers and keys (TensorFlow sums
//     IndexedSlices by concatenating them): it becomes one update of several fields, in order.
//     An update fed otherwise through tf.unique and UnsortedSegmentSum (a gradient clipped,
//     scaled or allgathered on the way) joins the fused apply with its rows' gradients as given
//     (combiner none): only its dedup and update are fused, the gradient's ops stay.
// The unfused subgraphs (find, segment sums, counts, divisions, their gradients, unique) are left
// without consumers and removed. The fused kernels repeat their arithmetic in the same order
// (kernels/dynamic_embedding/core/combiners.h), so the results are equal to the bit.
//
// The concatenation after the lookups goes: where lookups meet a ConcatV2 (tf.concat(embeddings +
// [dense], 1) before a tower), the fused lookup writes each field into its window of the
// concatenation (kernels/dynamic_embedding/core/column_windows.h) and takes the ConcatV2's place;
// the fields' own outputs keep their shapes for the concat's gradient, and their values only where
// something else reads them.
//
// The split before the apply goes too: where a field's output gradient is an output of a SplitV
// (TensorFlow's gradient of a ConcatV2 of more than 16 inputs, as tf.concat(embeddings + [dense],
// 1) before a dense tower makes), the fused apply reads it in the SplitV's input, each field's
// piece copied out by the field's own task (kernels/dynamic_embedding/core/column_windows.h): one
// pass over the gradient instead of the SplitV's and then the apply's.
//
// Runs after Grappler and placement (POST_REWRITE_FOR_EXEC) and before XLA's clustering (phase
// 10), on every Session graph and tf.function, when the switches (pass_switches.h) say so.
// Conservative: markers inside loops or behind a Switch (tf.cond), and markers whose inputs depend
// on another marker, stay unfused; lookups are grouped by the device of their table.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/graph/pass_switches.h"
#include "kernels/reachable_nodes.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/tensor.h"
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
using ::tensorflow::OptimizationPassRegistry;
using ::tensorflow::Status;

constexpr char kFieldOp[] = "TfExtEmbeddingField";
constexpr char kRowsGradientOp[] = "TfExtEmbeddingRowsGradient";
constexpr char kApplyOp[] = "TfExtTableApplyGradient";

// A tensor: a node's output.
using Output = std::pair<const Node*, int>;

Status InputOf(const Node* node, int index, Output* out) {
  const Edge* edge;
  TF_RETURN_IF_ERROR(node->input_edge(index, &edge));
  *out = {edge->src(), edge->src_output()};
  return ::tensorflow::OkStatus();
}

// The tensor behind `value`, looking through Identity nodes, and Reshape nodes too where
// `through_reshape` (a reshape keeps the elements and their order).
Output Behind(Output value, bool through_reshape) {
  while (value.first != nullptr && (value.first->type_string() == "Identity" ||
                                    (through_reshape && value.first->type_string() == "Reshape"))) {
    if (!InputOf(value.first, 0, &value).ok()) return {nullptr, 0};
  }
  return value;
}

// The tensor behind `index`, looking through Identity nodes.
Output SourceOf(const Node* node, int index) {
  Output out{nullptr, 0};
  if (!InputOf(node, index, &out).ok()) return {nullptr, 0};
  return Behind(out, /*through_reshape=*/false);
}

// The tensor whose elements `value` holds in the same order (a table update's ids are a reshape of
// its lookup's).
Output SameElementsAs(Output value) { return Behind(value, /*through_reshape=*/true); }

// One lookup or update to fuse: the node it replaces, and its field's inputs.
struct Field {
  Node* replaced = nullptr;
  Output table, keys, segment_ids, num_segments, output_gradients;
  // An update whose output gradient is output split_index of a SplitV along split_axis:
  // output_gradients is then the SplitV's input, and split_sizes its size_splits.
  Output split_sizes;
  int64_t split_index = -1;
  int64_t split_axis = 0;
  // The fields of the update `replaced` (several lookups of one table make one update).
  int parts = 1;
  // An update whose rows' gradients come from elsewhere than a lookup's marker (clipped, scaled,
  // allgathered): output_gradients holds one row per key, as TensorFlow computed them, and
  // segment_ids and num_segments are still to be made (NoSegments).
  bool rows_given = false;
  DataType key_dtype;
  int64_t dim = 0;
  std::string combiner;
  std::string device;
};

// The ConcatV2 that a fused lookup writes in place of its own op: its layout (field i, or -1 - k
// for extras[k]), its constant axis, and the fields whose own outputs only shape ops read.
struct ConcatPlan {
  Node* concat = nullptr;
  std::vector<int64_t> layout;
  std::vector<Output> extras;
  int64_t axis = 0;
  std::vector<int64_t> unread_fields;
};

// Nodes the pass must not fuse: in a loop frame, or downstream of a Switch before any Merge (their
// inputs may be dead, which would kill the whole fused op).
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

// Drops the fields an input (data or control) of which depends on a node being replaced: fusing
// them would make a cycle.
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

// Whether apply field i is a further part of field i - 1's update (one table looked up several
// times: its update's fields are consecutive).
bool ContinuesUpdate(const std::vector<Field>& fields, size_t i) {
  return i > 0 && fields[i].replaced == fields[i - 1].replaced;
}

// Keeps whole updates only: an update of several fields fuses with all of them or not at all.
void DropPartialUpdates(std::vector<Field>* fields) {
  std::map<const Node*, int> kept_parts;
  for (const Field& field : *fields) ++kept_parts[field.replaced];
  fields->erase(
      std::remove_if(fields->begin(), fields->end(),
                     [&](const Field& field) { return kept_parts[field.replaced] != field.parts; }),
      fields->end());
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

std::vector<NodeBuilder::NodeOut> Outs(const std::vector<Field>& fields, Output Field::*member) {
  std::vector<NodeBuilder::NodeOut> outs;
  for (const Field& field : fields) {
    const Output& out = field.*member;
    outs.emplace_back(const_cast<Node*>(out.first), out.second);
  }
  return outs;
}

// The optimizer attributes that a table update and the fused update share: updates fuse only
// where they agree.
constexpr const char* kApplyAttrs[] = {"optimizer",
                                       "epsilon_inside_sqrt",
                                       "bias_correction",
                                       "bias_correction_step",
                                       "initial_accumulator_value",
                                       "use_nesterov",
                                       "num_hyperparameters"};

// Builds the fused op of `fields`: their field inputs; for the apply, the optimizer inputs and
// attributes of `apply`, the first update it replaces, the splits it reads its gradients in, and
// each field's distinct slots (a fused lookup's, or an empty tensor);
// for the lookup, the concatenation it writes (none without `concat`); and the control inputs of
// the nodes it replaces.
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

// An empty int32 vector on `device`: the distinct slots of an apply field that no fused lookup
// gave (the apply then finds its distinct keys itself).
Status EmptySlots(Graph* graph, const std::string& device, Node** node) {
  return ConstOn(graph, device, "no_distinct_slots",
                 ::tensorflow::Tensor(::tensorflow::DT_INT32, ::tensorflow::TensorShape({0})),
                 node);
}

// The segment_ids and num_segments of fields whose rows' gradients are given (combiner none reads
// neither): an empty int64 vector and a 0, on `device`.
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

// Ops that TensorFlow calls stateful (they read a resource) but that change nothing.
bool ReadsOnly(const Node* node) {
  const std::string& op = node->type_string();
  return op == "TfExtTableFind" || op == "ReadVariableOp" || op == kFieldOp ||
         op == kRowsGradientOp;
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

// Removes `replaced` (the nodes the fused ops took over) and then every node that has lost its
// last consumer. `kept`: nodes that had no consumer before the pass (fetch targets) stay.
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

// The device a field runs on: its table's (where the lookup or update was placed).
std::string DeviceOf(const Node* node) {
  return node->assigned_device_name().empty() ? node->requested_device()
                                              : node->assigned_device_name();
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

// The lookups: TfExtEmbeddingField markers, grouped by device.
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

// The ConcatV2 that the fused lookup of `fields` writes in place of its own op: of floats, along a
// constant axis, on the fields' device, consumed, taking the most of the lookups among its inputs,
// and with no other input (data or control) that depends on a lookup (that would be a cycle).
// False where there is none.
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

// The updates: TfExtTableApplyGradient(table, Unique(keys):0, UnsortedSegmentSum(
// TfExtEmbeddingRowsGradient(..., keys, ...), Unique(keys):1, n), hyperparameters...), or with
// ConcatV2s of several lookups' markers and keys (one field each, consecutive), grouped by
// device, optimizer attributes and hyperparameter inputs.
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

class EmbeddingFusionPass : public GraphOptimizationPass {
 public:
  Status Run(const GraphOptimizationPassOptions& options) override {
    Graph* graph;
    TF_RETURN_IF_ERROR(GraphToRewrite(options, &PassSwitches::fuse_embeddings, &graph));
    if (graph == nullptr) return ::tensorflow::OkStatus();
    bool has_markers = false;
    for (const Node* node : graph->op_nodes()) {
      has_markers =
          has_markers || node->type_string() == kFieldOp || node->type_string() == kRowsGradientOp;
    }
    if (!has_markers) return ::tensorflow::OkStatus();

    std::set<const Node*> kept;  // fetch targets: no consumer before the pass
    for (const Node* node : graph->op_nodes()) {
      if (Removable(node, {})) kept.insert(node);
    }
    const std::vector<bool> unfusable = Unfusable(graph);
    std::map<std::string, std::vector<Field>> lookups, applies;
    TF_RETURN_IF_ERROR(LookupFields(graph, unfusable, &lookups));
    TF_RETURN_IF_ERROR(ApplyFields(graph, unfusable, &applies));

    std::vector<Node*> replaced;
    int fused_lookups = 0, fused_applies = 0, splits_read = 0, concats_written = 0,
        slots_shared = 0;
    // The elements of each int64 field's ids -> the fused lookup's distinct slots of them.
    std::map<Output, NodeBuilder::NodeOut> slot_sources;
    for (auto& [device, fields] : lookups) {
      DropCycles(graph, &fields);
      if (fields.empty()) continue;
      ConcatPlan concat;
      const bool writes_concat = PlanConcat(graph, fields, unfusable, &concat);
      Node* fused;
      TF_RETURN_IF_ERROR(BuildFused(graph, "TfExtFusedEmbeddingLookup", fields, nullptr,
                                    writes_concat ? &concat : nullptr, {}, &fused));
      for (size_t i = 0; i < fields.size(); ++i) {
        TF_RETURN_IF_ERROR(MoveConsumers(graph, fields[i].replaced, 0, fused, static_cast<int>(i)));
        replaced.push_back(fields[i].replaced);
        if (fields[i].key_dtype == ::tensorflow::DT_INT64) {
          slot_sources.emplace(
              SameElementsAs(fields[i].keys),
              NodeBuilder::NodeOut(fused, static_cast<int>(fields.size() + 1 + i)));
        }
      }
      if (writes_concat) {
        TF_RETURN_IF_ERROR(
            MoveConsumers(graph, concat.concat, 0, fused, static_cast<int>(fields.size())));
        replaced.push_back(concat.concat);
        ++concats_written;
      }
      fused_lookups += static_cast<int>(fields.size());
    }
    for (auto& [key, fields] : applies) {
      DropCycles(graph, &fields);
      DropPartialUpdates(&fields);
      if (fields.empty()) continue;
      // A field takes the distinct slots of a fused lookup of the same ids, unless that lookup runs
      // after the updates (the edge would close a cycle).
      std::vector<Node*> updates;
      for (const Field& field : fields) updates.push_back(field.replaced);
      const std::vector<bool> after_updates = DownstreamOf(*graph, updates);
      std::vector<NodeBuilder::NodeOut> distinct_slots;
      Node* no_slots = nullptr;
      Output no_segment_ids, no_num_segments;
      for (Field& field : fields) {
        if (field.rows_given) {
          if (no_segment_ids.first == nullptr) {
            TF_RETURN_IF_ERROR(NoSegments(graph, field.device, &no_segment_ids, &no_num_segments));
          }
          field.segment_ids = no_segment_ids;
          field.num_segments = no_num_segments;
        }
        const auto source = slot_sources.find(SameElementsAs(field.keys));
        if (source != slot_sources.end() && !after_updates[source->second.node->id()]) {
          distinct_slots.push_back(source->second);
          ++slots_shared;
          continue;
        }
        if (no_slots == nullptr) TF_RETURN_IF_ERROR(EmptySlots(graph, field.device, &no_slots));
        distinct_slots.emplace_back(no_slots, 0);
      }
      Node* fused;
      TF_RETURN_IF_ERROR(BuildFused(graph, "TfExtFusedEmbeddingApply", fields, fields[0].replaced,
                                    nullptr, distinct_slots, &fused));
      for (size_t i = 0; i < fields.size(); ++i) {
        splits_read += fields[i].split_index >= 0 ? 1 : 0;
        if (ContinuesUpdate(fields, i)) continue;  // its update is moved already
        TF_RETURN_IF_ERROR(MoveConsumers(graph, fields[i].replaced, -1, fused, -1));
        replaced.push_back(fields[i].replaced);
        ++fused_applies;
      }
    }
    if (replaced.empty()) return ::tensorflow::OkStatus();
    const int removed = RemoveReplaced(graph, replaced, kept);
    RecordFusion(fused_lookups, fused_applies, splits_read, concats_written, slots_shared);
    ::tensorflow::FixupSourceAndSinkEdges(graph);
    VLOG(1) << "tf_ext embedding fusion: " << fused_lookups << " lookups and " << fused_applies
            << " updates fused (" << splits_read << " gradients read in a split's input, "
            << concats_written << " concatenations written by a fused lookup, " << slots_shared
            << " apply fields given their ids' slots by a fused lookup), " << removed
            << " nodes removed";
    return ::tensorflow::OkStatus();
  }
};

REGISTER_OPTIMIZATION(OptimizationPassRegistry::POST_REWRITE_FOR_EXEC, 1, EmbeddingFusionPass);

}  // namespace
}  // namespace graph
}  // namespace tf_ext

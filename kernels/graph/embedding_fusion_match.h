// What the embedding fusion pass (embedding_fusion_pass.cc) fuses: the fields it reads from the
// markers and table updates of a graph, grouped by what may share one fused op, and the checks
// that keep a fusion from closing a cycle or splitting an update.
#ifndef TF_EXT_KERNELS_GRAPH_EMBEDDING_FUSION_MATCH_H_
#define TF_EXT_KERNELS_GRAPH_EMBEDDING_FUSION_MATCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/graph/graph.h"

namespace tf_ext {
namespace graph {
namespace embedding_fusion {

inline constexpr char kFieldOp[] = "TfExtEmbeddingField";
inline constexpr char kRowsGradientOp[] = "TfExtEmbeddingRowsGradient";
inline constexpr char kApplyOp[] = "TfExtTableApplyGradient";

// A tensor: a node's output.
using Output = std::pair<const ::tensorflow::Node*, int>;

// One lookup or update to fuse: the node it replaces, and its field's inputs.
struct Field {
  ::tensorflow::Node* replaced = nullptr;
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
  ::tensorflow::DataType key_dtype;
  int64_t dim = 0;
  std::string combiner;
  std::string device;
};

// The ConcatV2 that a fused lookup writes in place of its own op: its layout (field i, or -1 - k
// for extras[k]), its constant axis, and the fields whose own outputs only shape ops read.
struct ConcatPlan {
  ::tensorflow::Node* concat = nullptr;
  std::vector<int64_t> layout;
  std::vector<Output> extras;
  int64_t axis = 0;
  std::vector<int64_t> unread_fields;
};

// The optimizer attributes that a table update and the fused update share: updates fuse only
// where they agree.
inline constexpr const char* kApplyAttrs[] = {"optimizer",
                                              "epsilon_inside_sqrt",
                                              "bias_correction",
                                              "bias_correction_step",
                                              "initial_accumulator_value",
                                              "use_nesterov",
                                              "num_hyperparameters"};

// The tensor that feeds `node`'s input `index`.
::tensorflow::Status InputOf(const ::tensorflow::Node* node, int index, Output* out);

// The tensor behind `index`, looking through Identity nodes.
Output SourceOf(const ::tensorflow::Node* node, int index);

// The tensor whose elements `value` holds in the same order (a table update's ids are a reshape of
// its lookup's).
Output SameElementsAs(Output value);

// The device a field runs on: its table's (where the lookup or update was placed).
std::string DeviceOf(const ::tensorflow::Node* node);

// Nodes the pass must not fuse: in a loop frame, or downstream of a Switch before any Merge (their
// inputs may be dead, which would kill the whole fused op).
std::vector<bool> Unfusable(::tensorflow::Graph* graph);

// Drops the fields an input (data or control) of which depends on a node being replaced: fusing
// them would make a cycle.
void DropCycles(::tensorflow::Graph* graph, std::vector<Field>* fields);

// Whether apply field i is a further part of field i - 1's update (one table looked up several
// times: its update's fields are consecutive).
bool ContinuesUpdate(const std::vector<Field>& fields, size_t i);

// Keeps whole updates only: an update of several fields fuses with all of them or not at all.
void DropPartialUpdates(std::vector<Field>* fields);

// The lookups: TfExtEmbeddingField markers, grouped by device.
::tensorflow::Status LookupFields(::tensorflow::Graph* graph, const std::vector<bool>& unfusable,
                                  std::map<std::string, std::vector<Field>>* groups);

// The updates: TfExtTableApplyGradient(table, Unique(keys):0, UnsortedSegmentSum(
// TfExtEmbeddingRowsGradient(..., keys, ...), Unique(keys):1, n), hyperparameters...), or with
// ConcatV2s of several lookups' markers and keys (one field each, consecutive), grouped by
// device, optimizer attributes and hyperparameter inputs.
::tensorflow::Status ApplyFields(::tensorflow::Graph* graph, const std::vector<bool>& unfusable,
                                 std::map<std::string, std::vector<Field>>* groups);

// The ConcatV2 that the fused lookup of `fields` writes in place of its own op: of floats, along a
// constant axis, on the fields' device, consumed, taking the most of the lookups among its inputs,
// and with no other input (data or control) that depends on a lookup (that would be a cycle).
// False where there is none.
bool PlanConcat(::tensorflow::Graph* graph, const std::vector<Field>& fields,
                const std::vector<bool>& unfusable, ConcatPlan* plan);

}  // namespace embedding_fusion
}  // namespace graph
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_GRAPH_EMBEDDING_FUSION_MATCH_H_

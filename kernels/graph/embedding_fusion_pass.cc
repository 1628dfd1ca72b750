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
// Runs after Grappler and placement, first of tf_ext's passes and before XLA's clustering
// (kernels/pass_phases.h), on every Session graph and tf.function, when the switches
// (pass_switches.h) say so.
// Conservative: markers inside loops or behind a Switch (tf.cond), and markers whose inputs depend
// on another marker, stay unfused; lookups are grouped by the device of their table.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/graph/embedding_fusion_match.h"
#include "kernels/graph/embedding_fusion_rewrite.h"
#include "kernels/graph/pass_switches.h"
#include "kernels/pass_phases.h"
#include "kernels/reachable_nodes.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ext {
namespace graph {
namespace embedding_fusion {
namespace {

using ::tensorflow::Graph;
using ::tensorflow::GraphOptimizationPass;
using ::tensorflow::GraphOptimizationPassOptions;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::Status;

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

REGISTER_OPTIMIZATION(kEmbeddingFusionPhase.grouping, kEmbeddingFusionPhase.phase,
                      EmbeddingFusionPass);
}  // namespace
}  // namespace embedding_fusion
}  // namespace graph
}  // namespace tf_ext

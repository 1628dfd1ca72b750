// How the embedding fusion pass (embedding_fusion_pass.cc) rewrites a graph: the fused ops built
// in place of the fields embedding_fusion_match.h found, and the nodes they replace removed with
// whatever only fed those.
#ifndef TF_EXT_KERNELS_GRAPH_EMBEDDING_FUSION_REWRITE_H_
#define TF_EXT_KERNELS_GRAPH_EMBEDDING_FUSION_REWRITE_H_

#include <set>
#include <string>
#include <vector>

#include "kernels/graph/embedding_fusion_match.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"

namespace tf_ext {
namespace graph {
namespace embedding_fusion {

// Builds the fused op of `fields`: their field inputs; for the apply, the optimizer inputs and
// attributes of `apply`, the first update it replaces, the splits it reads its gradients in, and
// each field's distinct slots (a fused lookup's, or an empty tensor);
// for the lookup, the concatenation it writes (none without `concat`); and the control inputs of
// the nodes it replaces.
::tensorflow::Status BuildFused(
    ::tensorflow::Graph* graph, const std::string& op, const std::vector<Field>& fields,
    const ::tensorflow::Node* apply, const ConcatPlan* concat,
    const std::vector<::tensorflow::NodeBuilder::NodeOut>& distinct_slots,
    ::tensorflow::Node** fused);

// An empty int32 vector on `device`: the distinct slots of an apply field that no fused lookup
// gave (the apply then finds its distinct keys itself).
::tensorflow::Status EmptySlots(::tensorflow::Graph* graph, const std::string& device,
                                ::tensorflow::Node** node);

// The segment_ids and num_segments of fields whose rows' gradients are given (combiner none reads
// neither): an empty int64 vector and a 0, on `device`.
::tensorflow::Status NoSegments(::tensorflow::Graph* graph, const std::string& device,
                                Output* segment_ids, Output* num_segments);

// Whether `node` may go: an op without consumers that changes nothing, not an argument, a
// return value, a send or a receive, and not in `kept`.
bool Removable(const ::tensorflow::Node* node, const std::set<const ::tensorflow::Node*>& kept);

// Removes `replaced` (the nodes the fused ops took over) and then every node that has lost its
// last consumer. `kept`: nodes that had no consumer before the pass (fetch targets) stay.
int RemoveReplaced(::tensorflow::Graph* graph, const std::vector<::tensorflow::Node*>& replaced,
                   const std::set<const ::tensorflow::Node*>& kept);

}  // namespace embedding_fusion
}  // namespace graph
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_GRAPH_EMBEDDING_FUSION_REWRITE_H_

// When tf_ext's graph passes run: the one table of their groupings and phases, for the passes of
// graph (embedding fusion, XLA dense clustering), mixed_precision (half rewrite) and jit (speed
// gate). A common header of the op library, like reachable_nodes.h: every capability's kernels may
// include it, and none of them has to depend on another for it.
//
// TensorFlow runs a grouping's passes by increasing phase; within one phase their order is
// undefined (optimization_registry.h), so no pass here relies on the order inside its phase. All
// four run in POST_REWRITE_FOR_EXEC, on every graph TensorFlow executes (a Session's and every
// tf.function's), after Grappler, after placement (each node has its device, so lookups group by
// their table's device and a kernel can be checked for the node's device) and after the feeds and
// fetches are rewritten, before partitioning.
//
// TensorFlow 2.15's own passes of that grouping, and ours between them (as TF_CPP_VMODULE=
// optimization_registry=2 lists them for a Session with the op library loaded):
//
//    1  EmbeddingFusionPass (ours)
//    3  ReplicateConstantsPass
//    5  CloneConstantsForBetterClusteringPass, XlaDenseClusterPass (ours)
//    9  ClusterScopingPass
//   10  MarkForCompilationPass                  XLA's clusters are chosen
//   12  ForceXlaConstantsOnHostPass
//   20  IncreaseDynamismForAutoJitPass
//   30  PartiallyDeclusterPass
//   40  ReportClusteringInfoPass
//   50  EncapsulateSubgraphsPass                each cluster becomes a function call
//   60  BuildXlaOpsPass, HalfRewritePass (ours) the calls become _XlaCompile / _XlaRun
//   70  XlaSpeedGatePass (ours)
//
// Ours go fusion, clustering, half rewrite, speed gate; the comments below say why each runs where
// it does.
// tests/kernels/graph/pass_phases_tf_test.cc checks the table against TensorFlow's registry.
#ifndef TF_EXT_KERNELS_PASS_PHASES_H_
#define TF_EXT_KERNELS_PASS_PHASES_H_

#include "tensorflow/core/common_runtime/optimization_registry.h"

namespace tf_ext {

// Where a pass is registered: REGISTER_OPTIMIZATION(phase.grouping, phase.phase, Pass).
struct PassPhase {
  ::tensorflow::OptimizationPassRegistry::Grouping grouping;
  int phase;
};

inline constexpr auto kPostRewriteForExec =
    ::tensorflow::OptimizationPassRegistry::POST_REWRITE_FOR_EXEC;

// TensorFlow's passes that ours are placed against (tensorflow/compiler/jit/
// jit_compilation_pass_registration.cc), all in POST_REWRITE_FOR_EXEC.
inline constexpr int kTfMarkForCompilationPhase = 10;
inline constexpr int kTfEncapsulateSubgraphsPhase = 50;
inline constexpr int kTfBuildXlaOpsPhase = 60;

// kernels/graph/embedding_fusion_pass.cc: the lookups and table updates of a step become one fused
// op each. First of all: it matches the markers tf_ext's lookups leave, and the graph around them
// as Grappler left it, so it must see them before any other pass rewrites or clusters them; and
// the passes after it then see the fused ops (the clustering starts the dense region at the fused
// lookup, XLA keeps the fused ops, which have no XLA kernel, out of its clusters).
inline constexpr PassPhase kEmbeddingFusionPhase{kPostRewriteForExec, 1};

// kernels/graph/xla_dense_cluster_pass.cc: marks the dense part between the tables and the loss
// with _XlaCompile / _XlaScope, as a jit_scope would. After the fusion, so the region it marks
// starts at the fused lookups and does not hold nodes the fusion then removes; before XLA's
// MarkForCompilationPass, which turns those attributes into clusters (at phase 5 it shares with
// CloneConstantsForBetterClusteringPass, which only acts under auto-jit; neither depends on the
// other's order).
inline constexpr PassPhase kXlaDenseClusterPhase{kPostRewriteForExec, 5};

// kernels/mixed_precision/half_rewrite_pass.cc: gives the painted ops a half copy behind
// Switch / Merge on the step's precision predicate. After XLA's EncapsulateSubgraphsPass (50):
// XLA's clusters are function calls by then, which the rewrite leaves alone, so a compiled part
// stays one fp32 compilation (docs/mixed_precision.md, "Under XLA") and the rewrite's Switch and
// Merge never reach XLA's clustering. Before it, they would cut the dense cluster apart (XLA takes
// no Switch or Merge, and keeps nodes of different deadness out of one cluster), and the half
// copies, which carry their originals' _XlaCompile, would make clusters of their own. It shares
// phase 60 with BuildXlaOpsPass, in either order: the rewrite changes only float ops outside the
// clusters, and BuildXlaOpsPass only the cluster calls.
inline constexpr PassPhase kHalfRewritePhase{kPostRewriteForExec, 60};

// kernels/jit/xla_speed_gate_pass.cc: makes each lazily compiled CPU cluster's _XlaCompile
// conditional on the graph's speed gate. It matches the _XlaCompile / Switch / _XlaRun / function
// call pattern that BuildXlaOpsPass builds, so it runs after phase 60, not in it (the order inside
// a phase is undefined). Its order against the half rewrite does not matter: neither changes the
// other's nodes (the gate's have no float T, the rewrite adds no _XlaCompile).
inline constexpr PassPhase kXlaSpeedGatePhase{kPostRewriteForExec, 70};

// The order above, checked when the passes are compiled.
static_assert(kEmbeddingFusionPhase.phase < kXlaDenseClusterPhase.phase,
              "the dense region starts at the fused lookups");
static_assert(kXlaDenseClusterPhase.phase < kTfMarkForCompilationPhase,
              "XLA clusters what the clustering pass marked");
static_assert(kHalfRewritePhase.phase > kTfEncapsulateSubgraphsPhase,
              "the half rewrite runs on what XLA did not take");
static_assert(kXlaSpeedGatePhase.phase > kTfBuildXlaOpsPhase,
              "the speed gate matches what BuildXlaOpsPass built");

}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_PASS_PHASES_H_

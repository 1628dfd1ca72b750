// kernels/pass_phases.h against TensorFlow's registry: each of tf_ext's passes is registered where
// the table says, and TensorFlow's own passes are where the table's reasons assume them.
#include <gtest/gtest.h>

#include "kernels/pass_phases.h"
#include "tests/kernels/graph/graph_pass_tf_test.h"

namespace tf_ext {
namespace {

using pass_test::RegisteredPass;
using pass_test::RegisteredPhase;
using ::tensorflow::OptimizationPassRegistry;

TEST(PassPhasesTest, TfExtPassesAreRegisteredWhereTheTableSays) {
  EXPECT_NE(RegisteredPass(kEmbeddingFusionPhase, "EmbeddingFusionPass"), nullptr);
  EXPECT_NE(RegisteredPass(kXlaDenseClusterPhase, "XlaDenseClusterPass"), nullptr);
  EXPECT_NE(RegisteredPass(kHalfRewritePhase, "HalfRewritePass"), nullptr);
  EXPECT_NE(RegisteredPass(kXlaSpeedGatePhase, "XlaSpeedGatePass"), nullptr);
}

TEST(PassPhasesTest, TensorFlowsXlaPassesAreWhereTheTableAssumesThem) {
  const auto grouping = OptimizationPassRegistry::POST_REWRITE_FOR_EXEC;
  EXPECT_EQ(RegisteredPhase(grouping, "MarkForCompilationPass"), kTfMarkForCompilationPhase);
  EXPECT_EQ(RegisteredPhase(grouping, "EncapsulateSubgraphsPass"), kTfEncapsulateSubgraphsPhase);
  EXPECT_EQ(RegisteredPhase(grouping, "BuildXlaOpsPass"), kTfBuildXlaOpsPhase);
}

TEST(PassPhasesTest, NoOtherTensorFlowPassSitsBetweenBuildXlaOpsAndTheSpeedGate) {
  // The speed gate matches what BuildXlaOpsPass left: nothing of TensorFlow's may change it first.
  const auto& passes = OptimizationPassRegistry::Global()->groups().at(
      OptimizationPassRegistry::POST_REWRITE_FOR_EXEC);
  for (const auto& [phase, registered] : passes) {
    if (phase <= kTfBuildXlaOpsPhase || phase >= kXlaSpeedGatePhase.phase) continue;
    for (const auto& pass : registered) ADD_FAILURE() << pass->name() << " at phase " << phase;
  }
}

}  // namespace
}  // namespace tf_ext

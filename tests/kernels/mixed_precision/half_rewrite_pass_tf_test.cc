// The half-precision rewrite (kernels/mixed_precision/half_rewrite_pass.cc) on small graphs: a
// training step's MatMul gets a half copy behind Switch / Merge on the step's predicate.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/pass_phases.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tests/kernels/graph/graph_pass_tf_test.h"

namespace tf_ext {
namespace {

using pass_test::CountOps;
using pass_test::FindNode;
using pass_test::GraphBuilder;
using pass_test::InputTo;
using pass_test::OpTypes;
using ::tensorflow::DataType;
using ::tensorflow::DT_BFLOAT16;
using ::tensorflow::DT_BOOL;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

::tensorflow::GraphOptimizationPass* HalfRewritePass() {
  return pass_test::RegisteredPass(kHalfRewritePhase, "HalfRewritePass");
}

// loss = Sum(MatMul(x, w)), w a constant (a parameter); with the optimizer's TfExtAmpHalfMode
// unless `with_mode` is false.
void AddStep(GraphBuilder* g, bool with_mode = true, const std::vector<std::string>& deny = {}) {
  Node* x = g->Placeholder("x", DT_FLOAT);
  Node* w = g->Const("w", Tensor(DT_FLOAT, TensorShape({4, 2})));
  Node* matmul = g->Add(NodeBuilder("matmul", "MatMul").Input(x).Input(w));
  Node* loss = g->Add(NodeBuilder("loss", "Sum").Input(matmul).Input(g->Const("axes", int32_t{0})));
  g->Identity("out", loss);
  if (with_mode) {
    g->Add(NodeBuilder("half_mode", "TfExtAmpHalfMode")
               .Input(g->Placeholder("half", DT_BOOL))
               .Attr("half_dtype", DT_BFLOAT16)
               .Attr("deny_ops", deny));
  }
}

DataType TypeOf(const Node* node) {
  DataType type = ::tensorflow::DT_INVALID;
  ::tensorflow::TryGetNodeAttr(node->attrs(), "T", &type);
  return type;
}

std::vector<const Node*> HalfMatMuls(const ::tensorflow::Graph& graph) {
  std::vector<const Node*> found;
  for (const Node* node : graph.op_nodes()) {
    if (node->type_string() == "MatMul" && TypeOf(node) == DT_BFLOAT16) found.push_back(node);
  }
  return found;
}

TEST(HalfRewritePassTest, TheMatMulGetsAHalfCopyBehindTheStepsPredicate) {
  ASSERT_NE(HalfRewritePass(), nullptr);
  GraphBuilder g;
  AddStep(&g);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(HalfRewritePass(), g.owner())));

  // The original stays, in fp32, beside its half copy.
  EXPECT_EQ(TypeOf(FindNode(*g.graph(), "matmul")), DT_FLOAT);
  const std::vector<const Node*> half = HalfMatMuls(*g.graph());
  ASSERT_EQ(half.size(), 1u);
  // x enters through a Switch on the predicate, cast to half on its true side ...
  const auto cast = InputTo(half[0], 0);
  ASSERT_NE(cast.first, nullptr);
  EXPECT_EQ(cast.first->type_string(), "Cast");
  const auto switched = InputTo(cast.first, 0);
  ASSERT_NE(switched.first, nullptr);
  EXPECT_EQ(switched.first->type_string(), "Switch");
  EXPECT_EQ(switched.second, 1);
  EXPECT_EQ(InputTo(switched.first, 1).first, FindNode(*g.graph(), "half_mode"));
  // ... and the product leaves through a Merge of its cast back and the original.
  const auto merged = InputTo(FindNode(*g.graph(), "loss"), 0);
  ASSERT_NE(merged.first, nullptr);
  EXPECT_EQ(merged.first->type_string(), "Merge");
  // The original reads x from the Switch's false side, so only one of the two runs.
  const auto original_input = InputTo(FindNode(*g.graph(), "matmul"), 0);
  EXPECT_EQ(original_input.first, switched.first);
  EXPECT_EQ(original_input.second, 0);
}

TEST(HalfRewritePassTest, ADeniedOpStaysInFullPrecision) {
  GraphBuilder g;
  AddStep(&g, /*with_mode=*/true, /*deny=*/{"MatMul"});
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(HalfRewritePass(), g.owner())));
  EXPECT_TRUE(HalfMatMuls(*g.graph()).empty());
  EXPECT_EQ(CountOps(*g.graph(), "Merge"), 0);
}

TEST(HalfRewritePassTest, AGraphWithoutTheOptimizersModeIsUnchanged) {
  GraphBuilder g;
  AddStep(&g, /*with_mode=*/false);
  const std::vector<std::string> before = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(HalfRewritePass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

TEST(HalfRewritePassTest, AGraphIsRewrittenOnce) {
  GraphBuilder g;
  AddStep(&g);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(HalfRewritePass(), g.owner())));
  const std::vector<std::string> once = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(HalfRewritePass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), once);
}

}  // namespace
}  // namespace tf_ext

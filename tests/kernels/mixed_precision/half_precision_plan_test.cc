// The painting of the half-precision rewrite alone: which ops of a small described graph run in
// half, and how the op lists and their additions decide it.
#include "kernels/mixed_precision/core/half_precision_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tf_ext {
namespace amp {
namespace {

PlanNode Node(const std::string& op, std::vector<int> float_inputs, bool parameter = false) {
  PlanNode node;
  node.op = op;
  node.convertible = !parameter;
  node.parameter = parameter;
  node.float_inputs = std::move(float_inputs);
  return node;
}

// x -> MatMul(x, w) -> BiasAdd(., b) -> Relu -> MatMul(., w2) -> Sub(., label) -> Square -> Sum
std::vector<PlanNode> Tower() {
  return {
      Node("Placeholder", {}),           // 0 x
      Node("ReadVariableOp", {}, true),  // 1 w
      Node("ReadVariableOp", {}, true),  // 2 b
      Node("MatMul", {0, 1}),            // 3
      Node("BiasAdd", {3, 2}),           // 4
      Node("Relu", {4}),                 // 5
      Node("MatMul", {5, 1}),            // 6
      Node("Placeholder", {}),           // 7 label
      Node("Sub", {6, 7}),               // 8
      Node("Square", {8}),               // 9
      Node("Sum", {9}),                  // 10
  };
}

TEST(PaintHalfTest, MatmulsAndTheElementwiseOpsBetweenThemRunInHalf) {
  const std::vector<bool> half = PaintHalf(Tower(), OpLists::Default());
  const std::vector<bool> want = {false, false, false, true,  true, true,
                                  true,  false, false, false, false};
  EXPECT_EQ(half, want);
}

TEST(PaintHalfTest, AnOpMixingHalfWithAnotherFp32ValueStaysFp32) {
  // Sub(matmul, label): the label is neither half nor a parameter; Square after it follows it.
  const std::vector<bool> half = PaintHalf(Tower(), OpLists::Default());
  EXPECT_FALSE(half[8]);
  EXPECT_FALSE(half[9]);
}

TEST(PaintHalfTest, ReductionsAndLossesAreNeverHalf) {
  std::vector<PlanNode> nodes = Tower();
  nodes[10].float_inputs = {6};  // Sum straight after a half MatMul
  EXPECT_FALSE(PaintHalf(nodes, OpLists::Default())[10]);
}

TEST(PaintHalfTest, DenyWinsAndAdditionsExtendTheLists) {
  const OpLists deny_relu = OpLists::Default({}, {}, {"Relu"});
  std::vector<bool> half = PaintHalf(Tower(), deny_relu);
  EXPECT_TRUE(half[4]);
  EXPECT_FALSE(half[5]);
  EXPECT_TRUE(half[6]);  // allow: its input is cast at the boundary

  const OpLists with_sum = OpLists::Default({}, {"Sum"}, {});
  std::vector<PlanNode> nodes = Tower();
  nodes[10].float_inputs = {6};
  EXPECT_TRUE(PaintHalf(nodes, with_sum)[10]);

  const OpLists deny_matmul = OpLists::Default({}, {}, {"MatMul"});
  half = PaintHalf(Tower(), deny_matmul);
  for (bool h : half) EXPECT_FALSE(h);  // nothing starts a half region
}

TEST(PaintHalfTest, DenyingAnOpDeniesGrapplersFusionOfIt) {
  const OpLists lists = OpLists::Default({}, {}, {"MatMul"});
  EXPECT_FALSE(lists.Allowed("_FusedMatMul"));
  EXPECT_TRUE(OpLists::Default().Allowed("_FusedMatMul"));
}

TEST(PaintHalfTest, UnconvertibleNodesStayFp32) {
  std::vector<PlanNode> nodes = Tower();
  nodes[3].convertible = false;  // e.g. no half kernel on its device
  const std::vector<bool> half = PaintHalf(nodes, OpLists::Default());
  EXPECT_FALSE(half[3]);
  EXPECT_FALSE(half[4]);  // nothing half feeds it
  EXPECT_TRUE(half[6]);
}

}  // namespace
}  // namespace amp
}  // namespace tf_ext

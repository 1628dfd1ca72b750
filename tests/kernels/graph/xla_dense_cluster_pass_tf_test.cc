// The XLA dense clustering pass (kernels/graph/xla_dense_cluster_pass.cc) on small graphs: the
// dense ops computed from a table's rows are marked for XLA, the table's ops are not.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/graph/core/pass_switches.h"
#include "kernels/pass_phases.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tests/kernels/graph/graph_pass_tf_test.h"

namespace tf_ext {
namespace graph {
namespace {

using pass_test::FindNode;
using pass_test::GraphBuilder;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::DT_INT64;
using ::tensorflow::DT_RESOURCE;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

::tensorflow::GraphOptimizationPass* ClusterPass() {
  return pass_test::RegisteredPass(kXlaDenseClusterPhase, "XlaDenseClusterPass");
}

// Sigmoid(MatMul(TfExtTableFind(table, keys), w)), and a random op on the tower's output.
void AddTower(GraphBuilder* g) {
  Node* rows = g->Add(NodeBuilder("find", "TfExtTableFind")
                          .Input(g->Placeholder("table", DT_RESOURCE))
                          .Input(g->Placeholder("keys", DT_INT64))
                          .Input(g->Const("anchor", 0.0f))
                          .Attr("Tkey", DT_INT64)
                          .Attr("dim", 4));
  Node* w = g->Const("w", Tensor(DT_FLOAT, TensorShape({4, 1})));
  Node* matmul = g->Add(NodeBuilder("matmul", "MatMul").Input(rows).Input(w));
  Node* sigmoid = g->Add(NodeBuilder("sigmoid", "Sigmoid").Input(matmul));
  g->Identity("out", sigmoid);
  Node* shape = g->Add(NodeBuilder("shape", "Shape").Input(sigmoid));
  g->Add(NodeBuilder("noise", "RandomUniform").Input(shape).Attr("dtype", DT_FLOAT));
}

bool Marked(const ::tensorflow::Graph& graph, const std::string& name) {
  const Node* node = FindNode(graph, name);
  bool compile = false;
  std::string scope;
  return node != nullptr && ::tensorflow::TryGetNodeAttr(node->attrs(), "_XlaCompile", &compile) &&
         compile && ::tensorflow::TryGetNodeAttr(node->attrs(), "_XlaScope", &scope) &&
         !scope.empty();
}

class XlaDenseClusterPassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(ClusterPass(), nullptr);
    PassSwitches on;
    on.cluster_dense_for_xla = true;
    SetProcessSwitches(on);
  }
  void TearDown() override { SetProcessSwitches(PassSwitches()); }
};

TEST_F(XlaDenseClusterPassTest, TheDenseOpsAfterTheTableAreMarkedForXla) {
  GraphBuilder g;
  AddTower(&g);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(ClusterPass(), g.owner())));
  EXPECT_TRUE(Marked(*g.graph(), "matmul"));
  EXPECT_TRUE(Marked(*g.graph(), "sigmoid"));
  EXPECT_TRUE(Marked(*g.graph(), "w"));       // a constant only the region reads joins it
  EXPECT_FALSE(Marked(*g.graph(), "find"));   // the table stays outside
  EXPECT_FALSE(Marked(*g.graph(), "noise"));  // XLA's random numbers would differ
}

TEST_F(XlaDenseClusterPassTest, AUsersOwnXlaAttributeStands) {
  GraphBuilder g;
  AddTower(&g);
  FindNode(*g.graph(), "sigmoid")->AddAttr("_XlaCompile", false);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(ClusterPass(), g.owner())));
  EXPECT_TRUE(Marked(*g.graph(), "matmul"));
  EXPECT_FALSE(Marked(*g.graph(), "sigmoid"));
}

TEST_F(XlaDenseClusterPassTest, WithItsSwitchOffNothingIsMarked) {
  SetProcessSwitches(PassSwitches());
  GraphBuilder g;
  AddTower(&g);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(ClusterPass(), g.owner())));
  EXPECT_FALSE(Marked(*g.graph(), "matmul"));
}

TEST_F(XlaDenseClusterPassTest, AGraphWithoutTablesIsLeftToXla) {
  GraphBuilder g;
  Node* x = g.Placeholder("x", DT_FLOAT);
  g.Add(NodeBuilder("sigmoid", "Sigmoid").Input(x));
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(ClusterPass(), g.owner())));
  EXPECT_FALSE(Marked(*g.graph(), "sigmoid"));
}

}  // namespace
}  // namespace graph
}  // namespace tf_ext

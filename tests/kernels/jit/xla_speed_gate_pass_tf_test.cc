// The speed gate pass (kernels/jit/xla_speed_gate_pass.cc) on the pattern TensorFlow's
// BuildXlaOpsPass makes of a lazily compiled cluster: its _XlaCompile becomes conditional on the
// graph's TfExtXlaSpeedGate, and the uncompiled call runs when XLA is not asked.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/jit/core/speed_gate.h"
#include "kernels/pass_phases.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tests/kernels/graph/graph_pass_tf_test.h"

namespace tf_ext {
namespace jit {
namespace {

using pass_test::CountOps;
using pass_test::FindNode;
using pass_test::GraphBuilder;
using pass_test::OpTypes;
using ::tensorflow::DataTypeVector;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;

constexpr char kCpu[] = "/job:localhost/replica:0/task:0/device:CPU:0";

::tensorflow::GraphOptimizationPass* SpeedGatePass() {
  return pass_test::RegisteredPass(kXlaSpeedGatePhase, "XlaSpeedGatePass");
}

// One cluster as BuildXlaOpsPass leaves it for lazy compilation, on `device`:
//   (key, ready) = _XlaCompile(x); (uncompiled, compiled) = Switch(key, ready)
//   order = Identity(uncompiled); call = PartitionedCall(x, ^order); run = _XlaRun(x, compiled)
void AddLazyCluster(GraphBuilder* g, const std::string& device) {
  ::tensorflow::NameAttrList function;
  function.set_name("cluster_0");
  Node* x = g->Placeholder("x", DT_FLOAT);
  Node* compile = g->Add(NodeBuilder("cluster_0/xla_compile", "_XlaCompile")
                             .Input(std::vector<NodeBuilder::NodeOut>{})
                             .Input(std::vector<NodeBuilder::NodeOut>{{x, 0}})
                             .Input(std::vector<NodeBuilder::NodeOut>{})
                             .Attr("Tconstants", DataTypeVector{})
                             .Attr("must_compile", false)
                             .Attr("function", function)
                             .AssignedDevice(device));
  Node* predicated = g->Add(NodeBuilder("cluster_0/predicated_compilation_key", "Switch")
                                .Input(compile, 0)
                                .Input(compile, 1)
                                .AssignedDevice(device));
  Node* order = g->Add(NodeBuilder("cluster_0/data_as_ctrl", "Identity")
                           .Input(predicated, 0)
                           .AssignedDevice(device));
  g->Add(NodeBuilder("cluster_0/call", "PartitionedCall")
             .Input(std::vector<NodeBuilder::NodeOut>{{x, 0}})
             .Attr("Tout", DataTypeVector{DT_FLOAT})
             .Attr("f", function)
             .ControlInput(order)
             .AssignedDevice(device));
  g->Add(NodeBuilder("cluster_0/xla_run", "_XlaRun")
             .Input(std::vector<NodeBuilder::NodeOut>{{x, 0}})
             .Input(predicated, 1)
             .Attr("Tresults", DataTypeVector{DT_FLOAT})
             .AssignedDevice(device));
}

bool HasControlInputFrom(const Node* node, const std::string& op) {
  for (const ::tensorflow::Edge* edge : node->in_edges()) {
    if (edge->IsControlEdge() && edge->src()->type_string() == op) return true;
  }
  return false;
}

class XlaSpeedGatePassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(SpeedGatePass(), nullptr);
    SetSpeedGateEnabled(true);
  }
  void TearDown() override { SetSpeedGateEnabled(false); }
};

TEST_F(XlaSpeedGatePassTest, ACpuClustersCompilationWaitsForTheGate) {
  GraphBuilder g;
  AddLazyCluster(&g, kCpu);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(SpeedGatePass(), g.owner())));

  EXPECT_EQ(CountOps(*g.graph(), "TfExtXlaSpeedGate"), 1);
  EXPECT_EQ(CountOps(*g.graph(), "TfExtXlaSpeedGateReady"), 1);
  // _XlaCompile runs only on the gate's asking side ...
  const Node* compile = FindNode(*g.graph(), "cluster_0/xla_compile");
  EXPECT_TRUE(HasControlInputFrom(compile, "Identity"));
  // ... and the uncompiled call follows a Merge of "XLA had nothing ready" and "not asked".
  const Node* call = FindNode(*g.graph(), "cluster_0/call");
  EXPECT_TRUE(HasControlInputFrom(call, "Merge"));
  EXPECT_FALSE(HasControlInputFrom(call, "Identity"));
}

TEST_F(XlaSpeedGatePassTest, AClusterOnAnotherDeviceIsLeftAlone) {
  GraphBuilder g;
  AddLazyCluster(&g, "/job:localhost/replica:0/task:0/device:GPU:0");
  const std::vector<std::string> before = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(SpeedGatePass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

TEST_F(XlaSpeedGatePassTest, WithTheGateOffTheGraphIsUnchanged) {
  SetSpeedGateEnabled(false);
  GraphBuilder g;
  AddLazyCluster(&g, kCpu);
  const std::vector<std::string> before = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(SpeedGatePass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

}  // namespace
}  // namespace jit
}  // namespace tf_ext

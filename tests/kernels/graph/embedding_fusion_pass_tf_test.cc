// The embedding fusion pass (kernels/graph/embedding_fusion_pass.cc) on small graphs: the lookups
// that tf_ext's Python API builds, reduced to their markers and the ops the pass matches.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/graph/core/pass_switches.h"
#include "kernels/pass_phases.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"
#include "tensorflow/core/public/session_options.h"
#include "tests/kernels/graph/graph_pass_tf_test.h"

namespace tf_ext {
namespace graph {
namespace {

using pass_test::CountOps;
using pass_test::FindNode;
using pass_test::GraphBuilder;
using pass_test::InputTo;
using pass_test::OpTypes;
using ::tensorflow::DT_BOOL;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::DT_INT64;
using ::tensorflow::DT_RESOURCE;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;

constexpr int kDim = 4;

// One lookup as tf_ext builds it: TfExtTableFind of the keys, combined by segment (the sum), and
// the TfExtEmbeddingField marker that names both. `keys` may come through a Switch (tf.cond).
struct Lookup {
  Node* table;
  Node* marker;
};

Lookup AddLookup(GraphBuilder* g, const std::string& name, Node* keys, int keys_output = 0) {
  Node* table = g->Placeholder(name + "/table", DT_RESOURCE);
  Node* segment_ids = g->Placeholder(name + "/segment_ids", DT_INT64);
  Node* num_segments = g->Const(name + "/num_segments", int64_t{8});
  Node* anchor = g->Const(name + "/anchor", 0.0f);
  Node* rows = g->Add(NodeBuilder(name + "/find", "TfExtTableFind")
                          .Input(table)
                          .Input(keys, keys_output)
                          .Input(anchor)
                          .Attr("Tkey", DT_INT64)
                          .Attr("dim", kDim));
  Node* combined = g->Add(NodeBuilder(name + "/sum", "UnsortedSegmentSum")
                              .Input(rows)
                              .Input(segment_ids)
                              .Input(num_segments));
  Node* marker = g->Add(NodeBuilder(name + "/field", "TfExtEmbeddingField")
                            .Input(combined)
                            .Input(rows)
                            .Input(table)
                            .Input(keys, keys_output)
                            .Input(segment_ids)
                            .Input(num_segments)
                            .Attr("Tkey", DT_INT64)
                            .Attr("dim", kDim)
                            .Attr("combiner", "sum"));
  return {table, marker};
}

// Two lookups, each read by an Identity (a fetch).
void AddTwoLookups(GraphBuilder* g) {
  for (const char* name : {"a", "b"}) {
    Node* keys = g->Placeholder(std::string(name) + "/keys", DT_INT64);
    g->Identity(std::string(name) + "/out", AddLookup(g, name, keys).marker);
  }
}

::tensorflow::GraphOptimizationPass* FusionPass() {
  return pass_test::RegisteredPass(kEmbeddingFusionPhase, "EmbeddingFusionPass");
}

// The process's switches, for one test.
class EmbeddingFusionPassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(FusionPass(), nullptr);
    PassSwitches on;
    on.fuse_embeddings = true;
    SetProcessSwitches(on);
  }
  void TearDown() override { SetProcessSwitches(PassSwitches()); }
};

TEST_F(EmbeddingFusionPassTest, TwoLookupsBecomeOneFusedLookup) {
  GraphBuilder g;
  AddTwoLookups(&g);
  const int64_t fused_before = Stats().lookups_fused;
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));

  ASSERT_EQ(CountOps(*g.graph(), "TfExtFusedEmbeddingLookup"), 1);
  EXPECT_EQ(CountOps(*g.graph(), "TfExtEmbeddingField"), 0);
  // The unfused lookups lost their consumers and went with the markers.
  EXPECT_EQ(CountOps(*g.graph(), "TfExtTableFind"), 0);
  EXPECT_EQ(CountOps(*g.graph(), "UnsortedSegmentSum"), 0);
  const auto a = InputTo(FindNode(*g.graph(), "a/out"), 0);
  const auto b = InputTo(FindNode(*g.graph(), "b/out"), 0);
  ASSERT_NE(a.first, nullptr);
  EXPECT_EQ(a.first->type_string(), "TfExtFusedEmbeddingLookup");
  EXPECT_EQ(a.first, b.first);
  EXPECT_NE(a.second, b.second);  // each fetch reads its own field's output
  int fields = 0;
  ASSERT_TRUE(pass_test::Ok(::tensorflow::GetNodeAttr(a.first->attrs(), "N", &fields)));
  EXPECT_EQ(fields, 2);
  EXPECT_EQ(Stats().lookups_fused, fused_before + 2);
}

TEST_F(EmbeddingFusionPassTest, TheFusedLookupWritesTheConcatenationOfItsFields) {
  GraphBuilder g;
  Node* dense = g.Placeholder("dense", DT_FLOAT);
  std::vector<NodeBuilder::NodeOut> pieces;
  for (const char* name : {"a", "b"}) {
    pieces.emplace_back(
        AddLookup(&g, name, g.Placeholder(std::string(name) + "/keys", DT_INT64)).marker);
  }
  pieces.emplace_back(dense);
  Node* concat =
      g.Add(NodeBuilder("concat", "ConcatV2").Input(pieces).Input(g.Const("axis", int32_t{1})));
  g.Identity("tower", concat);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));

  EXPECT_EQ(CountOps(*g.graph(), "ConcatV2"), 0);
  const auto tower = InputTo(FindNode(*g.graph(), "tower"), 0);
  ASSERT_NE(tower.first, nullptr);
  EXPECT_EQ(tower.first->type_string(), "TfExtFusedEmbeddingLookup");
  EXPECT_EQ(tower.second, 2);  // after the two fields' own outputs
  std::vector<int64_t> layout;
  ASSERT_TRUE(
      pass_test::Ok(::tensorflow::GetNodeAttr(tower.first->attrs(), "concat_layout", &layout)));
  EXPECT_EQ(layout, (std::vector<int64_t>{0, 1, -1}));  // the fields, then the dense input
}

// A table update as tf_ext's optimizer builds it: TfExtTableApplyGradient of the distinct keys
// and of the lookup's rows' gradients (the TfExtEmbeddingRowsGradient marker) summed per distinct
// key. The updates share their hyperparameters, so they fuse into one apply.
void AddUpdate(GraphBuilder* g, const std::string& name,
               const std::vector<Node*>& hyperparameters) {
  Node* table = g->Placeholder(name + "/table", DT_RESOURCE);
  Node* keys = g->Placeholder(name + "/keys", DT_INT64);
  Node* unique = g->Add(NodeBuilder(name + "/unique", "Unique").Input(keys));
  Node* rows_gradient = g->Add(NodeBuilder(name + "/rows_gradient", "TfExtEmbeddingRowsGradient")
                                   .Input(g->Placeholder(name + "/row_gradients", DT_FLOAT))
                                   .Input(g->Placeholder(name + "/output_gradients", DT_FLOAT))
                                   .Input(keys)
                                   .Input(g->Placeholder(name + "/segment_ids", DT_INT64))
                                   .Input(g->Const(name + "/num_segments", int64_t{8}))
                                   .Attr("Tkey", DT_INT64)
                                   .Attr("dim", kDim)
                                   .Attr("combiner", "sum"));
  Node* summed = g->Add(NodeBuilder(name + "/summed", "UnsortedSegmentSum")
                            .Input(rows_gradient)
                            .Input(unique, 1)
                            .Input(g->Const(name + "/distinct", int64_t{8})));
  NodeBuilder apply(name + "/apply", "TfExtTableApplyGradient");
  apply.Input(table).Input(unique, 0).Input(summed);
  for (Node* hyperparameter : hyperparameters) apply.Input(hyperparameter);
  g->Add(apply.Input(std::vector<NodeBuilder::NodeOut>{})
             .Attr("Tkey", DT_INT64)
             .Attr("dim", kDim)
             .Attr("optimizer", "sgd"));
}

TEST_F(EmbeddingFusionPassTest, TableUpdatesWithTheSameHyperparametersBecomeOneFusedApply) {
  GraphBuilder g;
  const std::vector<Node*> hyperparameters = {
      g.Const("learning_rate", 0.1f), g.Const("beta1", 0.0f), g.Const("beta2", 0.0f),
      g.Const("epsilon", 0.0f), g.Const("global_step", int64_t{1})};
  AddUpdate(&g, "a", hyperparameters);
  AddUpdate(&g, "b", hyperparameters);
  const int64_t fused_before = Stats().updates_fused;
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));

  EXPECT_EQ(CountOps(*g.graph(), "TfExtFusedEmbeddingApply"), 1);
  EXPECT_EQ(CountOps(*g.graph(), "TfExtTableApplyGradient"), 0);
  // The apply derives the rows' gradients and the distinct keys itself.
  EXPECT_EQ(CountOps(*g.graph(), "TfExtEmbeddingRowsGradient"), 0);
  EXPECT_EQ(CountOps(*g.graph(), "Unique"), 0);
  EXPECT_EQ(Stats().updates_fused, fused_before + 2);
}

TEST_F(EmbeddingFusionPassTest, TableUpdatesWithOtherHyperparametersStayApart) {
  GraphBuilder g;
  for (const char* name : {"a", "b"}) {
    const std::string prefix(name);
    AddUpdate(&g, prefix,
              {g.Const(prefix + "/learning_rate", prefix == "a" ? 0.1f : 0.2f),
               g.Const(prefix + "/beta1", 0.0f), g.Const(prefix + "/beta2", 0.0f),
               g.Const(prefix + "/epsilon", 0.0f), g.Const(prefix + "/global_step", int64_t{1})});
  }
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));
  EXPECT_EQ(CountOps(*g.graph(), "TfExtFusedEmbeddingApply"), 2);  // one per learning rate
  EXPECT_EQ(CountOps(*g.graph(), "TfExtTableApplyGradient"), 0);
}

TEST_F(EmbeddingFusionPassTest, ALookupBehindASwitchIsLeftAlone) {
  // Under tf.cond the keys may be dead, and a dead input would kill the whole fused op.
  GraphBuilder g;
  Node* keys = g.Placeholder("keys", DT_INT64);
  Node* branch =
      g.Add(NodeBuilder("cond/switch", "Switch").Input(keys).Input(g.Placeholder("pred", DT_BOOL)));
  g.Identity("out", AddLookup(&g, "a", branch, 1).marker);
  const std::vector<std::string> before = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

TEST_F(EmbeddingFusionPassTest, WithItsSwitchOffTheGraphIsUnchanged) {
  SetProcessSwitches(PassSwitches());
  GraphBuilder g;
  AddTwoLookups(&g);
  const std::vector<std::string> before = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

// A session's ConfigProto that names the passes, with these parameters.
::tensorflow::SessionOptions SessionNaming(const std::string& parameter, bool value) {
  ::tensorflow::SessionOptions options;
  auto* custom =
      options.config.mutable_graph_options()->mutable_rewrite_options()->add_custom_optimizers();
  custom->set_name(kConfigName);
  (*custom->mutable_parameter_map())[parameter].set_b(value);
  return options;
}

TEST_F(EmbeddingFusionPassTest, ASessionsOwnSwitchWinsOverTheProcesses) {
  GraphBuilder g;
  AddTwoLookups(&g);
  const std::vector<std::string> before = OpTypes(*g.graph());
  const ::tensorflow::SessionOptions off = SessionNaming("fuse_embeddings", false);
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner(), &off)));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

TEST_F(EmbeddingFusionPassTest, AnUnknownSwitchInTheSessionFailsThePass) {
  GraphBuilder g;
  AddTwoLookups(&g);
  const ::tensorflow::SessionOptions unknown = SessionNaming("fuse_everything", true);
  const ::tensorflow::Status status = pass_test::RunPass(FusionPass(), g.owner(), &unknown);
  EXPECT_EQ(status.code(), ::tensorflow::error::INVALID_ARGUMENT);
  EXPECT_NE(std::string(status.message()).find("fuse_everything"), std::string::npos);
}

TEST_F(EmbeddingFusionPassTest, AGraphWithoutMarkersIsUnchanged) {
  GraphBuilder g;
  g.Identity("out", g.Placeholder("x", DT_FLOAT));
  const std::vector<std::string> before = OpTypes(*g.graph());
  ASSERT_TRUE(pass_test::Ok(pass_test::RunPass(FusionPass(), g.owner())));
  EXPECT_EQ(OpTypes(*g.graph()), before);
}

}  // namespace
}  // namespace graph
}  // namespace tf_ext

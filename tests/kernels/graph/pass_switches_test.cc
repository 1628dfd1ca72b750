// The switches of the graph passes and their counters.
#include "kernels/graph/core/pass_switches.h"

#include <gtest/gtest.h>

#include <string>

namespace tf_ext {
namespace graph {
namespace {

TEST(PassSwitchesTest, SetsKnownSwitchesAndNamesUnknownOnes) {
  PassSwitches switches;
  std::string error;
  EXPECT_FALSE(switches.Any());
  EXPECT_TRUE(SetSwitch("fuse_embeddings", true, &switches, &error));
  EXPECT_TRUE(switches.fuse_embeddings && switches.Any());
  EXPECT_TRUE(SetSwitch("cluster_dense_for_xla", true, &switches, &error));
  EXPECT_TRUE(switches.cluster_dense_for_xla);
  EXPECT_FALSE(SetSwitch("fuse_everything", true, &switches, &error));
  EXPECT_NE(error.find("fuse_everything"), std::string::npos);
}

TEST(PassSwitchesTest, ProcessSwitchesAreWhatWasLastSet) {
  TfExtSetGraphOptimizations(1, 0);
  EXPECT_TRUE(ProcessSwitches().fuse_embeddings);
  EXPECT_FALSE(ProcessSwitches().cluster_dense_for_xla);
  TfExtSetGraphOptimizations(0, 1);
  EXPECT_FALSE(ProcessSwitches().fuse_embeddings);
  EXPECT_TRUE(ProcessSwitches().cluster_dense_for_xla);
  int read[2];
  TfExtGetGraphOptimizations(read);
  EXPECT_EQ(read[0], 0);
  EXPECT_EQ(read[1], 1);
  TfExtSetGraphOptimizations(0, 0);
}

TEST(PassSwitchesTest, CountsWhatThePassesDid) {
  const PassStats before = Stats();
  RecordFusion(26, 25, 24, 1, 20);
  RecordClustering(40);
  int64_t out[8];
  TfExtGraphOptimizationStats(out);
  EXPECT_EQ(out[0], before.graphs_fused + 1);
  EXPECT_EQ(out[1], before.lookups_fused + 26);
  EXPECT_EQ(out[2], before.updates_fused + 25);
  EXPECT_EQ(out[3], before.graphs_clustered + 1);
  EXPECT_EQ(out[4], before.nodes_clustered + 40);
  EXPECT_EQ(out[5], before.splits_read + 24);
  EXPECT_EQ(out[6], before.concats_written + 1);
  EXPECT_EQ(out[7], before.slots_shared + 20);
}

}  // namespace
}  // namespace graph
}  // namespace tf_ext

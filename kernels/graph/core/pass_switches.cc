#include "kernels/graph/core/pass_switches.h"

#include <atomic>

namespace tf_ext {
namespace graph {
namespace {

// Graphs are optimized on many threads; the switches change rarely and are read whole.
std::atomic<bool> process_fuse_embeddings{false};
std::atomic<bool> process_cluster_dense_for_xla{false};

std::atomic<int64_t> graphs_fused{0}, lookups_fused{0}, updates_fused{0}, splits_read{0},
    concats_written{0}, slots_shared{0}, graphs_clustered{0}, nodes_clustered{0};

}  // namespace

PassSwitches ProcessSwitches() {
  PassSwitches switches;
  switches.fuse_embeddings = process_fuse_embeddings.load();
  switches.cluster_dense_for_xla = process_cluster_dense_for_xla.load();
  return switches;
}

void SetProcessSwitches(const PassSwitches& switches) {
  process_fuse_embeddings.store(switches.fuse_embeddings);
  process_cluster_dense_for_xla.store(switches.cluster_dense_for_xla);
}

void RecordFusion(int64_t lookups, int64_t updates, int64_t splits, int64_t concats,
                  int64_t slots) {
  graphs_fused.fetch_add(1);
  lookups_fused.fetch_add(lookups);
  updates_fused.fetch_add(updates);
  splits_read.fetch_add(splits);
  concats_written.fetch_add(concats);
  slots_shared.fetch_add(slots);
}

void RecordClustering(int64_t nodes) {
  graphs_clustered.fetch_add(1);
  nodes_clustered.fetch_add(nodes);
}

PassStats Stats() {
  PassStats stats;
  stats.graphs_fused = graphs_fused.load();
  stats.lookups_fused = lookups_fused.load();
  stats.updates_fused = updates_fused.load();
  stats.splits_read = splits_read.load();
  stats.concats_written = concats_written.load();
  stats.slots_shared = slots_shared.load();
  stats.graphs_clustered = graphs_clustered.load();
  stats.nodes_clustered = nodes_clustered.load();
  return stats;
}

bool SetSwitch(const std::string& name, bool on, PassSwitches* switches, std::string* error) {
  if (name == "fuse_embeddings") {
    switches->fuse_embeddings = on;
  } else if (name == "cluster_dense_for_xla") {
    switches->cluster_dense_for_xla = on;
  } else {
    *error = "unknown graph pass '" + name + "'; known: fuse_embeddings, cluster_dense_for_xla";
    return false;
  }
  return true;
}

}  // namespace graph
}  // namespace tf_ext

extern "C" void TfExtSetGraphOptimizations(int fuse_embeddings, int cluster_dense_for_xla) {
  tf_ext::graph::PassSwitches switches;
  switches.fuse_embeddings = fuse_embeddings != 0;
  switches.cluster_dense_for_xla = cluster_dense_for_xla != 0;
  tf_ext::graph::SetProcessSwitches(switches);
}

extern "C" void TfExtGetGraphOptimizations(int* out) {
  const tf_ext::graph::PassSwitches switches = tf_ext::graph::ProcessSwitches();
  out[0] = switches.fuse_embeddings;
  out[1] = switches.cluster_dense_for_xla;
}

extern "C" void TfExtGraphOptimizationStats(int64_t* out) {
  const tf_ext::graph::PassStats stats = tf_ext::graph::Stats();
  out[0] = stats.graphs_fused;
  out[1] = stats.lookups_fused;
  out[2] = stats.updates_fused;
  out[3] = stats.graphs_clustered;
  out[4] = stats.nodes_clustered;
  out[5] = stats.splits_read;
  out[6] = stats.concats_written;
  out[7] = stats.slots_shared;
}

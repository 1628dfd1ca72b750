// Which of tf_ext's graph passes run. TensorFlow-free: the passes (kernels/graph/*.cc) read the
// switches, tf_ext.graph_optimizations sets them.
//
// Two sources, the narrower winning:
//   - the process: tf_ext.graph_optimizations.enable() sets them for every graph TensorFlow runs
//     afterwards (tf.function, Keras, Sessions without their own setting);
//   - a session: tf_ext.graph_optimizations.config_proto() names kConfigName among the
//     ConfigProto's custom optimizers, with one parameter per switch (kernels/graph/pass_switches.h
//     reads it).
#ifndef TF_EXT_KERNELS_GRAPH_CORE_PASS_SWITCHES_H_
#define TF_EXT_KERNELS_GRAPH_CORE_PASS_SWITCHES_H_

#include <cstdint>
#include <string>

namespace tf_ext {
namespace graph {

// The name under which a session's ConfigProto carries the switches.
inline constexpr char kConfigName[] = "TfExtGraphOptimizations";

struct PassSwitches {
  bool fuse_embeddings = false;        // embedding lookups and their applies -> one op each
  bool cluster_dense_for_xla = false;  // the dense part between the tables and the loss -> XLA

  bool Any() const { return fuse_embeddings || cluster_dense_for_xla; }
};

PassSwitches ProcessSwitches();
void SetProcessSwitches(const PassSwitches& switches);

// Sets the switch `name` ("fuse_embeddings", "cluster_dense_for_xla"). False, with the reason in
// *error, for an unknown name.
bool SetSwitch(const std::string& name, bool on, PassSwitches* switches, std::string* error);

// What the passes did in this process, for tf_ext.graph_optimizations.stats().
struct PassStats {
  int64_t graphs_fused = 0;      // graphs in which the fusion pass fused something
  int64_t lookups_fused = 0;     // lookups replaced by fused lookups
  int64_t updates_fused = 0;     // table updates replaced by fused applies
  int64_t graphs_clustered = 0;  // graphs in which the XLA pass marked nodes
  int64_t nodes_clustered = 0;   // nodes it marked for XLA
  int64_t splits_read = 0;       // lookup gradients that fused applies read in a SplitV's input
  int64_t concats_written = 0;   // ConcatV2s of lookups that fused lookups write instead
  int64_t slots_shared = 0;      // fused apply fields given their ids' slots by a fused lookup
};
void RecordFusion(int64_t lookups, int64_t updates, int64_t splits, int64_t concats, int64_t slots);
void RecordClustering(int64_t nodes);
PassStats Stats();

}  // namespace graph
}  // namespace tf_ext

// For tf_ext.graph_optimizations (through ctypes): sets the process switches; 0 is off.
extern "C" void TfExtSetGraphOptimizations(int fuse_embeddings, int cluster_dense_for_xla);
// Writes the process switches, in TfExtSetGraphOptimizations' order, to out[0..1].
extern "C" void TfExtGetGraphOptimizations(int* out);
// Writes PassStats' eight counters, in their order, to out[0..7].
extern "C" void TfExtGraphOptimizationStats(int64_t* out);

#endif  // TF_EXT_KERNELS_GRAPH_CORE_PASS_SWITCHES_H_

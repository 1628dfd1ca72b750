// What every table core shares, the CPU table (embedding_table.h) and the GPU table
// (gpu/device_table.h): the limits of a row, when eviction removes a row, and the counts a table
// keeps. Plain structs, so CUDA code includes them too.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_TABLE_POLICIES_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_TABLE_POLICIES_H_

#include <cstdint>

#include "kernels/dynamic_embedding/core/host_device.h"
#include "kernels/dynamic_embedding/core/limits.h"  // kMaxDim

namespace tf_ext {
namespace de {

constexpr int kMaxSlots = 4;

// When Evict removes a row; a criterion is off when its value is 0. The step is the global step
// of training updates (UpdateRow's `step`).
struct EvictionCriteria {
  int64_t now_step = 0;
  int64_t ttl_steps = 0;  // now_step - last update step >= ttl_steps
  // update count < min_frequency, once now_step - last update step >= frequency_window_steps
  int64_t min_frequency = 0;
  int64_t frequency_window_steps = 0;
  float min_l2_norm = 0.0f;  // the embedding's L2 norm < min_l2_norm
  // Then, while the table holds more than max_size rows, the least recently updated go.
  int64_t max_size = 0;
};

// Whether Evict's first pass removes a row with this last update step, update count and
// embedding (dim floats). The CPU and the GPU table decide with this one function.
TF_EXT_HOST_DEVICE inline bool Condemned(const EvictionCriteria& c, int64_t last_step,
                                         uint32_t update_count, const float* embedding, int dim) {
  const int64_t idle = c.now_step - last_step;
  if (c.ttl_steps > 0 && idle >= c.ttl_steps) return true;
  if (c.min_frequency > 0 && update_count < c.min_frequency && idle >= c.frequency_window_steps) {
    return true;
  }
  if (c.min_l2_norm > 0) {
    float squares = 0.0f;
    for (int j = 0; j < dim; ++j) squares += embedding[j] * embedding[j];
    if (squares < c.min_l2_norm * c.min_l2_norm) return true;
  }
  return false;
}

// Counts since the table was created (not checkpointed).
struct TableCounters {
  int64_t admitted = 0;     // rows created by training updates
  int64_t rejected = 0;     // training updates of ids not admitted (yet): dropped
  int64_t evicted = 0;      // rows removed by Evict
  int64_t lookups = 0;      // ids looked up
  int64_t lookup_hits = 0;  // of which had a row
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_TABLE_POLICIES_H_

// DeviceTableImpl's sizes, steps, counters and the admission sketch's counters. Part of
// device_table_impl.h, which includes it at its end.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_STATISTICS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_STATISTICS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/gpu/device_table_impl.h"

namespace tf_ext {
namespace de {
namespace gpu {

template <typename Exec>
inline int64_t DeviceTableImpl<Exec>::Size(cudaStream_t stream) {
  exec_.Bind(stream);
  return ReadCounter(kSize);
}

template <typename Exec>
inline int64_t DeviceTableImpl<Exec>::LatestStep(cudaStream_t stream) {
  exec_.Bind(stream);
  return ReadCounter(kLatestStep);
}

template <typename Exec>
inline TableCounters DeviceTableImpl<Exec>::Counters(cudaStream_t stream) {
  exec_.Bind(stream);
  const std::vector<int64_t> values = ReadCounters();
  TableCounters counters;
  counters.admitted = Total(values.data(), kAdmitted);
  counters.rejected = Total(values.data(), kRejected);
  counters.evicted = evicted_;
  counters.lookups = lookups_;
  counters.lookup_hits = Total(values.data(), kHits);
  return counters;
}

template <typename Exec>
inline uint64_t DeviceTableImpl<Exec>::SketchCounters() const {
  return sketch_ == nullptr
             ? 0
             : (sketch_width_mask_ + 1) * static_cast<uint64_t>(options_.admission.sketch_depth);
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::ReadSketch(cudaStream_t stream, uint64_t first, size_t n,
                                                     uint32_t* counters) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (first + n > SketchCounters()) return Error("sketch counters out of range");
  if (n == 0) return "";
  exec_.ToHost(counters, sketch_ + first, sizeof(uint32_t) * n);
  exec_.Sync();
  return Checked("read the admission sketch");
}

template <typename Exec>
inline std::string DeviceTableImpl<Exec>::WriteSketch(cudaStream_t stream, uint64_t first, size_t n,
                                                      const uint32_t* counters, bool keep_larger) {
  const OneCaller caller(this, stream);
  if (!caller.ok()) return Busy();
  if (first + n > SketchCounters()) return Error("sketch counters out of range");
  if (n == 0) return "";
  Scratch<Exec, uint32_t> staged(exec_, static_cast<int64_t>(n));
  if (!staged.ok()) return Error("out of device memory for the admission sketch");
  exec_.ToDevice(staged.get(), counters, sizeof(uint32_t) * n);
  uint32_t* target = sketch_ + first;
  const uint32_t* given = staged.get();
  exec_.For(static_cast<int64_t>(n), [=] TF_EXT_HOST_DEVICE(int64_t i) {
    target[i] = keep_larger ? MaxOf(target[i], given[i]) : given[i];
  });
  exec_.Sync();  // `counters` is the caller's again on return
  return Checked("write the admission sketch");
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::RecordStep(int64_t step, bool if_updated) {
  int64_t* counters = counters_;
  exec_.For(1, [=] TF_EXT_HOST_DEVICE(int64_t) {
    if (!if_updated || Total(counters, kScratch) > 0) {
      atomic::Max(Stripe(counters, kLatestStep), step);
    }
  });
}

template <typename Exec>
inline std::vector<int64_t> DeviceTableImpl<Exec>::ReadCounters() {
  std::vector<int64_t> values(kCounterWords);
  exec_.ToHost(values.data(), counters_, sizeof(int64_t) * kCounterWords);
  exec_.Sync();
  return values;
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::ZeroCounter(Counter counter) {
  exec_.Fill(Stripe(counters_, counter), int64_t{0}, kCounterStripes * kCounterStride);
}

template <typename Exec>
inline void DeviceTableImpl<Exec>::SetCounter(Counter counter, int64_t value) {
  ZeroCounter(counter);
  exec_.Fill(Stripe(counters_, counter), value, 1);
}

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_TABLE_STATISTICS_H_

// The GPU table's slots (device_table.h): what a kernel body does with one key, on a GPU thread or
// a host thread (device_table_impl.h runs the bodies over whole batches). Claiming, finding and
// removing a key, the per-warp counts, and admission through the count-min sketch.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SLOTS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SLOTS_H_

#include <algorithm>
#include <cstdint>

#include "kernels/dynamic_embedding/core/admission.h"
#include "kernels/dynamic_embedding/core/gpu/device_atomics.h"
#include "kernels/dynamic_embedding/core/initializers.h"

namespace tf_ext {
namespace de {
namespace gpu {

// Key slot values that hold no key. The user keys with these bit patterns (-1 and -2) live in
// two extra slots after the probed ones, which hold 0 while absent.
constexpr uint64_t kEmptyKey = ~uint64_t{0};
constexpr uint64_t kTombstoneKey = ~uint64_t{0} - 1;
constexpr int64_t kExtraSlots = 2;

struct EntryMeta {
  int64_t last_step;
  uint32_t update_count;
  uint32_t version;  // the table's version when the row was last written (delta snapshots)
};

// The table's device counters.
enum Counter : int {
  kSize,
  kTombstones,
  kLatestStep,
  kAdmitted,
  kRejected,
  kHits,
  kScratch,  // per-operation results: rows removed, evicted, distinct keys
  kLogged,   // entries of the removal log (RemovalLog)
  kNumCounters
};

// Each counter is the sum of kCounterStripes stripes, a 32-byte sector apart. A warp adds to the
// stripe its keys' index picks, so a batch's adds spread over many addresses instead of queuing
// on one (on a GPU, a million adds to one address take longer than the lookups that make them).
// Counters only set or raised (kLatestStep) live in stripe 0.
constexpr int kCounterStripes = 64;
constexpr int kCounterStride = 4;
constexpr int kCounterWords = kNumCounters * kCounterStripes * kCounterStride;

struct TableView {
  uint64_t* keys;
  float* values;
  EntryMeta* meta;
  int64_t* counters;
  uint32_t* summaries;  // a word per bucket (Probe)
  uint64_t mask;        // probed slots - 1
  int64_t capacity;     // probed slots; then kExtraSlots
  int dim;
  int stride;        // floats per row: dim * (1 + num_slots)
  uint32_t version;  // stamped on every row written (EntryMeta::version)
};

// While the table tracks changes for delta snapshots, each removal appends its key and the
// table's version here, so a delta can name the ids removed since its base. keys is null while
// the table does not track; the log has room for every removal of the operation (the table makes
// it before the operation starts).
struct RemovalLog {
  uint64_t* keys;
  uint32_t* versions;
  int64_t* count;  // the kLogged counter (stripe 0)
  uint32_t version;
};

struct SketchView {
  uint32_t* counters;  // null without sketch admission
  uint64_t width_mask;
  int depth;
  int64_t min_count;
};

// The stripe of counter c that key index i adds to: the same for all of a warp's keys, which are
// 32 aligned indices (one per thread) or fewer (one per tile), as AddWhere needs.
TF_EXT_HOST_DEVICE inline int64_t* Stripe(int64_t* counters, Counter c, int64_t i = 0) {
  return counters + (c * kCounterStripes + ((i >> 5) & (kCounterStripes - 1))) * kCounterStride;
}

TF_EXT_HOST_DEVICE inline int64_t Total(const int64_t* counters, Counter c) {
  int64_t total = 0;
  for (int stripe = 0; stripe < kCounterStripes; ++stripe) {
    total += counters[(c * kCounterStripes + stripe) * kCounterStride];
  }
  return total;
}

TF_EXT_HOST_DEVICE inline bool IsExtraKey(uint64_t key) { return key >= kTombstoneKey; }

TF_EXT_HOST_DEVICE inline int64_t ExtraSlot(const TableView& t, uint64_t key) {
  return t.capacity + static_cast<int64_t>(key - kTombstoneKey);
}

// Whether slot s holds a key.
TF_EXT_HOST_DEVICE inline bool Live(const TableView& t, int64_t s) {
  const uint64_t key = atomic::Load(t.keys + s);
  return s < t.capacity ? key < kTombstoneKey : key != 0;
}

// Whether slot s holds a row written after the snapshot of version `after` (-1: any row).
TF_EXT_HOST_DEVICE inline bool Written(const TableView& t, int64_t s, int64_t after) {
  return Live(t, s) && static_cast<int64_t>(t.meta[s].version) > after;
}

// The threads that work on one key together. A tile scans tile.size() consecutive slots per probe
// (one per lane) and copies a row a vector per lane: on a GPU a slice of a warp (cuda_exec.cuh;
// kDefaultTileLanes), which turns a long probe chain into a few sector reads. SoloTile is the
// one-thread tile of the host executor and of bodies that handle one key per thread.
struct SoloTile {
  TF_EXT_HOST_DEVICE int lane() const { return 0; }
  TF_EXT_HOST_DEVICE static constexpr int size() { return 1; }
  TF_EXT_HOST_DEVICE uint32_t Ballot(bool flag) const { return flag ? 1u : 0u; }
  template <typename T>
  TF_EXT_HOST_DEVICE T Broadcast(T value, int /*from_lane*/) const {
    return value;
  }
};

TF_EXT_HOST_DEVICE inline int LowestBit(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(bits)) - 1;
#else
  return __builtin_ctz(bits);
#endif
}

// Where a key's probe is: slots are probed a bucket of kBucketSlots at a time (64 bytes of keys),
// in slot order within a bucket, and buckets follow one another by double hashing (an odd stride
// over a power-of-two count of buckets visits every bucket). A full bucket sends a key on to an
// unrelated bucket instead of into one long run of occupied slots, so probes stay short near full
// load.
//
// Each bucket has a summary word (4 bytes beside 64 of keys, so the summaries of a large table
// stay mostly in L2): bit Fingerprint(key) for every key ever claimed in the bucket, and
// kOverflowBit once a claim went on past the bucket full. A find reads a bucket's keys only where
// its bit is set (for a bucket of 8 keys, about one time in four when the key is elsewhere), and
// stops at a bucket whose overflow bit is clear. So a missing key costs a summary read or two,
// not the two or three buckets of keys (at 90 % load) it read before. Bits are only ever set:
// removal leaves a tombstone, and a rebuild or Clear starts the words afresh.
constexpr int kBucketSlots = 8;
constexpr uint32_t kOverflowBit = 1u << 31;
constexpr int kFingerprints = 31;

// Summary words of a table of `capacity` probed slots.
inline int64_t SummaryWords(int64_t capacity) { return capacity / kBucketSlots; }

struct Probe {
  uint64_t bucket;
  uint64_t stride;       // odd
  int offset;            // of the next slot to read, within the bucket
  uint32_t fingerprint;  // the key's bit in summary words

  TF_EXT_HOST_DEVICE Probe(const TableView& t, uint64_t key) : offset(0) {
    const uint64_t hash = Mix64(key);
    bucket = hash & BucketMask(t);
    stride = (hash >> 32) | 1;
    // The top bits: the bucket and, up to 2^22 buckets (2^25 slots), the stride use lower ones.
    fingerprint = 1u << ((hash >> 54) % kFingerprints);
  }
  TF_EXT_HOST_DEVICE static uint64_t BucketMask(const TableView& t) {
    return t.mask / kBucketSlots;  // the table has at least 64 slots, a power of two
  }
  TF_EXT_HOST_DEVICE int64_t Slot(int ahead) const {
    return static_cast<int64_t>(bucket * kBucketSlots + offset + ahead);
  }
  TF_EXT_HOST_DEVICE uint32_t* Summary(const TableView& t) const { return t.summaries + bucket; }
  // Moves `slots` ahead; reaching the bucket's end moves to the next bucket.
  TF_EXT_HOST_DEVICE void Skip(const TableView& t, int slots) {
    offset += slots;
    if (offset >= kBucketSlots) {
      offset = 0;
      bucket = (bucket + stride) & BucketMask(t);
    }
  }
};

// Sets `bits` in the probe's bucket summary, from one lane of the tile. The old value is not
// read, so on a GPU the claim goes on without waiting for the L2 round trip (a reduction, not a
// read-modify-write the thread waits for).
template <typename Tile>
TF_EXT_HOST_DEVICE inline void MarkSummary(const TableView& t, const Probe& probe, uint32_t bits,
                                           const Tile& tile, int lane = 0) {
  if (tile.lane() == lane) atomic::Or(probe.Summary(t), bits);
}

// What a scan is for: a find may skip a bucket by its summary, and stops where no key went on; a
// claim reads every bucket it passes, and marks one it leaves full.
enum class ScanFor { kFind, kClaim };

// Reads on from `probe` to the first slot that holds `key` or is empty, as many slots at a time as
// the tile has lanes (up to a bucket): the slot a one-slot-at-a-time scan stops at. Returns the
// slot, whether it holds `key` and the lane that read it; `probe` is left at that slot. For kFind,
// returns -1 (not holding the key) where the summaries show the key is in no later slot.
template <typename Tile>
TF_EXT_HOST_DEVICE inline int64_t ScanTo(const TableView& t, uint64_t k, Probe* probe,
                                         const Tile& tile, ScanFor purpose, bool* holds_key,
                                         int* reader) {
  const int width = MinOf(tile.size(), kBucketSlots);
  *holds_key = false;
  for (;;) {
    uint32_t summary = 0;
    bool read_keys = true;
    if (purpose == ScanFor::kFind) {  // finds enter buckets at their first slot
      summary = atomic::Load(probe->Summary(t));
      read_keys = (summary & probe->fingerprint) != 0;
    }
    while (read_keys) {
      const int span = MinOf(width, kBucketSlots - probe->offset);
      const bool reads = tile.lane() < span;
      const uint64_t held = reads ? atomic::Load(t.keys + probe->Slot(tile.lane())) : kTombstoneKey;
      const uint32_t hit = tile.Ballot(reads && held == k);
      const uint32_t stop = hit | tile.Ballot(reads && held == kEmptyKey);
      if (stop != 0) {
        const int first = LowestBit(stop);
        *holds_key = (hit >> first) & 1u;
        *reader = first;
        probe->Skip(t, first);
        return probe->Slot(0);
      }
      if (probe->offset + span == kBucketSlots) break;  // the bucket is full
      probe->Skip(t, span);
    }
    if (purpose == ScanFor::kFind) {
      if ((summary & kOverflowBit) == 0) return -1;
    } else {
      MarkSummary(t, *probe, kOverflowBit, tile);  // before any claim further on
    }
    probe->Skip(t, kBucketSlots - probe->offset);
  }
}

// The slot of `key`, or -1. Every lane of the tile gets the answer.
template <typename Tile = SoloTile>
TF_EXT_HOST_DEVICE inline int64_t FindSlot(const TableView& t, int64_t key,
                                           const Tile& tile = Tile()) {
  const uint64_t k = static_cast<uint64_t>(key);
  if (IsExtraKey(k)) {
    const int64_t s = ExtraSlot(t, k);
    return atomic::Load(t.keys + s) == k ? s : -1;
  }
  Probe probe(t, k);
  bool holds_key = false;
  int reader = 0;
  const int64_t s = ScanTo(t, k, &probe, tile, ScanFor::kFind, &holds_key, &reader);
  return holds_key ? s : -1;
}

// The slot of `key`, claiming a free one if missing (*created; the caller counts the rows it
// created, CountRows). The caller made room: a free slot always exists. Tombstones are never
// reused, so a key has at most one slot. One lane claims; every lane gets the answer.
template <typename Tile = SoloTile>
TF_EXT_HOST_DEVICE inline int64_t FindOrClaimSlot(const TableView& t, int64_t key, bool* created,
                                                  const Tile& tile = Tile()) {
  const uint64_t k = static_cast<uint64_t>(key);
  if (IsExtraKey(k)) {
    const int64_t s = ExtraSlot(t, k);
    const uint64_t prior = tile.lane() == 0 ? atomic::CompareAndSwap(t.keys + s, 0, k) : 0;
    *created = tile.Broadcast(prior, 0) == 0;
    return s;
  }
  *created = false;
  Probe probe(t, k);
  for (;;) {
    bool holds_key = false;
    int claimer = 0;
    const int64_t s = ScanTo(t, k, &probe, tile, ScanFor::kClaim, &holds_key, &claimer);
    if (holds_key) return s;
    uint64_t prior = 0;
    if (tile.lane() == claimer) prior = atomic::CompareAndSwap(t.keys + s, kEmptyKey, k);
    prior = tile.Broadcast(prior, claimer);
    if (prior == kEmptyKey) {
      MarkSummary(t, probe, probe.fingerprint, tile, claimer);
      *created = true;
      return s;
    }
    if (prior == k) return s;  // another thread claimed it for the same key
    // Another key took the slot; if it was the bucket's last, the bucket is full.
    if (probe.offset == kBucketSlots - 1) MarkSummary(t, probe, kOverflowBit, tile);
    probe.Skip(t, 1);
  }
}

// Whether n floats at `a` and `b` move as 16-byte vectors: on a GPU, when both are aligned.
TF_EXT_HOST_DEVICE inline bool VectorsFit(const float* a, const float* b, int n) {
#if defined(__CUDA_ARCH__)
  return n % 4 == 0 &&
         ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0;
#else
  (void)a, (void)b, (void)n;  // host threads copy float by float
  return false;
#endif
}

// Copies n floats, a lane's share at a time. On a GPU each lane issues up to kInFlight vector
// loads before it stores any: a store could alias a later load, so a plain loop waits out each
// load's latency in turn. Four, not eight: in the find kernel, capped at 64 registers a thread,
// eight spilled, and four made finds 1.01-1.13x faster on an H200 (2026-11-27).
template <typename Tile>
TF_EXT_HOST_DEVICE inline void CopyFloats(const Tile& tile, const float* from, float* to, int n) {
#if defined(__CUDA_ARCH__)
  if (VectorsFit(from, to, n)) {
    constexpr int kInFlight = 4;
    const float4* from4 = reinterpret_cast<const float4*>(from);
    float4* to4 = reinterpret_cast<float4*>(to);
    const int vectors = n / 4, step = tile.size();
    for (int c = tile.lane(); c < vectors; c += step * kInFlight) {
      float4 held[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        if (c + k * step < vectors) held[k] = from4[c + k * step];
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        if (c + k * step < vectors) to4[c + k * step] = held[k];
      }
    }
    return;
  }
#endif
  for (int j = tile.lane(); j < n; j += tile.size()) to[j] = from[j];
}

// Sets n floats to `value`, a lane's share at a time (16-byte stores on a GPU where they fit).
template <typename Tile>
TF_EXT_HOST_DEVICE inline void FillFloats(const Tile& tile, float* to, int n, float value) {
#if defined(__CUDA_ARCH__)
  if (VectorsFit(to, to, n)) {
    for (int c = tile.lane(); c < n / 4; c += tile.size()) {
      reinterpret_cast<float4*>(to)[c] = make_float4(value, value, value, value);
    }
    return;
  }
#endif
  for (int j = tile.lane(); j < n; j += tile.size()) to[j] = value;
}

// The row of slot s into out[0, dim), or, for s = -1, the key's initial row, which a missing key
// reads without being stored.
template <typename Tile>
TF_EXT_HOST_DEVICE inline void ReadRow(const TableView& t, const InitializerSpec& init, int64_t key,
                                       int64_t s, float* out, const Tile& tile) {
  if (s >= 0) {
    CopyFloats(tile, t.values + s * t.stride, out, t.dim);
  } else if (RowElementsAreIndependent(init)) {
    const InitialRowStream stream(InitialRowKeyHash(key), init.seed);
#if defined(__CUDA_ARCH__)
    if (VectorsFit(out, out, t.dim)) {  // four elements per 16-byte store
      for (int c = tile.lane(); c < t.dim / 4; c += tile.size()) {
        reinterpret_cast<float4*>(out)[c] = make_float4(
            InitialRowElement(init, stream, 4 * c), InitialRowElement(init, stream, 4 * c + 1),
            InitialRowElement(init, stream, 4 * c + 2), InitialRowElement(init, stream, 4 * c + 3));
      }
      return;
    }
#endif
    for (int j = tile.lane(); j < t.dim; j += tile.size())
      out[j] = InitialRowElement(init, stream, j);
  } else if (tile.lane() == 0) {  // rejection sampling runs along the row
    TruncatedNormalRow(init, InitialRowStream(InitialRowKeyHash(key), init.seed), out, t.dim);
  }
}

// Removes the key in slot s (-1: none) if it is `key`; returns whether this call removed it.
// Every thread of the body calls it (the counts are per warp, atomic::AddWhere), for its index i;
// the operation's removals are counted in kScratch too, and logged while the table tracks.
TF_EXT_HOST_DEVICE inline bool RemoveAt(const TableView& t, const RemovalLog& log, int64_t s,
                                        int64_t key, int64_t i) {
  const uint64_t k = static_cast<uint64_t>(key);
  const bool extra = s >= t.capacity;
  const bool removed =
      s >= 0 && atomic::CompareAndSwap(t.keys + s, k, extra ? 0 : kTombstoneKey) == k;
  atomic::AddWhere(Stripe(t.counters, kSize, i), removed, -1);
  atomic::AddWhere(Stripe(t.counters, kTombstones, i), removed && !extra, 1);
  atomic::AddWhere(Stripe(t.counters, kScratch, i), removed, 1);
  if (removed && log.keys != nullptr) {
    const int64_t at = atomic::FetchAdd(log.count, 1);
    log.keys[at] = k;
    log.versions[at] = log.version;
  }
  return removed;
}

// Counts rows created by FindOrClaimSlot; every thread of the body calls it, for its index i.
TF_EXT_HOST_DEVICE inline void CountRows(const TableView& t, bool created, int64_t i) {
  atomic::AddWhere(Stripe(t.counters, kSize, i), created, 1);
}

// Counts one more update of a missing key with this hash (conservative update, as
// CountMinSketch::Increment); returns whether it is admitted.
TF_EXT_HOST_DEVICE inline bool Admit(const SketchView& sketch, uint64_t hash) {
  if (sketch.min_count <= 1) return true;
  uint32_t estimate = ~uint32_t{0};
  for (int row = 0; row < sketch.depth; ++row) {
    estimate = MinOf(
        estimate, atomic::Load(sketch.counters + SketchCounterIndex(row, hash, sketch.width_mask)));
  }
  if (estimate == ~uint32_t{0}) return true;  // saturated
  const uint32_t raised = estimate + 1;
  for (int row = 0; row < sketch.depth; ++row) {
    atomic::Max(sketch.counters + SketchCounterIndex(row, hash, sketch.width_mask), raised);
  }
  return raised >= sketch.min_count;
}

// Temporary memory of one operation, freed with it.
template <typename Exec, typename T>
class Scratch {
 public:
  Scratch(Exec& exec, int64_t n) : exec_(exec) {
    ptr_ = static_cast<T*>(exec.Alloc(sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 1))));
  }
  ~Scratch() { exec_.Free(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return ptr_; }
  bool ok() const { return ptr_ != nullptr; }

 private:
  Exec& exec_;
  T* ptr_;
};

}  // namespace gpu
}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_GPU_DEVICE_SLOTS_H_

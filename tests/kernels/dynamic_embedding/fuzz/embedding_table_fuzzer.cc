// libFuzzer harness of the table core (embedding_table.h): a decoded sequence of batch lookups,
// training updates (with exact frequency admission), inserts, removals, evictions, slot growth,
// clears and full or delta snapshots, on int64 or string keys, each checked against a reference
// model (std::map of what every present key's row must hold). Keys come from a small pool so
// operations meet the same rows; a string pool holds keys past the small-string buffer.
//
// FuzzInput: a flags byte (key type, dim, shard bits, admission count), then operations of an
// opcode byte and its operands, until the input ends.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using tf_ext::de::EmbeddingTable;
using tf_ext::de::EvictionCriteria;
using tf_ext::de::InitializerKind;
using tf_ext::de::InitializerSpec;
using tf_ext::de::RowRef;

constexpr int kPool = 24;
const int64_t kIntKeys[kPool] = {0,       1,     -1,        2,         3,
                                 63,      64,    65,        127,       128,
                                 1000,    -1000, INT64_MAX, INT64_MIN, INT64_MAX - 1,
                                 1 << 20, 7,     8,         9,         10,
                                 4096,    4097,  -4096,     0x7fffffff};
std::string StringKey(int i) {
  if (i % 3 == 0) return std::string(20 + i, static_cast<char>('a' + i));  // on the heap
  if (i == 1) return "";
  return "k" + std::to_string(i);
}
template <typename Key>
Key PoolKey(int i);
template <>
int64_t PoolKey<int64_t>(int i) {
  return kIntKeys[i % kPool];
}
template <>
std::string PoolKey<std::string>(int i) {
  return StringKey(i % kPool);
}

struct ModelRow {
  std::vector<float> embedding, slots;
  uint32_t update_count = 0;
  int64_t last_step = 0;
  bool operator==(const ModelRow& o) const {
    return embedding == o.embedding && slots == o.slots && update_count == o.update_count &&
           last_step == o.last_step;
  }
};

template <typename Key>
class Session {
 public:
  Session(int dim, int shard_bits, int64_t min_count)
      : dim_(dim),
        init_{InitializerKind::kUniform, -1.0f, 1.0f, 7},
        table_(dim, init_, shard_bits, tf_ext::de::AdmissionSpec{min_count, true, 0, 4}),
        min_count_(min_count) {}

  void Run(FuzzInput* in) {
    for (int ops = 0; !in->empty() && ops < 64; ++ops) {
      switch (in->Byte() % 10) {
        case 0:
          FindBatch(in);
          break;
        case 1:
        case 2:
          UpdateBatch(in);
          break;
        case 3:
          InsertOrAssign(in);
          break;
        case 4:
          RemoveBatch(in);
          break;
        case 5:
          Evict(in);
          break;
        case 6:
          EnsureSlots(in);
          break;
        case 7:
          Snapshot(in);
          break;
        case 8:
          if (in->Byte() % 8 == 0) Clear();
          break;
        default:
          Commit();
          break;
      }
      CHECK(table_.Size() == static_cast<int64_t>(model_.size()));
    }
    Snapshot(nullptr);
  }

 private:
  std::vector<Key> Keys(FuzzInput* in) {
    std::vector<Key> keys(in->Byte() % 12);
    for (Key& key : keys) key = PoolKey<Key>(in->Byte());
    return keys;
  }
  static typename EmbeddingTable<Key>::KeyView View(const Key& key) { return key; }
  std::vector<float> InitialRow(const Key& key) const {
    std::vector<float> row(dim_);
    tf_ext::de::FillInitialRow(init_, tf_ext::de::InitialRowKeyHash(View(key)), row.data(), dim_);
    return row;
  }
  ModelRow NewRow(const Key& key) const {
    ModelRow row;
    row.embedding = InitialRow(key);
    for (float init : slot_init_) row.slots.insert(row.slots.end(), dim_, init);
    return row;
  }
  ModelRow RowOf(const RowRef& ref) const {
    ModelRow row;
    row.embedding.assign(ref.embedding, ref.embedding + dim_);
    row.slots.assign(ref.slots, ref.slots + dim_ * slot_init_.size());
    row.update_count = *ref.update_count;
    row.last_step = *ref.last_step;
    return row;
  }

  void FindBatch(FuzzInput* in) {
    const std::vector<Key> keys = Keys(in);
    std::vector<float> out(keys.size() * dim_ + 1, -999.0f);  // one past: must stay untouched
    const int64_t found = table_.FindBatch(
        static_cast<int64_t>(keys.size()), [&](int64_t i) { return View(keys[i]); }, out.data());
    int64_t expected = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = model_.find(keys[i]);
      expected += it != model_.end();
      const std::vector<float> want =
          it != model_.end() ? it->second.embedding : InitialRow(keys[i]);
      CHECK(std::equal(want.begin(), want.end(), out.begin() + i * dim_));
    }
    CHECK(found == expected);
    CHECK(out.back() == -999.0f);
  }

  void UpdateBatch(FuzzInput* in) {
    const std::vector<Key> keys = Keys(in);
    const int64_t step = in->Byte();
    const float delta = static_cast<float>(in->Byte() % 16) - 8.0f;
    const int slots = static_cast<int>(slot_init_.size());
    auto apply = [&](int64_t i, float* embedding, float* slot_values) {
      for (int j = 0; j < dim_; ++j) embedding[j] += delta + static_cast<float>(i);
      for (int j = 0; j < dim_ * slots; ++j) slot_values[j] += 1.0f;
    };
    const int64_t ran = table_.UpdateBatch(
        static_cast<int64_t>(keys.size()), [&](int64_t i) { return View(keys[i]); }, step,
        [&](int64_t i, RowRef& row) { apply(i, row.embedding, row.slots); });
    int64_t expected = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = model_.find(keys[i]);
      if (it == model_.end()) {
        if (min_count_ > 1 && ++pending_[keys[i]] < min_count_) continue;
        pending_.erase(keys[i]);
        it = model_.emplace(keys[i], NewRow(keys[i])).first;
      }
      apply(static_cast<int64_t>(i), it->second.embedding.data(), it->second.slots.data());
      if (it->second.update_count != UINT32_MAX) ++it->second.update_count;
      it->second.last_step = step;
      ++expected;
    }
    CHECK(ran == expected);
    if (ran > 0) latest_step_ = std::max(latest_step_, step);
    CHECK(table_.latest_step() == latest_step_);
  }

  void InsertOrAssign(FuzzInput* in) {
    const Key key = PoolKey<Key>(in->Byte());
    std::vector<float> values(dim_);
    for (float& v : values) v = static_cast<float>(in->Byte()) - 100.0f;
    table_.InsertOrAssign(View(key), values.data());
    auto it = model_.find(key);
    if (it == model_.end()) {
      it = model_.emplace(key, NewRow(key)).first;
      it->second.last_step = latest_step_;
    }
    it->second.embedding = values;
  }

  void RemoveBatch(FuzzInput* in) {
    const std::vector<Key> keys = Keys(in);
    const int64_t removed = table_.RemoveBatch(static_cast<int64_t>(keys.size()),
                                               [&](int64_t i) { return View(keys[i]); });
    int64_t expected = 0;
    for (const Key& key : keys) expected += model_.erase(key);
    CHECK(removed == expected);
  }

  void Evict(FuzzInput* in) {
    EvictionCriteria c;
    c.now_step = in->Byte() * 2;
    const uint8_t pick = in->Byte();
    if (pick & 1) c.ttl_steps = 1 + in->Byte();
    if (pick & 2) {
      c.min_frequency = in->Byte() % 4;
      c.frequency_window_steps = in->Byte() % 32;
    }
    if (pick & 4) c.min_l2_norm = static_cast<float>(in->Byte() % 16);
    if (pick & 8) c.max_size = in->Byte() % 16;
    const int64_t removed = table_.Evict(c);
    int64_t expected = 0;
    if (c.ttl_steps > 0 || c.min_frequency > 0 || c.min_l2_norm > 0) {
      for (auto it = model_.begin(); it != model_.end();) {
        const ModelRow& row = it->second;
        if (tf_ext::de::Condemned(c, row.last_step, row.update_count, row.embedding.data(), dim_)) {
          it = model_.erase(it);
          ++expected;
        } else {
          ++it;
        }
      }
    }
    // Then the least recently updated above max_size: which of equal last steps is the table's
    // choice, so the model takes the table's survivors after checking they are the most recent.
    const int64_t excess = static_cast<int64_t>(model_.size()) - c.max_size;
    if (c.max_size > 0 && excess > 0) {
      CHECK(removed == expected + excess);
      int64_t oldest_kept = INT64_MAX, newest_gone = INT64_MIN;
      for (auto it = model_.begin(); it != model_.end();) {
        if (table_.Contains(View(it->first))) {
          oldest_kept = std::min(oldest_kept, it->second.last_step);
          ++it;
        } else {
          newest_gone = std::max(newest_gone, it->second.last_step);
          it = model_.erase(it);
        }
      }
      CHECK(newest_gone <= oldest_kept);
    } else {
      CHECK(removed == expected);
    }
  }

  void EnsureSlots(FuzzInput* in) {
    const int slots = in->Byte() % (tf_ext::de::kMaxSlots + 1);
    std::vector<float> init(slots);
    for (int s = 0; s < slots; ++s) init[s] = 0.25f * s;
    table_.EnsureSlots(slots, init);
    while (static_cast<int>(slot_init_.size()) < slots) {
      slot_init_.push_back(init[slot_init_.size()]);
      for (auto& [key, row] : model_) row.slots.insert(row.slots.end(), dim_, slot_init_.back());
    }
    CHECK(table_.num_slots() == static_cast<int>(slot_init_.size()));
  }

  void Clear() {
    table_.Clear();
    model_.clear();
    pending_.clear();
    base_version_ = -1;  // Clear stops change tracking: the next delta has no base
  }

  void Commit() {
    if (base_version_ >= 0) table_.CommitSnapshot(base_version_);
  }

  // A delta since the last snapshot when there is one (and the input asks), else a full one.
  // Either must replay, onto what the base snapshot held, to exactly the model.
  void Snapshot(FuzzInput* in) {
    const bool delta = in != nullptr && base_version_ >= 0 && (in->Byte() & 1);
    std::map<Key, ModelRow> rows = delta ? base_ : std::map<Key, ModelRow>();
    int64_t declared_rows = -1, declared_tombstones = -1, seen_rows = 0, seen_tombstones = 0;
    const int64_t version = table_.Snapshot(
        delta ? base_version_ : EmbeddingTable<Key>::kFullSnapshot,
        [&](int64_t n, int64_t t) {
          declared_rows = n;
          declared_tombstones = t;
          return true;
        },
        [&](const Key& key, const RowRef& ref) {
          ++seen_rows;
          rows[key] = RowOf(ref);
          return true;
        },
        [&](const Key& key) {
          CHECK(seen_rows == 0);  // tombstones first
          ++seen_tombstones;
          rows.erase(key);
          return true;
        });
    // A restore gives rows saved before the table grew slots the slots' initial values.
    for (auto& [key, row] : rows) {
      for (size_t s = row.slots.size() / dim_; s < slot_init_.size(); ++s) {
        row.slots.insert(row.slots.end(), dim_, slot_init_[s]);
      }
    }
    CHECK(version >= 1);
    CHECK(seen_rows == declared_rows && seen_tombstones == declared_tombstones);
    CHECK(rows == model_);
    base_ = model_;
    base_version_ = version;
  }

  const int dim_;
  const InitializerSpec init_;
  EmbeddingTable<Key> table_;
  const int64_t min_count_;
  std::map<Key, ModelRow> model_;
  std::map<Key, int64_t> pending_;  // admission counts of keys without a row
  std::vector<float> slot_init_;
  int64_t latest_step_ = 0;
  std::map<Key, ModelRow> base_;  // what the last snapshot held
  int64_t base_version_ = -1;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in(data, size);
  const uint8_t flags = in.Byte();
  const int dim = 1 + (flags >> 1) % 5;
  const int shard_bits = (flags >> 4) % 3;
  const int64_t min_count = (flags >> 6) % 4;
  if (flags & 1) {
    Session<std::string>(dim, shard_bits, min_count).Run(&in);
  } else {
    Session<int64_t>(dim, shard_bits, min_count).Run(&in);
  }
  return 0;
}

// The CPU table's side of a restore (snapshot_restore.h): rows go straight into a new
// EmbeddingTable, one Upsert each, on the calling thread.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SINK_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SINK_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dynamic_embedding/core/embedding_table.h"
#include "kernels/dynamic_embedding/core/limits.h"
#include "kernels/dynamic_embedding/core/snapshot_restore.h"

namespace tf_ext {
namespace de {

template <typename Key>
class EmbeddingTableSink : public RestoreSink<Key> {
 public:
  using KeyView = typename RestoreSink<Key>::KeyView;
  // `table` (not owned) is the new table; `name` and `max_rows` are the live table's.
  EmbeddingTableSink(std::string name, EmbeddingTable<Key>* table, int64_t max_rows)
      : name_(std::move(name)), table_(table), max_rows_(max_rows) {}

  int num_slots() const override { return table_->num_slots(); }
  TableError EnsureSlots(int num_slots, const std::vector<float>& slot_init) override {
    table_->EnsureSlots(num_slots, slot_init);
    return TableError::Ok();
  }
  TableError PutRow(KeyView key, uint32_t update_count, int64_t last_step, const float* values,
                    int file_slots) override {
    if (table_->Size() >= max_rows_ && !table_->Contains(key)) {
      return TableError::OverLimit(CheckTableRows(name_, table_->Size(), 1, max_rows_));
    }
    const int dim = table_->dim();
    table_->Upsert(key, [&](RowRef& row, bool) {
      std::memcpy(row.embedding, values, sizeof(float) * dim);
      std::memcpy(row.slots, values + dim, sizeof(float) * dim * file_slots);
      *row.update_count = update_count;
      *row.last_step = last_step;
    });
    return TableError::Ok();
  }
  TableError Remove(KeyView key) override {
    table_->Remove(key);
    return TableError::Ok();
  }
  TableError ClearAdmission() override {
    table_->ClearAdmission();
    return TableError::Ok();
  }
  TableError RestorePending(KeyView key, uint32_t count) override {
    table_->RestorePending(key, count);
    return TableError::Ok();
  }
  TableError RestoreSketch(uint64_t width, int depth, uint64_t first, size_t n,
                           const uint32_t* counters) override {
    // false: a sketch of another shape, dropped.
    table_->RestoreSketch(static_cast<int64_t>(width), depth, first, n, counters);
    return TableError::Ok();
  }

 private:
  const std::string name_;
  EmbeddingTable<Key>* table_;
  const int64_t max_rows_;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_EMBEDDING_TABLE_SINK_H_

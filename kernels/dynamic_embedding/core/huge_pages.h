// Memory mapped on 2 MiB boundaries and advised as transparent huge pages, for the table's large
// arrays that are read at random (entry slabs, chunk_arena.h; the admission sketch, admission.h):
// with 4 KiB pages each random read is a TLB miss as well as a cache miss. TensorFlow-free.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_HUGE_PAGES_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace tf_ext {
namespace de {

constexpr size_t kHugePage = size_t{2} << 20;

// Maps `bytes` (a multiple of kHugePage) starting on a huge page boundary, advised as huge pages;
// nullptr where the mapping fails. Give it back with munmap(the pointer, bytes).
inline char* MapHugePages(size_t bytes) {
  // Huge pages need 2 MiB-aligned ranges: over-map by one, then trim the ends.
  const size_t mapped = bytes + kHugePage;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  char* base = static_cast<char*>(raw);
  char* start = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) &
                                        ~(kHugePage - 1));
  if (start > base) munmap(base, start - base);
  char* end = start + bytes;
  if (base + mapped > end) munmap(end, base + mapped - end);
  madvise(start, bytes, MADV_HUGEPAGE);
  return start;
}

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_HUGE_PAGES_H_

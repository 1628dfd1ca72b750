// ChunkArena::Prepare: the slab a writer prepares before taking a shard's lock is mapped and
// faulted in then, so that the Allocate under the lock that first uses it touches resident memory.
#include "kernels/dynamic_embedding/core/chunk_arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace tf_ext {
namespace de {
namespace {

constexpr size_t kChunk = size_t{16} << 10;

// Whether every page of [address, address + bytes) is resident.
bool Resident(const char* address, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(address) & ~(page - 1);
  const size_t pages = (reinterpret_cast<uintptr_t>(address) + bytes - begin + page - 1) / page;
  std::vector<unsigned char> residency(pages);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(begin), pages * page, residency.data()), 0);
  for (unsigned char r : residency) {
    if (!(r & 1)) return false;
  }
  return true;
}

// Allocates chunks until one comes from a new slab; returns that chunk.
char* AllocateIntoNextSlab(ChunkArena* arena) {
  const size_t reserved = arena->ReservedBytes();
  while (true) {
    char* chunk = arena->Allocate(kChunk);
    if (arena->ReservedBytes() != reserved) return chunk;
  }
}

TEST(ChunkArenaTest, APreparedSlabIsFaultedInBeforeAllocateUsesIt) {
  ChunkArena arena;
  // Grow until slabs are mapped (2 MiB and more: an eighth of what is reserved).
  while (arena.ReservedBytes() < (size_t{24} << 20)) arena.Allocate(kChunk);

  // Without Prepare, the first chunk of a new slab is not resident until written.
  char* unprepared = AllocateIntoNextSlab(&arena);
  EXPECT_FALSE(Resident(unprepared, kChunk));

  arena.Prepare(SIZE_MAX);  // more than the current slab has left: a spare is prepared
  EXPECT_TRUE(arena.HasSpareForTesting());
  const size_t reserved = arena.ReservedBytes();  // the spare is not counted until used
  char* prepared = AllocateIntoNextSlab(&arena);
  EXPECT_FALSE(arena.HasSpareForTesting());
  EXPECT_GT(arena.ReservedBytes(), reserved);
  EXPECT_TRUE(Resident(prepared, kChunk));
}

TEST(ChunkArenaTest, PrepareDoesNothingWhileTheCurrentSlabHasRoom) {
  ChunkArena arena;
  while (arena.ReservedBytes() < (size_t{24} << 20)) arena.Allocate(kChunk);
  AllocateIntoNextSlab(&arena);  // a fresh slab, nearly all of it left
  arena.Prepare(kChunk);
  EXPECT_FALSE(arena.HasSpareForTesting());
}

TEST(ChunkArenaTest, SmallArenasPrepareNothing) {
  ChunkArena arena;  // slabs under 2 MiB come from malloc: nothing to fault in ahead
  arena.Allocate(kChunk);
  arena.Prepare(SIZE_MAX);
  EXPECT_FALSE(arena.HasSpareForTesting());
}

}  // namespace
}  // namespace de
}  // namespace tf_ext

// Per-row cost of computing initial rows (FillInitialRow), by kind and initializer version: the
// work a lookup of a missing id or the creation of a row does before touching the table.
//   g++ -std=c++17 -O3 -march=x86-64-v2 -fno-math-errno -I. \
//       benchmarks/initial_rows_bench.cc kernels/dynamic_embedding/core/initializers.cc \
//       -o /tmp/initial_rows_bench && /tmp/initial_rows_bench
// (the flags of the op library's build, .bazelrc). Prints the best of five rounds' thread CPU time
// per row, for dims 8 and 64.
#include <time.h>

#include <cstdio>
#include <vector>

#include "kernels/dynamic_embedding/core/initializers.h"

namespace {

using tf_ext::de::FillInitialRow;
using tf_ext::de::InitializerKind;
using tf_ext::de::InitializerSpec;
using tf_ext::de::InitialRowKeyHash;

// CPU time of this thread: on a shared machine, wall time counts the other processes' turns.
double ThreadSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + 1e-9 * now.tv_nsec;
}

double NanosecondsPerRow(const InitializerSpec& spec, int dim, int rows) {
  std::vector<float> row(dim);
  float sink = 0.0f;
  const double start = ThreadSeconds();
  for (int i = 0; i < rows; ++i) {
    FillInitialRow(spec, InitialRowKeyHash(static_cast<int64_t>(i)), row.data(), dim);
    sink += row[i % dim];
  }
  const double elapsed = ThreadSeconds() - start;
  if (sink == 12345.0f) std::puts("");  // keeps the rows alive
  return elapsed * 1e9 / rows;
}

}  // namespace

int main() {
  struct Case {
    const char* name;
    InitializerKind kind;
  };
  const Case cases[] = {{"uniform", InitializerKind::kUniform},
                        {"normal", InitializerKind::kNormal},
                        {"truncated_normal", InitializerKind::kTruncatedNormal}};
  std::printf("%-18s %8s %4s %12s\n", "kind", "version", "dim", "ns/row");
  for (const Case& c : cases) {
    for (int version : {1, 2}) {
      for (int dim : {8, 64}) {
        InitializerSpec spec;
        spec.kind = c.kind;
        spec.a = c.kind == InitializerKind::kUniform ? -0.05f : 0.0f;
        spec.b = 0.05f;
        spec.version = version;
        const int rows = 4000000 / dim;
        NanosecondsPerRow(spec, dim, rows / 10);  // warm-up
        double best = 1e30;
        for (int round = 0; round < 5; ++round) {
          const double ns = NanosecondsPerRow(spec, dim, rows);
          best = ns < best ? ns : best;
        }
        std::printf("%-18s %8d %4d %12.1f\n", c.name, version, dim, best);
      }
    }
  }
  return 0;
}

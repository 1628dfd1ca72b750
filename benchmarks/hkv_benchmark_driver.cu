// Runs HierarchicalKV's own benchmark (benchmark/merlin_hashtable_benchmark.cc.cu of its public
// repository, not part of tf_ext) for the configurations benchmarks/gpu_table.py compares with the
// GPU table: its own test_main, pure HBM mode, at one capacity, dim and load factors per run.
// Built on demand by tests/kernels/dynamic_embedding/gpu/build_gpu_checks.sh from a path to an
// HKV checkout.
//
// usage: hkv_benchmark DIM CAPACITY_LOG2 LOAD_FACTOR[,LOAD_FACTOR...]
#define main hkv_benchmark_main  // HKV's own main runs every configuration it knows
#include "benchmark/merlin_hashtable_benchmark.cc.cu"
#undef main

#include <cstdlib>
#include <sstream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: hkv_benchmark DIM CAPACITY_LOG2 LOAD_FACTORS\n";
    return 2;
  }
  const size_t dim = std::strtoul(argv[1], nullptr, 10);
  const size_t capacity = size_t{1} << std::strtoul(argv[2], nullptr, 10);
  std::vector<float> load_factors;
  std::stringstream list(argv[3]);
  for (std::string item; std::getline(list, item, ',');) load_factors.push_back(std::stof(item));
  std::vector<API_Select> apis{API_Select::insert_or_assign, API_Select::find,
                               API_Select::find_or_insert};
  test_mode = Test_Mode::pure_hbm;
  std::cout << "dim=" << dim << " capacity=" << capacity << "\n";
  std::cout << "| lambda | insert_or_assign | find | find_or_insert |\n";
  // All values in HBM: the GPU table holds them there too.
  const size_t hbm_gb = capacity * dim * sizeof(float) / (size_t{1} << 30) + 1;
  test_main(apis, dim, capacity, 1024 * 1024UL, hbm_gb, 1.0f, false, load_factors);
  return 0;
}

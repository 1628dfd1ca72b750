// What the native fuzzers (tests/kernels/<capability>/fuzz/*_fuzzer.cc) share: CHECK, which
// aborts with the failed condition (libFuzzer reports it as a crash and keeps the input), and
// FuzzInput, the fuzzer's bytes read as a sequence of decisions.
#ifndef TF_EXT_TESTS_FUZZ_FUZZ_INPUT_H_
#define TF_EXT_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(condition)                                                     \
  do {                                                                       \
    if (!(condition)) {                                                      \
      fprintf(stderr, "check failed: %s (line %d)\n", #condition, __LINE__); \
      abort();                                                               \
    }                                                                        \
  } while (0)

// Reads past the end give zeros, so every input decodes to some run.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // `bytes` (at most 8) bytes as a little-endian unsigned number.
  uint64_t Unsigned(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= uint64_t{Byte()} << (8 * i);
    return value;
  }
  // The next `n` bytes.
  std::vector<uint8_t> Bytes(size_t n) {
    std::vector<uint8_t> out(n);
    for (uint8_t& b : out) b = Byte();
    return out;
  }
  std::string Text(size_t n) {
    const std::vector<uint8_t> bytes = Bytes(n);
    return std::string(bytes.begin(), bytes.end());
  }
  // Every byte not read yet.
  std::string Rest() {
    return std::string(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

#endif  // TF_EXT_TESTS_FUZZ_FUZZ_INPUT_H_

// A snapshot ByteSink and ByteSource over a std::string (core/snapshot_file.h): the C++ tests
// write and read snapshot files in memory.
#ifndef TF_EXT_TESTS_KERNELS_DYNAMIC_EMBEDDING_STRING_BYTES_H_
#define TF_EXT_TESTS_KERNELS_DYNAMIC_EMBEDDING_STRING_BYTES_H_

#include <cstring>
#include <string>
#include <string_view>

#include "kernels/dynamic_embedding/core/snapshot_file.h"

namespace tf_ext {
namespace de {

class StringSink : public ByteSink {
 public:
  bool Append(const char* data, size_t n) override {
    bytes.append(data, n);
    return true;
  }
  std::string bytes;
};

// Reads `bytes`, which must outlive it.
class StringSource : public ByteSource {
 public:
  explicit StringSource(std::string_view bytes) : bytes_(bytes) {}
  bool Read(char* out, size_t n) override {
    if (bytes_.size() - offset_ < n) return false;
    std::memcpy(out, bytes_.data() + offset_, n);
    offset_ += n;
    return true;
  }

 private:
  std::string_view bytes_;
  size_t offset_ = 0;
};

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_TESTS_KERNELS_DYNAMIC_EMBEDDING_STRING_BYTES_H_

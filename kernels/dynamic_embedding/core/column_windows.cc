#include "kernels/dynamic_embedding/core/column_windows.h"

#include <cstring>

namespace tf_ext {
namespace de {
namespace {

int64_t Product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t product = 1;
  for (size_t i = begin; i < end; ++i) product *= dims[i];
  return product;
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? "," : "") + std::to_string(dims[i]);
  return out + "]";
}

}  // namespace

bool SplitWindow(const std::vector<int64_t>& dims, int64_t axis, const std::vector<int64_t>& sizes,
                 int64_t index, ColumnWindow* window, std::string* error) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < -rank || axis >= rank) {
    *error = "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank);
    return false;
  }
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (index < 0 || index >= static_cast<int64_t>(sizes.size())) {
    *error = "split " + std::to_string(index) + " of " + std::to_string(sizes.size());
    return false;
  }
  int64_t known = 0, unknown = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1 && unknown < 0) {
      unknown = static_cast<int64_t>(i);
    } else if (sizes[i] < 0) {
      *error = "split sizes " + DimsString(sizes) + " have a negative size other than one -1";
      return false;
    } else {
      known += sizes[i];
    }
  }
  std::vector<int64_t> resolved = sizes;
  if (unknown >= 0) resolved[unknown] = dims[a] - known;
  if ((unknown >= 0 && resolved[unknown] < 0) || (unknown < 0 && known != dims[a])) {
    *error = "split sizes " + DimsString(sizes) + " do not add up to dimension " +
             std::to_string(a) + " of " + DimsString(dims);
    return false;
  }
  const int64_t inner = Product(dims, a + 1, dims.size());
  int64_t offset = 0;
  for (int64_t i = 0; i < index; ++i) offset += resolved[i];
  window->rows = Product(dims, 0, a);
  window->row_width = dims[a] * inner;
  window->column = offset * inner;
  window->width = resolved[index] * inner;
  return true;
}

namespace {

// CopyFromWindow for a width known at compile time: the row copies inline into vector moves
// instead of a call to memcpy each (a field's rows are a few cache lines at most).
template <int64_t kWidth>
void CopyRowsOf(const float* matrix, const ColumnWindow& window, float* block) {
  for (int64_t r = 0; r < window.rows; ++r) {
    std::memcpy(block + r * kWidth, matrix + r * window.row_width + window.column,
                kWidth * sizeof(float));
  }
}

}  // namespace

void CopyFromWindow(const float* matrix, const ColumnWindow& window, float* block) {
  switch (window.width) {
    case 0:
      return;
    case 8:
      return CopyRowsOf<8>(matrix, window, block);
    case 16:
      return CopyRowsOf<16>(matrix, window, block);
    case 32:
      return CopyRowsOf<32>(matrix, window, block);
    case 64:
      return CopyRowsOf<64>(matrix, window, block);
  }
  const size_t bytes = static_cast<size_t>(window.width) * sizeof(float);
  for (int64_t r = 0; r < window.rows; ++r) {
    std::memcpy(block + r * window.width, matrix + r * window.row_width + window.column, bytes);
  }
}

}  // namespace de
}  // namespace tf_ext

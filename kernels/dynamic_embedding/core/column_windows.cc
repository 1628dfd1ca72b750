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

// The axis in [0, rank), or false with the reason.
bool ResolveAxis(int64_t axis, int64_t rank, int64_t* resolved, std::string* error) {
  if (axis < -rank || axis >= rank) {
    *error = "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank);
    return false;
  }
  *resolved = axis < 0 ? axis + rank : axis;
  return true;
}

}  // namespace

bool SplitWindow(const std::vector<int64_t>& dims, int64_t axis, const std::vector<int64_t>& sizes,
                 int64_t index, ColumnWindow* window, std::string* error) {
  int64_t a;
  if (!ResolveAxis(axis, static_cast<int64_t>(dims.size()), &a, error)) return false;
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

bool ConcatWindows(const std::vector<std::vector<int64_t>>& pieces, int64_t axis,
                   std::vector<int64_t>* dims, std::vector<ColumnWindow>* windows,
                   std::string* error) {
  if (pieces.empty()) {
    *error = "nothing to concatenate";
    return false;
  }
  int64_t a;
  if (!ResolveAxis(axis, static_cast<int64_t>(pieces[0].size()), &a, error)) return false;
  *dims = pieces[0];
  (*dims)[a] = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    bool fits = pieces[i].size() == dims->size();
    for (size_t d = 0; fits && d < dims->size(); ++d) {
      fits = static_cast<int64_t>(d) == a || pieces[i][d] == (*dims)[d];
    }
    if (!fits) {
      *error = "piece " + std::to_string(i) + " has shape " + DimsString(pieces[i]) +
               ", which does not fit piece 0's " + DimsString(pieces[0]) + " along axis " +
               std::to_string(a);
      return false;
    }
    (*dims)[a] += pieces[i][a];
  }
  const int64_t inner = Product(*dims, a + 1, dims->size());
  windows->clear();
  int64_t offset = 0;
  for (const std::vector<int64_t>& piece : pieces) {
    ColumnWindow window;
    window.rows = Product(*dims, 0, a);
    window.row_width = (*dims)[a] * inner;
    window.column = offset * inner;
    window.width = piece[a] * inner;
    windows->push_back(window);
    offset += piece[a];
  }
  return true;
}

namespace {

// Copies rows of `width` floats, src_stride and dst_stride floats apart. Widths known at compile
// time inline into vector moves instead of a call to memcpy per row (a field's rows are a few
// cache lines at most).
template <int64_t kWidth>
void CopyRowsOf(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, kWidth * sizeof(float));
  }
}

void CopyRows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
              int64_t width) {
  switch (width) {
    case 0:
      return;
    case 8:
      return CopyRowsOf<8>(src, src_stride, dst, dst_stride, rows);
    case 16:
      return CopyRowsOf<16>(src, src_stride, dst, dst_stride, rows);
    case 32:
      return CopyRowsOf<32>(src, src_stride, dst, dst_stride, rows);
    case 64:
      return CopyRowsOf<64>(src, src_stride, dst, dst_stride, rows);
  }
  const size_t bytes = static_cast<size_t>(width) * sizeof(float);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, bytes);
}

}  // namespace

void CopyFromWindow(const float* matrix, const ColumnWindow& window, float* block) {
  CopyRows(matrix + window.column, window.row_width, block, window.width, window.rows,
           window.width);
}

void CopyToWindow(const float* block, const ColumnWindow& window, float* matrix) {
  CopyRows(block, window.width, matrix + window.column, window.row_width, window.rows,
           window.width);
}

}  // namespace de
}  // namespace tf_ext

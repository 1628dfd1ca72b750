// A split or a concatenation along one axis as windows of columns, for the fused embedding ops
// (kernels/graph/embedding_fusion_pass.cc): the apply reads a field's gradient out of a SplitV's
// input instead of the SplitV's copy, and the lookup writes its fields straight into a ConcatV2's
// output. TensorFlow-free.
//
// A tensor of dims D split along `axis` is a matrix [outer, inner] with outer = prod(D[:axis]) and
// inner = prod(D[axis:]); each piece owns the same window of columns in every row, and is itself a
// contiguous [outer, width] block.
#ifndef TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COLUMN_WINDOWS_H_
#define TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COLUMN_WINDOWS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tf_ext {
namespace de {

struct ColumnWindow {
  int64_t rows = 0;       // outer: the product of the dims before the axis
  int64_t row_width = 0;  // elements in a row of the whole matrix
  int64_t column = 0;     // the piece's first column
  int64_t width = 0;      // the piece's columns
};

// The window of piece `index` when a tensor of dims `dims` is split along `axis` into `sizes`
// (SplitV's size_splits: at most one -1, meaning the rest). False, with the reason, if the axis
// or index is out of range or the sizes do not add up to the axis.
bool SplitWindow(const std::vector<int64_t>& dims, int64_t axis, const std::vector<int64_t>& sizes,
                 int64_t index, ColumnWindow* window, std::string* error);

// The concatenation of tensors of dims pieces[i] along `axis` (negative counts from the end): its
// dims, and the window of each piece. False, with the reason, if the axis is out of range or the
// pieces differ in rank or in a dim other than the axis.
bool ConcatWindows(const std::vector<std::vector<int64_t>>& pieces, int64_t axis,
                   std::vector<int64_t>* dims, std::vector<ColumnWindow>* windows,
                   std::string* error);

// Copies `window` of `matrix` out into a contiguous [window.rows, window.width] block: the piece
// as SplitV would output it.
void CopyFromWindow(const float* matrix, const ColumnWindow& window, float* block);

// The reverse: a contiguous [window.rows, window.width] block into `window` of `matrix` (a piece
// of a concatenation written in place).
void CopyToWindow(const float* block, const ColumnWindow& window, float* matrix);

}  // namespace de
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_DYNAMIC_EMBEDDING_CORE_COLUMN_WINDOWS_H_

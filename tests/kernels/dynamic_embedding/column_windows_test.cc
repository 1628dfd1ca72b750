// A split as column windows (the fused apply's reads of field gradients in a SplitV's input),
// against hand-computed layouts and the element-wise definition of the split.
#include "kernels/dynamic_embedding/core/column_windows.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace tf_ext {
namespace de {
namespace {

TEST(ColumnWindowsTest, SplitWindowsFollowTheSizesAndResolveOneMinusOne) {
  ColumnWindow window;
  std::string error;
  ASSERT_TRUE(SplitWindow({4, 10}, 1, {3, -1, 2}, 1, &window, &error)) << error;
  EXPECT_EQ(window.rows, 4);
  EXPECT_EQ(window.row_width, 10);
  EXPECT_EQ(window.column, 3);
  EXPECT_EQ(window.width, 5);
  ASSERT_TRUE(SplitWindow({4, 10}, -1, {3, -1, 2}, 2, &window, &error)) << error;
  EXPECT_EQ(window.column, 8);
  EXPECT_EQ(window.width, 2);
  ASSERT_TRUE(SplitWindow({2, 5, 3}, 1, {2, 3}, 1, &window, &error)) << error;
  EXPECT_EQ(window.rows, 2);
  EXPECT_EQ(window.row_width, 15);
  EXPECT_EQ(window.column, 6);
  EXPECT_EQ(window.width, 9);
  ASSERT_TRUE(SplitWindow({6, 4}, 0, {2, 4}, 1, &window, &error)) << error;  // whole rows
  EXPECT_EQ(window.rows, 1);
  EXPECT_EQ(window.column, 8);
  EXPECT_EQ(window.width, 16);
}

TEST(ColumnWindowsTest, SplitRejectsSizesIndicesAndAxesThatDoNotFit) {
  ColumnWindow window;
  std::string error;
  EXPECT_FALSE(SplitWindow({4, 10}, 1, {3, 3}, 0, &window, &error));
  EXPECT_NE(error.find("do not add up"), std::string::npos) << error;
  EXPECT_FALSE(SplitWindow({4, 10}, 1, {3, -1, -1}, 0, &window, &error));
  EXPECT_NE(error.find("negative size"), std::string::npos) << error;
  EXPECT_FALSE(SplitWindow({4, 10}, 1, {12, -1}, 0, &window, &error));
  EXPECT_FALSE(SplitWindow({4, 10}, 1, {5, 5}, 2, &window, &error));
  EXPECT_FALSE(SplitWindow({4, 10}, 1, {5, 5}, -1, &window, &error));
  EXPECT_FALSE(SplitWindow({4, 10}, 2, {5, 5}, 0, &window, &error));
  EXPECT_NE(error.find("out of range"), std::string::npos) << error;
  EXPECT_FALSE(SplitWindow({4, 10}, -3, {5, 5}, 0, &window, &error));
}

// Every piece copied out of its window equals the split's definition, element by element.
TEST(ColumnWindowsTest, CopiesGiveTheSplitAlongEveryAxis) {
  const std::vector<int64_t> dims = {2, 3, 4};
  std::vector<float> matrix(24);
  std::iota(matrix.begin(), matrix.end(), 0.0f);
  for (int64_t axis = 0; axis < 3; ++axis) {
    const std::vector<int64_t> sizes = {1, dims[axis] - 1};
    int64_t begin = 0;
    for (int64_t index = 0; index < 2; ++index) {
      ColumnWindow window;
      std::string error;
      ASSERT_TRUE(SplitWindow(dims, axis, sizes, index, &window, &error)) << error;
      std::vector<float> piece(window.rows * window.width, -1.0f);
      CopyFromWindow(matrix.data(), window, piece.data());
      std::vector<float> expected;
      for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < 3; ++b) {
          for (int64_t c = 0; c < 4; ++c) {
            const int64_t at[3] = {a, b, c};
            if (at[axis] >= begin && at[axis] < begin + sizes[index]) {
              expected.push_back(matrix[(a * 3 + b) * 4 + c]);
            }
          }
        }
      }
      EXPECT_EQ(piece, expected) << "axis " << axis << ", piece " << index;
      begin += sizes[index];
    }
  }
}

// The widths with a copy of their own (8, 16, 32, 64 floats) give the same pieces as any other.
TEST(ColumnWindowsTest, EveryWidthCopiesTheSameWay) {
  const std::vector<int64_t> widths = {8, 16, 32, 64, 3};
  int64_t row_width = 0;
  for (int64_t w : widths) row_width += w;
  std::vector<float> matrix(5 * row_width);
  std::iota(matrix.begin(), matrix.end(), 0.0f);
  int64_t column = 0;
  for (size_t index = 0; index < widths.size(); ++index) {
    ColumnWindow window;
    std::string error;
    ASSERT_TRUE(SplitWindow({5, row_width}, 1, widths, index, &window, &error)) << error;
    std::vector<float> piece(5 * widths[index]);
    CopyFromWindow(matrix.data(), window, piece.data());
    for (int64_t r = 0; r < 5; ++r) {
      for (int64_t c = 0; c < widths[index]; ++c) {
        ASSERT_EQ(piece[r * widths[index] + c], matrix[r * row_width + column + c]);
      }
    }
    column += widths[index];
  }
}

// Pieces written into their concatenation windows give ConcatV2's result along every axis, and
// each piece copies back out of its window unchanged.
TEST(ColumnWindowsTest, ConcatWindowsPlaceEachPieceAsConcatDoes) {
  const std::vector<int64_t> a_dims = {2, 3, 4};
  std::vector<float> a(24), b;
  std::iota(a.begin(), a.end(), 0.0f);
  for (int64_t axis : {0, 1, 2, -1}) {
    const int64_t resolved = axis < 0 ? axis + 3 : axis;
    std::vector<int64_t> b_dims = a_dims;
    b_dims[resolved] = 1;  // a piece one wide along the axis
    b.assign(24 / a_dims[resolved], 0.0f);
    std::iota(b.begin(), b.end(), 100.0f);
    std::vector<int64_t> dims;
    std::vector<ColumnWindow> windows;
    std::string error;
    ASSERT_TRUE(ConcatWindows({b_dims, a_dims}, axis, &dims, &windows, &error)) << error;
    std::vector<int64_t> expected_dims = a_dims;
    ++expected_dims[resolved];
    EXPECT_EQ(dims, expected_dims);
    std::vector<float> out(24 + b.size(), -1.0f);
    CopyToWindow(b.data(), windows[0], out.data());
    CopyToWindow(a.data(), windows[1], out.data());
    // out[i0][i1][i2] is b's element where the axis index is 0, else a's at that index - 1.
    int64_t k = 0;
    for (int64_t i0 = 0; i0 < dims[0]; ++i0) {
      for (int64_t i1 = 0; i1 < dims[1]; ++i1) {
        for (int64_t i2 = 0; i2 < dims[2]; ++i2, ++k) {
          int64_t at[3] = {i0, i1, i2};
          const bool from_b = at[resolved] == 0;
          if (!from_b) --at[resolved];
          const std::vector<int64_t>& d = from_b ? b_dims : a_dims;
          const float want = (from_b ? b : a)[(at[0] * d[1] + at[1]) * d[2] + at[2]];
          ASSERT_EQ(out[k], want) << "axis " << axis << ", element " << k;
        }
      }
    }
    std::vector<float> back(24);
    CopyFromWindow(out.data(), windows[1], back.data());
    EXPECT_EQ(back, a) << "axis " << axis;
  }
}

TEST(ColumnWindowsTest, ConcatWindowsRejectPiecesThatDoNotFit) {
  std::vector<int64_t> dims;
  std::vector<ColumnWindow> windows;
  std::string error;
  EXPECT_FALSE(ConcatWindows({{4, 2}, {5, 3}}, 1, &dims, &windows, &error));
  EXPECT_NE(error.find("piece 1 has shape [5,3]"), std::string::npos) << error;
  EXPECT_FALSE(ConcatWindows({{4, 2}, {4, 2, 1}}, 1, &dims, &windows, &error));
  EXPECT_NE(error.find("does not fit"), std::string::npos) << error;
  EXPECT_FALSE(ConcatWindows({{4, 2}}, 2, &dims, &windows, &error));
  EXPECT_NE(error.find("out of range"), std::string::npos) << error;
  EXPECT_FALSE(ConcatWindows({}, 0, &dims, &windows, &error));
  EXPECT_TRUE(ConcatWindows({{4, 2}, {4, 0}, {4, 3}}, -1, &dims, &windows, &error)) << error;
  EXPECT_EQ(dims, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(windows[2].column, 2);
}

}  // namespace
}  // namespace de
}  // namespace tf_ext

#include "stats/blockwise_range.h"

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "stats/read_only_data.h"
#include "stats/tensor_stats.h"

namespace sentinel {
namespace stats {

namespace {

// One block's largest and smallest non-zero |x|; NaN sticks, as torch's amax and amin keep it.
struct BlockExtremes {
  float amax = 0.0f;
  float amin = std::numeric_limits<float>::infinity();
  bool nan = false;
  void add(float x) {
    const float a = std::fabs(x);
    nan = nan || a != a;
    amax = a > amax ? a : amax;
    if (a != 0.0f && a < amin) amin = a;
  }
  double range() const {
    if (nan) return std::numeric_limits<double>::quiet_NaN();
    if (amax == 0.0f) return 0.0;
    return std::log2(static_cast<double>(amax)) - std::log2(static_cast<double>(amin));
  }
};

// The tensor as rows x cols: the offset of each row's first element (every dimension but the
// last enumerated), and the last dimension's stride.
template <typename T>
class Grid {
 public:
  explicit Grid(const at::Tensor& t) : base_(static_cast<const T*>(read_only_data(t))) {
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    const int64_t nd = t.dim();
    cols_ = nd == 0 ? 1 : sizes[nd - 1];
    col_stride_ = nd == 0 ? 1 : strides[nd - 1];
    rows_ = cols_ == 0 ? 0 : t.numel() / cols_;
    row_offset_.reserve(static_cast<size_t>(rows_));
    std::vector<int64_t> index(static_cast<size_t>(nd > 0 ? nd - 1 : 0), 0);
    for (int64_t r = 0; r < rows_; ++r) {
      int64_t off = 0;
      for (size_t d = 0; d < index.size(); ++d) off += index[d] * strides[d];
      row_offset_.push_back(off);
      for (int64_t d = static_cast<int64_t>(index.size()) - 1; d >= 0; --d) {
        if (++index[d] < sizes[d]) break;
        index[d] = 0;
      }
    }
  }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  float at(int64_t r, int64_t c) const { return static_cast<float>(base_[row_offset_[r] + c * col_stride_]); }

 private:
  const T* base_;
  int64_t rows_ = 0, cols_ = 0, col_stride_ = 1;
  std::vector<int64_t> row_offset_;
};

// Blocks of `b` consecutive elements of the flattened matrix (rows x cols), read row by row, or
// of its transpose (column by column).
template <typename T>
double flat_blocks(const Grid<T>& g, int64_t b, bool transposed) {
  double best = -std::numeric_limits<double>::infinity();
  BlockExtremes block;
  int64_t filled = 0;
  const int64_t outer = transposed ? g.cols() : g.rows(), inner = transposed ? g.rows() : g.cols();
  for (int64_t i = 0; i < outer; ++i) {
    for (int64_t j = 0; j < inner; ++j) {
      block.add(transposed ? g.at(j, i) : g.at(i, j));
      if (++filled == b) {
        best = nan_propagating_max(best, block.range());
        block = BlockExtremes{};
        filled = 0;
      }
    }
  }
  return best;
}

// b x b tiles (the same tiles whichever the orientation).
template <typename T>
double tiles(const Grid<T>& g, int64_t b) {
  double best = -std::numeric_limits<double>::infinity();
  for (int64_t r0 = 0; r0 < g.rows(); r0 += b) {
    for (int64_t c0 = 0; c0 < g.cols(); c0 += b) {
      BlockExtremes tile;
      for (int64_t r = r0; r < r0 + b; ++r) {
        for (int64_t c = c0; c < c0 + b; ++c) tile.add(g.at(r, c));
      }
      best = nan_propagating_max(best, tile.range());
    }
  }
  return best;
}

template <typename T>
double compute(const at::Tensor& t, const BlockwiseRange& range) {
  const Grid<T> g(t);
  if (range.dims == 2) return tiles(g, range.block_size);
  const double rowwise = flat_blocks(g, range.block_size, false);
  if (!range.max_over_orientations) return rowwise;
  return nan_propagating_max(rowwise, flat_blocks(g, range.block_size, true));
}

}  // namespace

BlockwiseOutcome max_blockwise_dynamic_range(const at::Tensor& t, const BlockwiseRange& range, double& out,
                                             std::string& why) {
  const Readability r = compute_readability(t);
  if (r != Readability::Read) {
    why = describe(r);
    return BlockwiseOutcome::NotRead;
  }
  const int64_t b = range.block_size;
  const int64_t cols = t.dim() == 0 ? 1 : t.size(-1);
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  if (range.dims == 2 ? (rows % b != 0 || cols % b != 0) : t.numel() % b != 0) {
    why = range.dims == 2 ? fmt::format("{} x {} is not made of {} x {} tiles", rows, cols, b, b)
                          : fmt::format("{} elements are not a multiple of {}", t.numel(), b);
    return BlockwiseOutcome::Undivided;
  }
  switch (t.scalar_type()) {
    case c10::kFloat: out = compute<float>(t, range); break;
    case c10::kDouble: out = compute<double>(t, range); break;
    case c10::kHalf: out = compute<c10::Half>(t, range); break;
    case c10::kBFloat16: out = compute<c10::BFloat16>(t, range); break;
    default: why = "not a floating dtype"; return BlockwiseOutcome::NotRead;
  }
  return BlockwiseOutcome::Computed;
}

std::string blockwise_range_name(const BlockwiseRange& range) {
  return fmt::format("max_blockwise_dynamic_range_block_size_{}_dims_{}{}", range.block_size, range.dims,
                     range.max_over_orientations ? "_max_over_orientations" : "");
}

}  // namespace stats
}  // namespace sentinel

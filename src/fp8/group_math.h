#pragma once
// The recipes' arithmetic one scaling group at a time (a block, or a tile: the elements that
// share one scale), written once for the CPU and, under nvcc, for the GPU kernels
// (cuda/recipe_launch.cu): where a tensor's groups lie, the scale of a group from its amax, and
// what casting one element adds to the tallies. The CPU replay (block_probe.cpp) casts its exact
// blocks with CastTally; its vector loops compute the same codes and counts (the tests hold them
// to it), and its float-lane sums differ from these double ones in their last digits
// (kDeviceSumsRelativeBound). Free of LibTorch and CUDA headers.
#include <sentinel/block_scaling.h>

#include <cfloat>
#include <cstdint>

#include "fp8/block_probe.h"
#include "fp8/fp8_probe_math.h"

namespace sentinel {
namespace recipes {

// How far the error sums of a device replay may stray from the CPU replay's, relative to the
// sum: the CPU adds squares in float lanes over a few hundred elements (about 2^-20 each, below
// one part in 10^5 in all); a device adds every element in double.
constexpr double kDeviceSumsRelativeBound = 1e-5;

// The dimensions of a tensor a kernel can walk without a copy: its groups' two and the others.
constexpr int kMaxGroupDims = 10;

// Where a tensor's scaling groups lie. A group is `tile_rows` x `tile_cols` elements of the
// (rows x cols) plane of the blocked dimensions, cut short at the plane's edges, in every
// combination of the other (`outer`) dimensions. 1-D blocks along a dimension are tiles of one
// row: rows = 1. Groups are numbered outer index first, then tile row, then tile column.
struct GroupGeometry {
  int outer_dims = 0;
  int64_t outer_sizes[kMaxGroupDims] = {};
  int64_t outer_strides[kMaxGroupDims] = {};
  int64_t rows = 1, cols = 1;              // the plane, in elements
  int64_t row_stride = 0, col_stride = 1;  // in elements
  int64_t tile_rows = 1, tile_cols = 1;
  int64_t row_tiles = 1, col_tiles = 1;    // per plane
  int64_t groups = 0;

  // Group g's first element (offset in elements from the tensor's data) and its extent. `I`: the
  // type of the index arithmetic (32 bits on a GPU where every count fits: divisions cost less).
  template <typename I>
  SENTINEL_HOST_DEVICE int64_t group_start(I g, I& height, I& width) const {
    const I per_plane = static_cast<I>(row_tiles * col_tiles);
    I outer = g / per_plane;
    const I in_plane = g - outer * per_plane;
    const I tr = in_plane / static_cast<I>(col_tiles), tc = in_plane - tr * static_cast<I>(col_tiles);
    int64_t offset = 0;
    for (int d = outer_dims - 1; d > 0; --d) {  // the last outer dimension varies fastest
      const I size = static_cast<I>(outer_sizes[d]);
      const I next = outer / size;
      offset += static_cast<int64_t>(outer - next * size) * outer_strides[d];
      outer = next;
    }
    if (outer_dims > 0) offset += static_cast<int64_t>(outer) * outer_strides[0];
    const I r0 = tr * static_cast<I>(tile_rows), c0 = tc * static_cast<I>(tile_cols);
    height = static_cast<I>(rows) - r0 < static_cast<I>(tile_rows) ? static_cast<I>(rows) - r0 : static_cast<I>(tile_rows);
    width = static_cast<I>(cols) - c0 < static_cast<I>(tile_cols) ? static_cast<I>(cols) - c0 : static_cast<I>(tile_cols);
    return offset + static_cast<int64_t>(r0) * row_stride + static_cast<int64_t>(c0) * col_stride;
  }
  // The element at row r, column c of a group starting at `start`.
  SENTINEL_HOST_DEVICE int64_t at(int64_t start, int64_t r, int64_t c) const { return start + r * row_stride + c * col_stride; }
  // Whether every count of the walk fits in 32 bits (an element's offset is always 64-bit).
  bool narrow() const {
    constexpr int64_t kMax = int64_t{1} << 31;
    bool fits = groups < kMax && rows < kMax && cols < kMax;
    for (int d = 0; d < outer_dims; ++d) fits = fits && outer_sizes[d] < kMax;
    return fits;
  }
};

// The elements one scale covers, for each recipe: MXFP8's 32, NVFP4's 16 and Float8Block's 128
// along a line, or square tiles of that side. Current scaling has one scale for the tensor: its
// groups only cut the work.
inline int64_t group_length(fp8::ScalingRecipe r) {
  return r == fp8::ScalingRecipe::NVFP4 ? fp8::kNvfp4Block : r == fp8::ScalingRecipe::MXFP8 ? fp8::kMxBlock : fp8::kFloat8Block;
}

// The groups of a tensor of `dims` dimensions under `layout` (as probe_blocks places them), for
// groups of `length`. False when it has more dimensions than a kernel walks.
inline bool make_group_geometry(const int64_t* sizes, const int64_t* strides, int dims, const BlockLayout& layout,
                                int64_t length, GroupGeometry& g) {
  g = GroupGeometry{};
  if (dims > kMaxGroupDims) return false;
  int64_t numel = 1;
  for (int d = 0; d < dims; ++d) numel *= sizes[d];
  if (numel == 0) return true;  // no group
  int row_dim = -1, col_dim = -1;
  if (layout.tiles_2d && dims >= 2) {
    row_dim = dims - 2;
    col_dim = dims - 1;
    g.tile_rows = length;
  } else if (dims > 0) {
    int dim = layout.dim < 0 ? layout.dim + dims : layout.dim;
    col_dim = dim < 0 ? 0 : dim > dims - 1 ? dims - 1 : dim;
  }
  g.tile_cols = length;
  for (int d = 0; d < dims; ++d) {
    if (d == row_dim) {
      g.rows = sizes[d];
      g.row_stride = strides[d];
    } else if (d == col_dim) {
      g.cols = sizes[d];
      g.col_stride = strides[d];
    } else {
      g.outer_sizes[g.outer_dims] = sizes[d];
      g.outer_strides[g.outer_dims] = strides[d];
      ++g.outer_dims;
    }
  }
  // Outer dimensions that step through memory as one (a contiguous batch of lines) walk as one.
  int kept = 0;
  for (int d = 0; d < g.outer_dims; ++d) {
    if (g.outer_sizes[d] == 1) continue;
    if (kept > 0 && g.outer_strides[kept - 1] == g.outer_sizes[d] * g.outer_strides[d]) {
      g.outer_sizes[kept - 1] *= g.outer_sizes[d];
      g.outer_strides[kept - 1] = g.outer_strides[d];
    } else {
      g.outer_sizes[kept] = g.outer_sizes[d];
      g.outer_strides[kept] = g.outer_strides[d];
      ++kept;
    }
  }
  g.outer_dims = kept;
  g.row_tiles = (g.rows + g.tile_rows - 1) / g.tile_rows;
  g.col_tiles = (g.cols + g.tile_cols - 1) / g.tile_cols;
  g.groups = numel / (g.rows * g.cols) * g.row_tiles * g.col_tiles;
  return true;
}

// What sets a block recipe's group scales, fixed for one tensor.
struct GroupRule {
  fp8::ScalingRecipe kind = fp8::ScalingRecipe::MXFP8;  // MXFP8, NVFP4 or Float8Block
  fp8::Format element = fp8::Format::E4M3;
  fp8::MxScaleRule rule = fp8::MxScaleRule::RoundUp;
  bool pow2 = true;
  float epsilon = 0.0f;
};

inline GroupRule group_rule(const BlockRecipe& r) { return GroupRule{r.kind, r.element, r.rule, r.pow2, r.epsilon}; }

// The scale of a group whose largest |x| (NaN ignored) is amax; `special`: it holds an inf or a
// NaN, which under the OCP rule loses the whole group. `tensor_scale`: NVFP4's S_enc.
SENTINEL_HOST_DEVICE inline fp8::BlockScale group_scale(const GroupRule& r, float amax, bool special, float tensor_scale) {
  switch (r.kind) {
    case fp8::ScalingRecipe::NVFP4: return fp8::nvfp4_block_scale(amax, tensor_scale);
    case fp8::ScalingRecipe::Float8Block: return fp8::float8_block_scale(amax, r.element, r.pow2, r.epsilon);
    default: break;
  }
  const bool lost = r.rule == fp8::MxScaleRule::OcpFloor && special;
  return fp8::mxfp8_block_scale(lost ? fp8::detail::bits_to_float(fp8::detail::kFloatInfBits) : amax, r.element, r.rule);
}

// A group's own tallies, as BlockProbeResult counts them (its histogram of codes apart).
struct GroupTally {
  uint64_t blocks = 0, zero = 0, saturated = 0, at_min = 0, nonfinite = 0;

  SENTINEL_HOST_DEVICE void add(const fp8::BlockScale& s, float amax, bool special) {
    ++blocks;
    zero += amax == 0.0f;
    saturated += s.saturated;
    at_min += s.at_min;
    nonfinite += special;
  }
  // f(this tally's field, the same field of o), field by field: what treats the fields alike
  // (sums, shuffles, atomics) is written once.
  template <typename Tally, typename F>
  SENTINEL_HOST_DEVICE void zip(Tally& o, F&& f) {
    f(blocks, o.blocks);
    f(zero, o.zero);
    f(saturated, o.saturated);
    f(at_min, o.at_min);
    f(nonfinite, o.nonfinite);
  }
  SENTINEL_HOST_DEVICE void combine(const GroupTally& o) {
    zip(o, [](uint64_t& x, uint64_t y) { x += y; });
  }
};

// What casting elements adds up: counts and the sums in the dequantized domain, in double.
struct CastTally {
  uint64_t count = 0, overflow = 0, underflow = 0, lost = 0;
  double sum_sq_error = 0, sum_x_q = 0, sum_x_sq = 0, sum_q_sq = 0;

  // x, in a group scaled by encode/decode, cast to the element grid `e` (at scale 1): inf and NaN
  // are left to the statistics; in a lost group (NaN decode) the element is lost; overflow counts
  // a value rounding above the grid's max where the scale is not zero; underflow a non-zero value
  // whose cast, or whose group's scale, is zero.
  SENTINEL_HOST_DEVICE void add(float x, float encode, float decode, const stats::Fp8ProbeParams& e) {
    const float ax = stats::abs_value(x);
    if (!(ax <= FLT_MAX)) return;
    if (!(decode == decode)) {
      ++lost;
      return;
    }
    ++count;
    const float q0 = stats::fp8_round_scaled(stats::rounded_product(ax, encode), e);
    overflow += (decode > 0.0f) && !(q0 <= e.max);
    const float q = stats::fp8_saturate(q0, e.max);
    underflow += ax != 0.0f && (q == 0.0f || decode == 0.0f);
    const double xh = static_cast<double>(q) * decode;
    const double err = ax - xh;
    sum_sq_error += err * err;
    sum_x_q += ax * xh;
    sum_x_sq += static_cast<double>(ax) * ax;
    sum_q_sq += xh * xh;
  }

  // Current scaling: x cast with the tensor's one scale, the sums in the scaled domain (a = |x| *
  // scale, exact in double, and its cast q), as the FP8 probe keeps them.
  SENTINEL_HOST_DEVICE void add_scaled(float x, float scale, const stats::Fp8ProbeParams& e) {
    const float ax = stats::abs_value(x);
    if (!(ax <= FLT_MAX)) return;
    ++count;
    const float q0 = stats::fp8_round_scaled(stats::rounded_product(ax, scale), e);
    overflow += !(q0 <= e.max);
    const float q = stats::fp8_saturate(q0, e.max);
    underflow += ax != 0.0f && q == 0.0f;
    const double a = static_cast<double>(ax) * scale;
    const double err = a - q;
    sum_sq_error += err * err;
    sum_x_q += a * q;
    sum_q_sq += static_cast<double>(q) * q;
  }

  // Current scaling's sums, taken by add_scaled, into the dequantized domain of `scale`, as
  // Fp8ProbeResult::add_scaled_sums does (sum x^2 from sum (a - q)^2 + sum q (2a - q)).
  SENTINEL_HOST_DEVICE void unscale(float scale) {
    const double inv_sq = 1.0 / (static_cast<double>(scale) * scale);
    const double se = sum_sq_error, aq = sum_x_q, qq = sum_q_sq;
    sum_sq_error = se * inv_sq;
    sum_x_q = aq * inv_sq;
    sum_q_sq = qq * inv_sq;
    sum_x_sq = (se + 2 * aq - qq) * inv_sq;
  }

  // As GroupTally::zip.
  template <typename Tally, typename F>
  SENTINEL_HOST_DEVICE void zip(Tally& o, F&& f) {
    f(count, o.count);
    f(overflow, o.overflow);
    f(underflow, o.underflow);
    f(lost, o.lost);
    f(sum_sq_error, o.sum_sq_error);
    f(sum_x_q, o.sum_x_q);
    f(sum_x_sq, o.sum_x_sq);
    f(sum_q_sq, o.sum_q_sq);
  }
  SENTINEL_HOST_DEVICE void combine(const CastTally& o) {
    zip(o, [](auto& x, auto y) { x += y; });
  }
};

// Adds a block recipe's tallies into a result (its histogram of codes apart).
inline void add_tallies(const CastTally& c, const GroupTally& g, BlockProbeResult& out) {
  out.cast.count += static_cast<int64_t>(c.count);
  out.cast.overflow += static_cast<int64_t>(c.overflow);
  out.cast.underflow += static_cast<int64_t>(c.underflow);
  out.cast.sum_sq_error += c.sum_sq_error;
  out.cast.sum_x_q += c.sum_x_q;
  out.cast.sum_x_sq += c.sum_x_sq;
  out.cast.sum_q_sq += c.sum_q_sq;
  out.lost += static_cast<int64_t>(c.lost);
  out.blocks += static_cast<int64_t>(g.blocks);
  out.blocks_zero += static_cast<int64_t>(g.zero);
  out.blocks_saturated += static_cast<int64_t>(g.saturated);
  out.blocks_at_min += static_cast<int64_t>(g.at_min);
  out.blocks_nonfinite += static_cast<int64_t>(g.nonfinite);
}

}  // namespace recipes
}  // namespace sentinel

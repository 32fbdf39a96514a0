#include "recipes/block_probe.h"

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "stats/read_only_data.h"
#include <vector>

#include "recipes/block_kernels.h"
#include "stats/tensor_stats.h"

namespace sentinel {
namespace recipes {

void BlockProbeResult::add(const BlockProbeResult& o) {
  cast.add(o.cast);
  blocks += o.blocks;
  blocks_zero += o.blocks_zero;
  blocks_saturated += o.blocks_saturated;
  blocks_at_min += o.blocks_at_min;
  blocks_nonfinite += o.blocks_nonfinite;
  lost += o.lost;
  for (size_t i = 0; i < scale_codes.size(); ++i) scale_codes[i] += o.scale_codes[i];
}

namespace {

constexpr int64_t kChunk = 4096;  // floats per buffer: whole blocks of 16 and 32, in L1

template <typename T>
inline float to_float(T v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint32_t bits = static_cast<uint32_t>(v.x) << 16;  // bfloat16 is the top half of a float
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  } else {
    return static_cast<float>(v);  // float64: rounded to float first, as the cast sees it
  }
}

// Casts buffers of whole blocks for one tensor and one recipe, and keeps the tallies.
class BlockCaster {
 public:
  BlockCaster(const BlockRecipe& r, float tensor_amax, BlockProbeResult& out)
      : rule_{r.kind, r.element, r.rule, fp8::nvfp4_tensor_scale(tensor_amax)},
        block_(r.kind == fp8::ScalingRecipe::NVFP4 ? fp8::kNvfp4Block : fp8::kMxBlock),
        element_(r.kind == fp8::ScalingRecipe::NVFP4 ? e2m1_format() : element_format(r.element)),
        out_(out) {}

  int block() const { return block_; }

  // `nblocks` blocks at p holding `elements` real values; `valid[k]` (nullptr: all) says how many
  // of block k's are real, the rest being zero padding. With
  // `tile_rows` > 0 the blocks are rows of 16 x 16 tiles: tile_rows rows of nblocks / tile_rows
  // blocks each, and a tile's blocks share the tile's amax and scale.
  void run(const float* p, int64_t nblocks, int64_t elements, const uint8_t* valid, int64_t tile_rows = 0) {
    resize(nblocks);
    block_amaxes(p, nblocks, block_, amax_.data(), low_.data(), special_.data());
    const int64_t groups = tile_rows > 0 ? nblocks / tile_rows : nblocks;  // one scale per block, or per tile
    if (tile_rows > 0) combine_tiles(groups, tile_rows);
    const float* group_amax = tile_rows > 0 ? tile_amax_.data() : amax_.data();
    const uint8_t* group_special = tile_rows > 0 ? tile_special_.data() : special_.data();
    ScaleTally t;
    // A tile's paths are its rows' blocks' own (spread_tiles): the tile's amax stands in for low.
    block_scales(group_amax, tile_rows > 0 ? group_amax : low_.data(), group_special, groups, rule_, element_,
                 code_.data(), encode_.data(), decode_.data(), path_.data(), t);
    out_.blocks += groups;
    out_.blocks_zero += t.zero;
    out_.blocks_saturated += t.saturated;
    out_.blocks_at_min += t.at_min;
    out_.blocks_nonfinite += t.nonfinite;
    for (int64_t k = 0; k < groups; ++k) ++codes_[k & 3][code_[k]];  // four histograms: no chain of increments
    if (tile_rows > 0) spread_tiles(groups, tile_rows);
    const bool e8m0 = rule_.kind == fp8::ScalingRecipe::MXFP8;  // power-of-two scales
    cast_blocks(p, nblocks, block_, e8m0, encode_.data(), decode_.data(), path_.data(), element_, out_.cast);
    int64_t excluded = 0;  // non-finite and lost elements: not part of `count`
    for (int64_t k0 = 0; k0 < nblocks; k0 += 8) {  // eight paths at a time: exact blocks are rare
      uint64_t any = 0;
      std::memcpy(&any, path_.data() + k0, std::min<int64_t>(8, nblocks - k0));
      any &= in_word(kExactCast);
      for (int64_t k = k0; any != 0 && k < std::min<int64_t>(k0 + 8, nblocks); ++k) {
        if (path_[k] & kExactCast) excluded += exact_block(p + k * block_, valid ? valid[k] : block_, encode_[k], decode_[k]);
      }
    }
    out_.cast.count += elements - excluded;
  }

  // Adds the histograms of scale codes into the result: after the last run().
  void finish() {
    for (const auto& h : codes_) {
      for (size_t c = 0; c < h.size(); ++c) out_.scale_codes[c] += h[c];
    }
  }

 private:
  void resize(int64_t nblocks) {
    amax_.resize(nblocks);
    low_.resize(nblocks);
    special_.resize(nblocks);
    code_.resize(nblocks);
    encode_.resize(nblocks);
    decode_.resize(nblocks);
    path_.resize(nblocks);
  }

  // A tile's amax and special flag over its rows' blocks: column k of the tile_rows x groups grid.
  void combine_tiles(int64_t groups, int64_t tile_rows) {
    tile_amax_.assign(amax_.begin(), amax_.begin() + groups);
    tile_special_.assign(special_.begin(), special_.begin() + groups);
    for (int64_t r = 1; r < tile_rows; ++r) {
      for (int64_t k = 0; k < groups; ++k) {
        tile_amax_[k] = std::max(tile_amax_[k], amax_[k + r * groups]);
        tile_special_[k] = tile_special_[k] | special_[k + r * groups];
      }
    }
  }

  // Gives every row's block its tile's scale (row 0's entries hold them), and its path under it:
  // a block is cast in double when its own values, or its tile's scale, need it.
  void spread_tiles(int64_t groups, int64_t tile_rows) {
    for (int64_t k = 0; k < groups; ++k) {
      for (int64_t r = 0; r < tile_rows; ++r) {
        const int64_t j = k + r * groups;
        encode_[j] = encode_[k];
        decode_[j] = decode_[k];
        path_[j] = static_cast<uint8_t>(block_path(amax_[j], low_[j], special_[j], encode_[k], decode_[k], element_));
      }
    }
  }

  // One block element by element, sums in double: blocks with inf/NaN, a lost or zero scale, or
  // values whose squares leave float's range. Returns the elements left out of `count`.
  int64_t exact_block(const float* p, int n, float encode, float decode) {
    stats::Fp8ProbeResult& sums = out_.cast;
    int64_t excluded = 0;
    for (int i = 0; i < n; ++i) {
      const float ax = std::fabs(p[i]);
      if (!(ax <= FLT_MAX)) {
        ++excluded;  // inf and NaN: the statistics count them
        continue;
      }
      if (!(decode == decode)) {
        ++excluded;
        ++out_.lost;
        continue;
      }
      bool overflow = false;
      const float q = cast_scaled(ax, encode, element_, overflow);
      const double xh = static_cast<double>(q) * decode;
      if (decode > 0.0f) sums.overflow += overflow;
      sums.underflow += ax != 0.0f && (q == 0.0f || decode == 0.0f);
      const double err = ax - xh;
      sums.sum_sq_error += err * err;
      sums.sum_x_q += ax * xh;
      sums.sum_x_sq += static_cast<double>(ax) * ax;
      sums.sum_q_sq += xh * xh;
    }
    return excluded;
  }

  ScaleRule rule_;
  int block_;
  stats::Fp8ProbeParams element_;
  BlockProbeResult& out_;
  std::vector<float> amax_, low_, encode_, decode_, tile_amax_;
  std::vector<uint8_t> special_, path_, code_, tile_special_;
  std::array<std::array<int64_t, 256>, 4> codes_{};
};

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Advances `index` (an odometer over every dimension of `sizes` but those in `fixed`) and says
// whether it wrapped.
bool next_index(std::vector<int64_t>& index, c10::IntArrayRef sizes, int64_t fixed_a, int64_t fixed_b) {
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    if (d == fixed_a || d == fixed_b) continue;
    if (++index[d] < sizes[d]) return false;
    index[d] = 0;
  }
  return true;
}

int64_t offset_of(const std::vector<int64_t>& index, c10::IntArrayRef strides) {
  int64_t off = 0;
  for (size_t d = 0; d < index.size(); ++d) off += index[d] * strides[d];
  return off;
}

// 1-D blocks along `dim`: lines along it, gathered into zero-padded buffers of whole blocks,
// or read in place when the tensor is float32 laid out with `dim` innermost and whole blocks.
template <typename T>
void walk_lines(const at::Tensor& t, int64_t dim, BlockCaster& caster) {
  const T* base = static_cast<const T*>(stats::read_only_data(t));
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t B = caster.block();
  const int64_t K = t.dim() == 0 ? 1 : sizes[dim];
  const int64_t stride = t.dim() == 0 ? 1 : strides[dim];
  if constexpr (std::is_same_v<T, float>) {
    // In place: every line follows the previous one in memory (dim innermost, others packed).
    bool packed = stride == 1 && K % B == 0;
    int64_t expected = K;
    for (int64_t d = t.dim() - 1; d >= 0 && packed; --d) {
      if (d == dim || sizes[d] == 1) continue;
      packed = strides[d] == expected;
      expected *= sizes[d];
    }
    if (packed) {
      const int64_t n = t.numel();
      for (int64_t start = 0; start < n; start += kChunk) {
        const int64_t len = std::min(kChunk, n - start);
        caster.run(base + start, len / B, len, nullptr);
      }
      return;
    }
  }
  thread_local std::vector<float> buffer;
  buffer.assign(kChunk, 0.0f);  // a line longer than this goes in pieces
  std::vector<int64_t> index(static_cast<size_t>(t.dim()), 0);
  std::vector<uint8_t> valid;  // real elements per block (a line's last block is short)
  int64_t used = 0, elements = 0;
  auto flush = [&]() {
    if (used > 0) caster.run(buffer.data(), used / B, elements, valid.data());
    std::fill(buffer.begin(), buffer.begin() + used, 0.0f);
    used = elements = 0;
    valid.clear();
  };
  const int64_t lines = t.numel() / K;
  for (int64_t line = 0; line < lines; ++line) {
    const T* p = base + offset_of(index, strides);
    for (int64_t start = 0; start < K; start += kChunk) {  // a line longer than a buffer: in pieces
      const int64_t len = std::min(kChunk, K - start);
      const int64_t need = round_up(len, B);
      if (used + need > static_cast<int64_t>(buffer.size())) flush();
      for (int64_t i = 0; i < len; ++i) buffer[used + i] = to_float(p[(start + i) * stride]);
      for (int64_t b = 0; b < len; b += B) valid.push_back(static_cast<uint8_t>(std::min(B, len - b)));
      used += need;
      elements += len;
    }
    next_index(index, sizes, dim, dim);
  }
  flush();
}

// NVFP4 weights: 16 x 16 tiles over the last two dimensions (rows r, columns c), one group of
// 16 rows at a time, each row zero-padded to whole blocks.
template <typename T>
void walk_tiles(const at::Tensor& t, BlockCaster& caster) {
  const T* base = static_cast<const T*>(stats::read_only_data(t));
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t nd = t.dim(), B = caster.block();
  const int64_t R = sizes[nd - 2], C = sizes[nd - 1], sr = strides[nd - 2], sc = strides[nd - 1];
  const int64_t padded = round_up(C, B);
  thread_local std::vector<float> buffer;
  std::vector<uint8_t> valid;
  std::vector<int64_t> index(static_cast<size_t>(nd), 0);
  const int64_t matrices = t.numel() / (R * C);
  for (int64_t m = 0; m < matrices; ++m) {
    const T* mat = base + offset_of(index, strides);
    for (int64_t r0 = 0; r0 < R; r0 += B) {
      const int64_t rows = std::min(B, R - r0);
      buffer.assign(static_cast<size_t>(rows * padded), 0.0f);
      valid.clear();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < C; ++c) buffer[r * padded + c] = to_float(mat[(r0 + r) * sr + c * sc]);
        for (int64_t c = 0; c < C; c += B) valid.push_back(static_cast<uint8_t>(std::min(B, C - c)));
      }
      caster.run(buffer.data(), rows * padded / B, rows * C, valid.data(), rows);
    }
    next_index(index, sizes, nd - 2, nd - 1);
  }
}

template <typename T>
void walk(const at::Tensor& t, const BlockLayout& layout, BlockCaster& caster) {
  if (layout.tiles_2d && t.dim() >= 2) {
    walk_tiles<T>(t, caster);
  } else {
    int64_t dim = layout.dim < 0 ? layout.dim + t.dim() : layout.dim;
    dim = std::max<int64_t>(0, std::min<int64_t>(dim, t.dim() - 1));
    walk_lines<T>(t, dim, caster);
  }
}

}  // namespace

bool probe_blocks(const at::Tensor& t, const BlockRecipe& recipe, const BlockLayout& layout, float tensor_amax,
                  BlockProbeResult& out) {
  out = BlockProbeResult{};
  if (stats::compute_readability(t) != stats::Readability::Read) return false;
  BlockCaster caster(recipe, tensor_amax, out);
  switch (t.scalar_type()) {
    case c10::kFloat: walk<float>(t, layout, caster); break;
    case c10::kDouble: walk<double>(t, layout, caster); break;
    case c10::kHalf: walk<c10::Half>(t, layout, caster); break;
    case c10::kBFloat16: walk<c10::BFloat16>(t, layout, caster); break;
    default: return false;
  }
  caster.finish();
  return true;
}

}  // namespace recipes
}  // namespace sentinel

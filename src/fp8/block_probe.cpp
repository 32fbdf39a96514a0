#include "fp8/block_probe.h"

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "stats/read_only_data.h"
#include <vector>

#include "fp8/block_kernels.h"
#include "fp8/group_math.h"
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

constexpr int64_t kChunk = 4096;  // floats per buffer: whole blocks of 16, 32 and 128, in L1

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

// Casts buffers of whole blocks for one tensor and one recipe, and keeps the tallies. Amaxes are
// taken over sub-blocks of 16 (NVFP4) or 32 elements; a scale covers one sub-block, or a group:
// `width` sub-blocks along a row (Float8Block's 1 x 128) times the rows of a tile band (NVFP4's
// 16 x 16 and Float8Block's 128 x 128 tiles).
class BlockCaster {
 public:
  BlockCaster(const BlockRecipe& r, float tensor_amax, BlockProbeResult& out)
      : rule_{r.kind, r.element, r.rule, fp8::nvfp4_tensor_scale(tensor_amax), r.pow2, r.epsilon},
        block_(r.kind == fp8::ScalingRecipe::NVFP4 ? fp8::kNvfp4Block : fp8::kMxBlock),
        width_(r.kind == fp8::ScalingRecipe::Float8Block ? fp8::kFloat8Block / fp8::kMxBlock : 1),
        element_(r.kind == fp8::ScalingRecipe::NVFP4 ? e2m1_format() : element_format(r.element)),
        out_(out) {}

  int block() const { return block_; }
  // Lines are zero-padded to a multiple of this: whole groups.
  int line_multiple() const { return block_ * width_; }
  // A tile's side (rows of a band, and the columns its row pieces are padded to).
  int tile_side() const { return rule_.kind == fp8::ScalingRecipe::Float8Block ? fp8::kFloat8Block : block_; }

  // `nblocks` sub-blocks at p holding `elements` real values; `valid[k]` (nullptr: all) says how
  // many of sub-block k's are real, the rest being zero padding. The sub-blocks are `tile_rows`
  // rows of nblocks / tile_rows each, and a tile's sub-blocks share the tile's amax and scale.
  void run(const float* p, int64_t nblocks, int64_t elements, const uint8_t* valid, int64_t tile_rows = 1) {
    resize(nblocks);
    block_amaxes(p, nblocks, block_, amax_.data(), low_.data(), special_.data());
    const bool grouped = tile_rows > 1 || width_ > 1;
    const int64_t per_row = nblocks / tile_rows;
    const int64_t groups = grouped ? per_row / width_ : nblocks;  // one scale per group
    if (grouped) combine_groups(per_row, tile_rows, groups);
    const float* group_amax = grouped ? g_amax_.data() : amax_.data();
    const uint8_t* group_special = grouped ? g_special_.data() : special_.data();
    float* enc = grouped ? g_encode_.data() : encode_.data();
    float* dec = grouped ? g_decode_.data() : decode_.data();
    uint8_t* path = grouped ? g_path_.data() : path_.data();
    ScaleTally t;
    // A group's paths are its sub-blocks' own (spread_groups): the group's amax stands in for low.
    block_scales(group_amax, grouped ? group_amax : low_.data(), group_special, groups, rule_, element_, code_.data(),
                 enc, dec, path, t);
    out_.blocks += groups;
    out_.blocks_zero += t.zero;
    out_.blocks_saturated += t.saturated;
    out_.blocks_at_min += t.at_min;
    out_.blocks_nonfinite += t.nonfinite;
    for (int64_t k = 0; k < groups; ++k) ++codes_[k & 3][code_[k]];  // four histograms: no chain of increments
    if (grouped) spread_groups(nblocks, per_row);
    // Power-of-two scales (MXFP8's E8M0, Float8Block's by default): encode * decode is exactly 1.
    const bool pow2 = rule_.kind == fp8::ScalingRecipe::MXFP8 || (rule_.kind == fp8::ScalingRecipe::Float8Block && rule_.pow2);
    cast_blocks(p, nblocks, block_, pow2, encode_.data(), decode_.data(), path_.data(), element_, out_.cast);
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

  // A group's amax and special flag over its sub-blocks: in each of the tile_rows rows of
  // per_row sub-blocks, the `width_` sub-blocks from g * width_.
  void combine_groups(int64_t per_row, int64_t tile_rows, int64_t groups) {
    g_amax_.assign(static_cast<size_t>(groups), 0.0f);
    g_special_.assign(static_cast<size_t>(groups), 0);
    g_encode_.resize(static_cast<size_t>(groups));
    g_decode_.resize(static_cast<size_t>(groups));
    g_path_.resize(static_cast<size_t>(groups));
    for (int64_t r = 0; r < tile_rows; ++r) {
      for (int64_t c = 0; c < per_row; ++c) {
        const int64_t j = r * per_row + c, g = c / width_;
        g_amax_[g] = std::max(g_amax_[g], amax_[j]);
        g_special_[g] = g_special_[g] | special_[j];
      }
    }
  }

  // Gives every sub-block its group's scale, and its path under it: a sub-block is cast in
  // double when its own values, or its group's, need it (a group's amax sets its scale, so a
  // quiet sub-block beside a huge value still has factors whose squares leave float's range).
  void spread_groups(int64_t nblocks, int64_t per_row) {
    for (int64_t j = 0; j < nblocks; ++j) {
      const int64_t g = (j % per_row) / width_;
      encode_[j] = g_encode_[g];
      decode_[j] = g_decode_[g];
      path_[j] = static_cast<uint8_t>(block_path(amax_[j], low_[j], special_[j], g_encode_[g], g_decode_[g], element_) |
                                      (g_path_[g] & kExactCast));
    }
  }

  // One block element by element, sums in double (group_math.h, as a GPU casts every element):
  // blocks with inf/NaN, a lost or zero scale, or values whose squares leave float's range.
  // Returns the elements left out of `count`.
  int64_t exact_block(const float* p, int n, float encode, float decode) {
    CastTally t;
    for (int i = 0; i < n; ++i) t.add(p[i], encode, decode, element_);
    const int64_t excluded = n - static_cast<int64_t>(t.count);
    t.count = 0;  // the caller counts the elements, less those excluded
    add_tallies(t, GroupTally{}, out_);
    return excluded;
  }

  ScaleRule rule_;
  int block_;
  int width_;
  stats::Fp8ProbeParams element_;
  BlockProbeResult& out_;
  std::vector<float> amax_, low_, encode_, decode_, g_amax_, g_encode_, g_decode_;
  std::vector<uint8_t> special_, path_, code_, g_special_, g_path_;
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
  const int64_t B = caster.block(), L = caster.line_multiple();
  const int64_t K = t.dim() == 0 ? 1 : sizes[dim];
  const int64_t stride = t.dim() == 0 ? 1 : strides[dim];
  if constexpr (std::is_same_v<T, float>) {
    // In place: every line follows the previous one in memory (dim innermost, others packed).
    bool packed = stride == 1 && K % L == 0;
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
      const int64_t need = round_up(len, L);
      if (used + need > static_cast<int64_t>(buffer.size())) flush();
      for (int64_t i = 0; i < len; ++i) buffer[used + i] = to_float(p[(start + i) * stride]);
      for (int64_t b = 0; b < need; b += B) valid.push_back(static_cast<uint8_t>(std::clamp<int64_t>(len - b, 0, B)));
      used += need;
      elements += len;
    }
    next_index(index, sizes, dim, dim);
  }
  flush();
}

// NVFP4 and Float8Block weights: 16 x 16 (128 x 128) tiles over the last two dimensions (rows r,
// columns c), one band of a tile's rows at a time, each row zero-padded to whole tiles.
template <typename T>
void walk_tiles(const at::Tensor& t, BlockCaster& caster) {
  const T* base = static_cast<const T*>(stats::read_only_data(t));
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  const int64_t nd = t.dim(), B = caster.block(), side = caster.tile_side();
  const int64_t R = sizes[nd - 2], C = sizes[nd - 1], sr = strides[nd - 2], sc = strides[nd - 1];
  const int64_t padded = round_up(C, side);
  thread_local std::vector<float> buffer;
  std::vector<uint8_t> valid;
  std::vector<int64_t> index(static_cast<size_t>(nd), 0);
  const int64_t matrices = t.numel() / (R * C);
  for (int64_t m = 0; m < matrices; ++m) {
    const T* mat = base + offset_of(index, strides);
    for (int64_t r0 = 0; r0 < R; r0 += side) {
      const int64_t rows = std::min(side, R - r0);
      buffer.assign(static_cast<size_t>(rows * padded), 0.0f);
      valid.clear();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < C; ++c) buffer[r * padded + c] = to_float(mat[(r0 + r) * sr + c * sc]);
        for (int64_t c = 0; c < padded; c += B) valid.push_back(static_cast<uint8_t>(std::clamp<int64_t>(C - c, 0, B)));
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

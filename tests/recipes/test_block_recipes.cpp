// The recipes' probes on tensors against a float64 re-implementation whose casts are CUDA's own
// host conversions: block by block (or tile by tile) the scale, then every element. Counts,
// block tallies and scale histograms must be equal; MSE, cosine and SQNR agree to 1e-5.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <vector>

#include "fp8/cuda_block_oracle.h"
#include "fp8/cuda_fp8_oracle.h"
#include "fp8/float8_block_oracle.h"
#include "fp8/block_kernels.h"
#include "fp8/block_probe.h"
#include "fp8/recipe_probe.h"
#include "stats/simd_level.h"
#include "stats/tensor_stats.h"
#include "support/simd_levels.h"

namespace sentinel {
namespace {

using fp8::Format;
using recipes::BlockLayout;
using recipes::BlockProbeResult;
using recipes::BlockRecipe;

struct Reference {
  int64_t count = 0, overflow = 0, underflow = 0, blocks = 0, zero = 0, saturated = 0, at_min = 0, nonfinite = 0, lost = 0;
  std::array<int64_t, 256> codes{};
  double se = 0, xq = 0, xx = 0, qq = 0;
};

struct Scale {
  uint8_t code;
  float encode, decode;
  bool saturated, at_min;
};

// A group of values sharing one scale (a block, or a tile), with the recipe's rule computed from
// CUDA's conversions.
Scale reference_scale(const std::vector<float>& group, const BlockRecipe& r, float tensor_scale) {
  float amax = 0;
  bool special = false;
  for (float x : group) {
    if (std::isnan(x)) special = true;
    else amax = std::max(amax, std::fabs(x));
    special = special || std::isinf(x);
  }
  if (r.kind == fp8::ScalingRecipe::Float8Block) {
    const auto f = fp8::oracle::float8_block_reference(amax, r.element, r.pow2, r.epsilon);
    return {f.code, f.scale, f.scale_inv, f.saturated, false};
  }
  if (r.kind == fp8::ScalingRecipe::NVFP4) {
    const uint8_t code = fp8::oracle::cuda_encode(amax * (tensor_scale * (1.0f / 6.0f)), Format::E4M3, true);
    const float block = fp8::oracle::cuda_decode(code, Format::E4M3);
    const float s_dec = static_cast<float>(1.0 / static_cast<double>(tensor_scale));
    const bool saturated = fp8::oracle::cuda_encode(amax * (tensor_scale * (1.0f / 6.0f)), Format::E4M3, false) == 0x7F;
    return {code, std::fmin(1.0f / (block * s_dec), FLT_MAX), block * s_dec, saturated, block == 0 && amax > 0};
  }
  const int emax = r.element == Format::E4M3 ? 8 : 15;
  if (r.rule == fp8::MxScaleRule::OcpFloor) {
    if (special) return {0xFF, 0.0f, NAN, false, false};
    const int floor_log2 = static_cast<int>(fp8::oracle::cuda_e8m0(amax, false, true)) - 127;
    const int shared = std::max(floor_log2 - emax, -127);
    return {static_cast<uint8_t>(shared + 127), std::ldexp(1.0f, -shared), std::ldexp(1.0f, shared), false,
            floor_log2 - emax < -127 && amax > 0};
  }
  const float rcp = static_cast<float>(1.0 / fp8::max_value(r.element));
  const uint8_t code = fp8::oracle::cuda_e8m0(amax * rcp, true, true);
  const float enc = code == 0 ? 1.0f : (code == 254 ? 0.0f : std::ldexp(1.0f, 254 - code - 127));
  return {code, enc, fp8::oracle::cuda_e8m0_value(code), code == 254, code == 0 && amax > 0};
}

// The element cast: CUDA's conversion of |x| * encode; `overflow` when it rounds above max.
float reference_cast(float ax, float encode, const BlockRecipe& r, bool& overflow) {
  const float a = ax * encode;
  if (r.kind == fp8::ScalingRecipe::NVFP4) {
    overflow = a >= 7.0f;  // 7 is the tie between 6 and 8, which goes to 8 (even)
    return fp8::oracle::cuda_e2m1_value(fp8::oracle::cuda_e2m1(a));
  }
  const uint8_t nosat = fp8::oracle::cuda_encode(a, r.element, false);
  overflow = (nosat & 0x7F) == (r.element == Format::E4M3 ? 0x7F : 0x7C);
  return fp8::oracle::cuda_decode(fp8::oracle::cuda_encode(a, r.element, true), r.element);
}

void reference_group(const std::vector<float>& group, const BlockRecipe& r, float tensor_scale, Reference& ref) {
  const Scale s = reference_scale(group, r, tensor_scale);
  ++ref.blocks;
  bool special = false;
  float amax = 0;
  for (float x : group) {
    special = special || !std::isfinite(x);
    if (!std::isnan(x)) amax = std::max(amax, std::fabs(x));
  }
  ref.zero += amax == 0;
  ref.nonfinite += special;
  ref.saturated += s.saturated;
  ref.at_min += s.at_min;
  ++ref.codes[s.code];
  for (float x : group) {
    if (!std::isfinite(x)) continue;
    if (std::isnan(s.decode)) {
      ++ref.lost;
      continue;
    }
    ++ref.count;
    const float ax = std::fabs(x);
    bool overflow = false;
    const float q = reference_cast(ax, s.encode, r, overflow);
    if (s.decode > 0) ref.overflow += overflow;
    ref.underflow += ax != 0 && (q == 0 || s.decode == 0);
    const double xh = static_cast<double>(q) * s.decode;
    ref.se += (ax - xh) * (ax - xh);
    ref.xq += ax * xh;
    ref.xx += static_cast<double>(ax) * ax;
    ref.qq += xh * xh;
  }
}

float nan_ignoring_amax(const torch::Tensor& f) {
  auto a = f.abs();
  a = torch::where(torch::isnan(a), torch::zeros_like(a), a);
  return a.numel() ? a.max().item<float>() : 0.0f;
}

Reference reference_probe(const torch::Tensor& t, const BlockRecipe& r, const BlockLayout& layout) {
  const auto f = t.to(torch::kFloat);  // float64 rounds, the others are exact
  const float tensor_scale = fp8::nvfp4_tensor_scale(nan_ignoring_amax(f));
  const int B = r.kind == fp8::ScalingRecipe::NVFP4 ? 16 : r.kind == fp8::ScalingRecipe::Float8Block ? 128 : 32;
  Reference ref;
  if (layout.tiles_2d) {
    const auto m = f.contiguous().reshape({-1, f.size(-2), f.size(-1)});
    for (int64_t i = 0; i < m.size(0); ++i) {
      for (int64_t r0 = 0; r0 < m.size(1); r0 += B) {
        for (int64_t c0 = 0; c0 < m.size(2); c0 += B) {
          const auto tile = m[i].slice(0, r0, r0 + B).slice(1, c0, c0 + B).contiguous();
          std::vector<float> group(tile.data_ptr<float>(), tile.data_ptr<float>() + tile.numel());
          reference_group(group, r, tensor_scale, ref);
        }
      }
    }
    return ref;
  }
  const int64_t dim = layout.dim < 0 ? layout.dim + t.dim() : layout.dim;
  const auto lines = f.movedim(dim, -1).contiguous().reshape({-1, f.size(dim)});
  for (int64_t i = 0; i < lines.size(0); ++i) {
    const float* p = lines[i].data_ptr<float>();
    for (int64_t k0 = 0; k0 < lines.size(1); k0 += B) {
      std::vector<float> group(p + k0, p + std::min<int64_t>(k0 + B, lines.size(1)));
      reference_group(group, r, tensor_scale, ref);
    }
  }
  return ref;
}

void expect_close(double ours, double want, const char* what) {
  EXPECT_NEAR(ours, want, 1e-5 * std::fabs(want) + 1e-300) << what;
}

// `rounded_xhat`: scales that are not powers of two (NVFP4's, Float8Block's FP32 ones), where the
// vector lanes hold x_hat = q * decode rounded to float: each error x - x_hat is then off by up
// to 2^-24 |x|, so the sum of squared errors may be off by 2 * 2^-24 * sum |err| |x| <= 2^-26 sum
// x^2 (|err| <= |x| / 8 for E4M3 and E5M2 elements), which a block cast almost exactly shows.
void expect_matches(const BlockProbeResult& got, const Reference& want, bool rounded_xhat = false) {
  EXPECT_EQ(got.cast.count, want.count);
  EXPECT_EQ(got.cast.overflow, want.overflow);
  EXPECT_EQ(got.cast.underflow, want.underflow);
  EXPECT_EQ(got.blocks, want.blocks);
  EXPECT_EQ(got.blocks_zero, want.zero);
  EXPECT_EQ(got.blocks_saturated, want.saturated);
  EXPECT_EQ(got.blocks_at_min, want.at_min);
  EXPECT_EQ(got.blocks_nonfinite, want.nonfinite);
  EXPECT_EQ(got.lost, want.lost);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(got.scale_codes[c], want.codes[c]) << "scale code " << c;
  if (rounded_xhat) {
    EXPECT_NEAR(got.cast.sum_sq_error, want.se, 1e-5 * want.se + std::ldexp(want.xx, -26)) << "sum of squared errors";
  } else {
    expect_close(got.cast.sum_sq_error, want.se, "sum of squared errors");
  }
  expect_close(got.cast.sum_x_q, want.xq, "sum x * x_hat");
  expect_close(got.cast.sum_x_sq, want.xx, "sum x^2");
  expect_close(got.cast.sum_q_sq, want.qq, "sum x_hat^2");
}

// Rows of very different magnitudes, and the blocks that break naive code: all zero, one huge
// value among small ones, float subnormals, inf and NaN inside a block, -0.
torch::Tensor adversarial(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  auto t = torch::randn(shape, torch::kDouble);
  auto flat = t.view({-1});
  const int64_t n = flat.numel();
  for (int64_t i = 0; i < n; ++i) flat[i] = flat[i].item<double>() * std::pow(10.0, static_cast<int>(i / 40 % 17) - 8);
  auto set = [&](int64_t i, double v) {
    if (i < n) flat[i] = v;
  };
  for (int64_t i = 64; i < 128; ++i) set(i, 0.0);
  set(130, 3e38);
  set(200, 1e-42);
  set(201, -3e-41);
  set(260, INFINITY);
  set(300, NAN);
  set(340, -0.0);
  set(350, 1e30);
  return t;
}

// Every block recipe and rule: MXFP8 with either element format under either scale rule, NVFP4,
// Float8Block with power-of-two and FP32 scales, with either element format, and with an epsilon.
const BlockRecipe kBlockRecipes[] = {
    {fp8::ScalingRecipe::MXFP8, Format::E4M3, fp8::MxScaleRule::RoundUp},
    {fp8::ScalingRecipe::MXFP8, Format::E5M2, fp8::MxScaleRule::RoundUp},
    {fp8::ScalingRecipe::MXFP8, Format::E4M3, fp8::MxScaleRule::OcpFloor},
    {fp8::ScalingRecipe::MXFP8, Format::E5M2, fp8::MxScaleRule::OcpFloor},
    {fp8::ScalingRecipe::NVFP4, Format::E4M3, fp8::MxScaleRule::RoundUp},
    {fp8::ScalingRecipe::Float8Block, Format::E4M3, fp8::MxScaleRule::RoundUp, true, 0.0f},
    {fp8::ScalingRecipe::Float8Block, Format::E5M2, fp8::MxScaleRule::RoundUp, true, 0.0f},
    {fp8::ScalingRecipe::Float8Block, Format::E4M3, fp8::MxScaleRule::RoundUp, false, 0.0f},
    {fp8::ScalingRecipe::Float8Block, Format::E4M3, fp8::MxScaleRule::RoundUp, true, 1e-3f}};

std::string recipe_label(const BlockRecipe& r) {
  std::string s = std::string(fp8::recipe_name(r.kind)) + " " + fp8::format_name(r.element) + " ";
  if (r.kind != fp8::ScalingRecipe::Float8Block) return s + fp8::mx_scale_rule_name(r.rule);
  return s + (r.pow2 ? "pow2" : "fp32") + " eps " + std::to_string(r.epsilon);
}

// Adversarial values, or ordinary ones: Gaussian, or |x| in [1, 2) with random signs (no block
// of these can flush to zero, so every recipe's blocks are quiet, block_kernels.h).
enum class Data { Adversarial, Gaussian, Narrow };

struct Case {
  std::vector<int64_t> shape;
  int dim;
  bool transpose;  // probe t.t() (a view) instead of t
  bool tiles;
  Data data = Data::Adversarial;
};

torch::Tensor make_data(const Case& c) {
  if (c.data == Data::Adversarial) return adversarial(c.shape, 3);
  torch::manual_seed(4);
  if (c.data == Data::Gaussian) return torch::randn(c.shape, torch::kDouble) * 3;
  const auto sign = torch::randint(0, 2, c.shape, torch::kDouble) * 2 - 1;
  return sign * (torch::rand(c.shape, torch::kDouble) + 1);
}

TEST(BlockRecipes, MatchTheReferenceOnEveryLayoutDtypeAndSimdLevel) {
  const Case cases[] = {{{6, 96}, -1, false, false}, {{5, 37}, -1, false, false}, {{37, 5}, 0, false, false},
                        {{40, 64}, 0, true, false},  {{2, 3, 50}, 1, false, false}, {{40, 37}, -1, false, true},
                        {{33, 70}, -1, true, true},  {{16, 16}, -1, false, true},   {{1, 1}, -1, false, false},
                        // Past the adversarial values, whole groups of ordinary blocks: the cast's
                        // fast loop, and groups holding skipped blocks, at every level.
                        {{3, 2048}, -1, false, false}, {{48, 160}, -1, false, true},
                        // Ordinary values: groups of quiet blocks (MXFP8's Gaussian ones, all the
                        // narrow ones), and groups mixing quiet and counted blocks.
                        {{4, 1024}, -1, false, false, Data::Gaussian}, {{4, 1024}, -1, false, false, Data::Narrow},
                        {{64, 64}, -1, false, true, Data::Narrow}, {{64, 96}, 0, true, false, Data::Gaussian},
                        // Float8Block's 128-long groups and 128 x 128 tiles, whole and partial.
                        {{3, 300}, -1, false, false}, {{260, 3}, 0, false, false}, {{130, 200}, -1, false, true},
                        {{2, 256, 130}, -1, false, true, Data::Gaussian}, {{256, 384}, -1, false, false, Data::Narrow}};
  int checked = 0;
  for (auto level : {stats::SimdLevel::Baseline, stats::SimdLevel::V3, stats::SimdLevel::V4}) {
    if (!stats::cpu_supports(level)) continue;
    sentinel_test::ForcedSimdLevel forced(level);  // undone however the iteration ends
    for (const Case& c : cases) {
      for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf}) {
        auto t = make_data(c).to(dtype);
        if (c.transpose) t = t.t();
        for (const BlockRecipe& r : kBlockRecipes) {
          if (c.tiles && r.kind == fp8::ScalingRecipe::MXFP8) continue;
          SCOPED_TRACE(std::string(stats::to_string(level)) + " " + recipe_label(r) + " " + c10::toString(dtype) + " " +
                       c10::str(t.sizes()) + (c.tiles ? " tiles" : " dim " + std::to_string(c.dim)));
          const BlockLayout layout{c.dim, c.tiles};
          BlockProbeResult got;
          ASSERT_TRUE(recipes::probe_blocks(t, r, layout, nan_ignoring_amax(t.to(torch::kFloat)), got));
          expect_matches(got, reference_probe(t, r, layout), r.kind == fp8::ScalingRecipe::Float8Block && !r.pow2);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

// Amaxes that reach every branch of the scale rules: every float exponent with the mantissas
// at the E8M0 rounding edges (0, the float subnormal 2^-127 boundary, all ones), a sweep over
// all bit patterns, inf, and for NVFP4 the floats on both sides of every E4M3 rounding midpoint
// (and of the saturation point 464) as amax * S_enc / 6 reaches them.
std::vector<float> edge_amaxes(float nv_factor) {
  std::vector<float> v = {0.0f, INFINITY, FLT_MAX, FLT_MIN, 1e17f, std::nextafter(1e17f, 0.0f), 1e-12f,
                          std::nextafter(1e-12f, 0.0f)};
  for (uint32_t e = 0; e < 255; ++e) {
    for (uint32_t m : {0u, 1u, 2u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFEu, 0x7FFFFFu, 0x123457u * (e + 1) % 0x800000u}) {
      v.push_back(fp8::detail::bits_to_float(e << 23 | m));
    }
  }
  for (uint32_t bits = 0; bits < 0x7F800000u; bits += 40009u) v.push_back(fp8::detail::bits_to_float(bits));
  std::vector<float> edges = {464.0f};  // where E4M3 leaves its finite range
  for (int code = 0; code < 0x7E; ++code) {  // midpoints between neighbouring finite E4M3 values
    edges.push_back(0.5f * (fp8::decode(static_cast<uint8_t>(code), Format::E4M3) +
                            fp8::decode(static_cast<uint8_t>(code + 1), Format::E4M3)));
  }
  for (float edge : edges) {
    float a = edge / nv_factor;
    for (int i = 0; i < 4; ++i) a = std::nextafter(a, 0.0f);
    for (int i = 0; i < 9; ++i, a = std::nextafter(a, INFINITY)) v.push_back(a);
  }
  return v;
}

// The vector loop that turns block amaxes into scales, against CUDA's conversions, at every SIMD
// level, in pieces of every length up to 17 (so that every tail is run) and as one array.
TEST(BlockRecipes, BlockScalesMatchCudaOnEdgeAmaxesAtEverySimdLevel) {
  int64_t checked = 0;
  for (auto level : {stats::SimdLevel::Baseline, stats::SimdLevel::V3, stats::SimdLevel::V4}) {
    if (!stats::cpu_supports(level)) continue;
    sentinel_test::ForcedSimdLevel forced(level);  // undone however the iteration ends
    std::array<int64_t, 4> seen{};  // ordinary blocks on each path: quiet, flush, saturate, both
    for (const BlockRecipe& r : kBlockRecipes) {
      const bool nvfp4 = r.kind == fp8::ScalingRecipe::NVFP4;
      for (float tensor_amax : nvfp4 ? std::vector<float>{2688.0f, 1.0f, 3e38f, 1e-30f, 1e-40f, 0.0f} : std::vector<float>{1.0f}) {
        const float tensor_scale = fp8::nvfp4_tensor_scale(tensor_amax);
        SCOPED_TRACE(std::string(stats::to_string(level)) + " " + recipe_label(r) + " S_enc " +
                     std::to_string(tensor_scale));
        std::vector<float> amax = edge_amaxes(tensor_scale * (1.0f / 6.0f));
        const size_t plain = amax.size();
        amax.insert(amax.end(), amax.begin(), amax.begin() + static_cast<std::ptrdiff_t>(plain));
        std::vector<uint8_t> special(amax.size(), 0);
        std::fill(special.begin() + static_cast<std::ptrdiff_t>(plain), special.end(), 1);  // each again, with inf/NaN
        const size_t n = amax.size();
        // The blocks' smallest |x|: at their amax, a little below, far below, zero.
        std::vector<float> low(n);
        for (size_t k = 0; k < n; ++k) low[k] = amax[k] * std::array<float, 4>{1.0f, 0.5f, 1e-6f, 0.0f}[k % 4];
        const stats::Fp8ProbeParams element = nvfp4 ? recipes::e2m1_format() : recipes::element_format(r.element);
        std::vector<uint8_t> code(n), path(n);
        std::vector<float> enc(n), dec(n);
        recipes::ScaleTally whole, pieces;
        const recipes::ScaleRule rule{r.kind, r.element, r.rule, tensor_scale, r.pow2, r.epsilon};
        recipes::block_scales(amax.data(), low.data(), special.data(), static_cast<int64_t>(n), rule, element,
                              code.data(), enc.data(), dec.data(), path.data(), whole);
        std::vector<uint8_t> code2(n), path2(n);
        std::vector<float> enc2(n), dec2(n);
        for (size_t k = 0, len = 1; k < n; k += len, len = len % 17 + 1) {
          const size_t m = std::min(len, n - k);
          recipes::block_scales(amax.data() + k, low.data() + k, special.data() + k, static_cast<int64_t>(m), rule,
                                element, code2.data() + k, enc2.data() + k, dec2.data() + k, path2.data() + k, pieces);
        }
        recipes::ScaleTally want;
        for (size_t k = 0; k < n; ++k) {
          std::vector<float> group = {amax[k]};
          if (special[k]) group.push_back(NAN);
          const Scale s = reference_scale(group, r, tensor_scale);
          want.zero += amax[k] == 0.0f;
          want.saturated += s.saturated;
          want.at_min += s.at_min;
          want.nonfinite += special[k];
          const bool bad = special[k] || !(s.decode > 0.0f && s.decode <= FLT_MAX) || s.encode == 0.0f ||
                           amax[k] >= recipes::kLargeForFloatSums || amax[k] < recipes::kSmallForFloatSums;
          // Whether the largest scaled value can round above the format's max, the smallest to 0.
          const bool saturate = !(amax[k] * s.encode <= element.overflow_above);
          const bool flush = !(low[k] * s.encode >= element.underflow_below);
          const int want_path = (bad ? recipes::kExactCast : 0) | (flush ? recipes::kMayFlush : 0) |
                                (saturate ? recipes::kMaySaturate : 0);
          if (!bad) ++seen[(flush ? 1 : 0) + (saturate ? 2 : 0)];
          for (int pass = 0; pass < 2; ++pass) {
            const uint8_t c = pass ? code2[k] : code[k];
            const float e = pass ? enc2[k] : enc[k], d = pass ? dec2[k] : dec[k];
            const uint8_t got_path = pass ? path2[k] : path[k];
            if (c != s.code || !(e == s.encode) || !(d == s.decode || (std::isnan(d) && std::isnan(s.decode))) ||
                got_path != want_path) {
              ADD_FAILURE() << "amax " << amax[k] << " (bits " << std::hex << fp8::detail::float_to_bits(amax[k])
                            << std::dec << ") special " << int(special[k]) << (pass ? " in pieces" : "") << ": code "
                            << int(c) << " want " << int(s.code) << ", encode " << e << " want " << s.encode
                            << ", decode " << d << " want " << s.decode << ", path " << int(got_path) << " want " << want_path;
              return;
            }
          }
          ++checked;
        }
        for (const recipes::ScaleTally& got : {whole, pieces}) {
          EXPECT_EQ(got.zero, want.zero);
          EXPECT_EQ(got.saturated, want.saturated);
          EXPECT_EQ(got.at_min, want.at_min);
          EXPECT_EQ(got.nonfinite, want.nonfinite);
        }
        // The edges were reached (an amax floor keeps Float8Block's scale from clamping).
        if (r.epsilon == 0.0f) {
          EXPECT_GT(want.saturated + want.at_min, 0);
        }
      }
    }
    for (int64_t n : seen) EXPECT_GT(n, 0);
  }
  EXPECT_GT(checked, 1000000);
}

TEST(BlockRecipes, LargeContiguousTensorsReadInPlaceAgreeWithTheReference) {
  torch::manual_seed(5);
  const auto t = torch::randn({64, 4096}) * torch::logspace(-6, 6, 64).unsqueeze(1);  // 256 KiB lines
  for (const BlockRecipe& r : {BlockRecipe{fp8::ScalingRecipe::MXFP8, Format::E4M3, fp8::MxScaleRule::RoundUp},
                               BlockRecipe{fp8::ScalingRecipe::NVFP4, Format::E4M3, fp8::MxScaleRule::RoundUp},
                               BlockRecipe{fp8::ScalingRecipe::Float8Block, Format::E4M3, fp8::MxScaleRule::RoundUp}}) {
    BlockProbeResult got;
    ASSERT_TRUE(recipes::probe_blocks(t, r, BlockLayout{-1, false}, nan_ignoring_amax(t), got));
    expect_matches(got, reference_probe(t, r, BlockLayout{-1, false}));
  }
}

TEST(BlockRecipes, UnreadableTensorsAreNotProbed) {
  BlockProbeResult got;
  const BlockRecipe r{};
  EXPECT_FALSE(recipes::probe_blocks(torch::empty({0, 32}), r, BlockLayout{}, 0.0f, got));
  EXPECT_FALSE(recipes::probe_blocks(torch::ones({4, 32}, torch::kInt), r, BlockLayout{}, 0.0f, got));
  EXPECT_FALSE(recipes::probe_blocks(torch::empty({4, 32}, torch::TensorOptions().device(torch::kMeta)), r,
                                     BlockLayout{}, 0.0f, got));
  EXPECT_EQ(got.cast.count, 0);
}

}  // namespace
}  // namespace sentinel

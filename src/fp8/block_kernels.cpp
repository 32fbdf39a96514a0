#include "fp8/block_kernels.h"

#include <sentinel/microscaling.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <utility>

#include "fp8/block_lanes.h"
#include "fp8/fp8_round_lanes.h"
#include "stats/isa.h"
#include "stats/simd_level.h"

namespace sentinel {
namespace recipes {

stats::Fp8ProbeParams element_format(fp8::Format f) { return stats::make_fp8_probe_params(1.0f, f); }

stats::Fp8ProbeParams e2m1_format() {
  return stats::make_element_params(1.0f, fp8::kE2M1Max, /*min_subnormal=*/0.5f, /*mantissa_bits=*/1);
}

namespace {

// L blocks at once: each block's vectors are folded into one by an integer max of the bits of
// |x| (they order as |x| does, inf and NaN above every finite value), then the L vectors are
// folded pairwise into one whose lane i holds block i's max: log2(L) rounds of two shuffles and
// a max per pair, where folding each block's lanes alone costs log2(L) rounds per block.
template <int kBytes>
struct AmaxTree {
  using M = typename Vec<kBytes>::M;
  static constexpr int L = Vec<kBytes>::L;

  // Lanes with bit H clear take x's pair (i, i + H), lanes with it set take y's (i - H, i).
  template <int H, size_t... I>
  __attribute__((always_inline)) static void fold(const M& x, const M& y, M& out, std::index_sequence<I...>) {
    const M lo = __builtin_shufflevector(x, y, ((I & H) ? int(L + I - H) : int(I))...);
    const M hi = __builtin_shufflevector(x, y, ((I & H) ? int(L + I) : int(I + H))...);
    out = lo > hi ? lo : hi;
  }

  // v[0..count) -> v[0..count/2), halving H each round. After every round, vector j's lanes
  // hold its blocks in bit-reversed order: the caller loads block bitrev(j) into v[j].
  template <int H>
  __attribute__((always_inline)) static void rounds(M* v, int count) {
#pragma GCC unroll 16
    for (int j = 0; j < count / 2; ++j) fold<H>(v[2 * j], v[2 * j + 1], v[j], std::make_index_sequence<L>());
    if constexpr (H > 1) rounds<H / 2>(v, count / 2);
  }

  static constexpr int bit_reversed(int j) {
    int r = 0;
    for (int b = 1; b < L; b <<= 1) r = (r << 1) | ((j & b) ? 1 : 0);
    return r;
  }
};

// The max of |x|'s bits over one block of kBlock floats, into m; their min folded into `low`.
template <int kBytes, int kBlock>
__attribute__((always_inline)) inline void block_max_bits(const float* b, typename Vec<kBytes>::M& m,
                                                          typename Vec<kBytes>::M& low) {
  using M = typename Vec<kBytes>::M;
  constexpr int L = Vec<kBytes>::L;
  typename Vec<kBytes>::V ax;
  load_abs<kBytes>(b, ax);
  std::memcpy(&m, &ax, sizeof m);
  low = m < low ? m : low;
#pragma GCC unroll 8
  for (int i = L; i < kBlock; i += L) {
    load_abs<kBytes>(b + i, ax);
    M bits;
    std::memcpy(&bits, &ax, sizeof bits);
    m = bits > m ? bits : m;
    low = bits < low ? bits : low;
  }
}

// L blocks read in memory order (the prefetchers follow a plain stream), block j into
// v[bit_reversed(j)] as the tree wants them; the indices are constants, so v stays in registers.
template <int kBytes, int kBlock, size_t... J>
__attribute__((always_inline)) inline void load_block_maxes(const float* p, typename Vec<kBytes>::M* v,
                                                            typename Vec<kBytes>::M& low, std::index_sequence<J...>) {
  (block_max_bits<kBytes, kBlock>(p + J * kBlock, v[AmaxTree<kBytes>::bit_reversed(J)], low), ...);
}

// Every lane of m set to the min over its lanes: log2(L) rotations, each halving the distance.
template <int kBytes, int H, size_t... I>
__attribute__((always_inline)) inline void min_all_lanes(typename Vec<kBytes>::M& m, std::index_sequence<I...> lanes) {
  constexpr int L = Vec<kBytes>::L;
  const typename Vec<kBytes>::M r = __builtin_shufflevector(m, m, int((I + H) % L)...);
  m = r < m ? r : m;
  if constexpr (H > 1) min_all_lanes<kBytes, H / 2>(m, lanes);
}

template <int kBytes, int kBlock>
__attribute__((always_inline)) inline void amaxes_body(const float* p, int64_t nblocks, float* amax, float* low,
                                                       uint8_t* special) {
  using M = typename Vec<kBytes>::M;
  using Tree = AmaxTree<kBytes>;
  constexpr int L = Vec<kBytes>::L;
  typedef uint8_t B __attribute__((vector_size(L)));
  const M inf_bits = M{} + 0x7f800000;
  M any = M{};  // inf or NaN in some block
  int64_t k = 0;
  for (; k + L <= nblocks; k += L) {
    M v[L];
    // The smallest |x| of the L blocks: one min per vector, where each block's own would need
    // a second tree. It bounds every one of them from below, which is all the cast asks of it.
    M lows = M{} + 0x7fffffff;
    load_block_maxes<kBytes, kBlock>(p + k * kBlock, v, lows, std::make_index_sequence<L>());
    Tree::template rounds<L / 2>(v, L);
    const M odd = v[0] >= inf_bits ? M{} + 1 : M{};
    any |= odd;
    const B flags = __builtin_convertvector(odd, B);
    std::memcpy(amax + k, &v[0], sizeof v[0]);
    min_all_lanes<kBytes, L / 2>(lows, std::make_index_sequence<L>());
    std::memcpy(low + k, &lows, sizeof lows);
    std::memcpy(special + k, &flags, sizeof flags);
  }
  for (; k < nblocks; ++k) {  // the last blocks, one at a time
    M m, lows = M{} + 0x7fffffff;
    block_max_bits<kBytes, kBlock>(p + k * kBlock, m, lows);
    int32_t mx = 0;
    for (int l = 0; l < L; ++l) mx = m[l] > mx ? m[l] : mx;
    min_all_lanes<kBytes, L / 2>(lows, std::make_index_sequence<L>());
    std::memcpy(amax + k, &mx, sizeof mx);
    std::memcpy(low + k, &lows, sizeof(float));
    special[k] = mx >= 0x7f800000;
    any[0] |= special[k];
  }
  bool nonfinite = false;
  for (int l = 0; l < L; ++l) nonfinite = nonfinite || any[l] != 0;
  // A block holding a NaN has NaN bits as its max: its amax ignores the NaN, as fmaxf does.
  for (int64_t j = 0; j < nblocks && nonfinite; ++j) {
    if (amax[j] == amax[j]) continue;
    float mx = 0.0f;
    for (int i = 0; i < kBlock; ++i) {
      const float a = std::fabs(p[j * kBlock + i]);
      mx = a > mx ? a : mx;
    }
    amax[j] = mx;
  }
}

// The scales of n blocks with the float operations of block_scaling.h in the same order, so that
// the codes match bit for bit: NVFP4's E4M3 block scale by the magic-number rounding of
// fp8_round_scaled (the probe's cast, checked against CUDA's), its code read back from the
// rounded value's bits; MXFP8's E8M0 exponent from the amax's bits. Written as one branch-free
// loop per rule over plain arrays, which the compiler vectorises at each level (hand-written
// vector selects of vector comparisons were scalarised in the AVX-512 clone).
struct ScaleOut {
  uint8_t* code;
  float* encode;
  float* decode;
  uint8_t* path;
  const stats::Fp8ProbeParams* element;  // the cast's, for the paths
};

__attribute__((always_inline)) inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
__attribute__((always_inline)) inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <fp8::ScalingRecipe kKind, fp8::MxScaleRule kRule>
__attribute__((always_inline)) inline void scales_body(const float* __restrict amax, const float* __restrict low,
                                                       const uint8_t* __restrict special, int64_t n,
                                                       const ScaleRule& rule, const ScaleOut& out, ScaleTally& tally) {
  static const stats::Fp8ProbeParams e4m3_params = element_format(fp8::Format::E4M3);  // two searches: once
  // Locals and restrict pointers: the loop reads nothing its stores could change, which the
  // compiler could otherwise only check at run time, for more pointers than it will check.
  const stats::Fp8ProbeParams e4m3 = e4m3_params;
  uint8_t* __restrict out_code = out.code;
  float* __restrict out_encode = out.encode;
  float* __restrict out_decode = out.decode;
  uint8_t* __restrict out_path = out.path;
  const stats::Fp8ProbeParams element = *out.element;
  const float nv_factor = rule.tensor_scale * (1.0f / fp8::kE2M1Max);
  const float tensor_decode = static_cast<float>(1.0 / static_cast<double>(rule.tensor_scale));
  const float mx_rcp = rule.element == fp8::Format::E4M3 ? static_cast<float>(1.0 / 448.0) : static_cast<float>(1.0 / 57344.0);
  const uint32_t ocp_bias = 127u + (rule.element == fp8::Format::E4M3 ? 8u : 15u);  // + emax of the element
  const float fb_max = fp8::max_value(rule.element);
  const uint32_t fb_mask = rule.pow2 ? 0xFF800000u : 0xFFFFFFFFu;  // pow2: the mantissa cleared
  const float fb_epsilon = rule.epsilon;
  uint32_t zero = 0, saturated = 0, clamped = 0, clamped_zero = 0, nonfinite = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float a = amax[k];
    uint32_t code;
    float enc, dec;
    uint32_t sat = 0, small;  // 0 or 1: ints, as bool vectors do not convert at every level
    if constexpr (kKind == fp8::ScalingRecipe::NVFP4) {
      const float wanted = a * nv_factor;
      const float w = wanted < FLT_MAX ? wanted : FLT_MAX;
      float magic = float_of((bits_of(w) & 0x7f800000u) + e4m3.magic_offset);
      magic = magic > e4m3.magic_floor ? magic : e4m3.magic_floor;
      const float q0 = (w + magic) - magic;
      const float q = q0 < e4m3.max ? q0 : e4m3.max;  // NaN (too large for its magic): max
      const uint32_t qb = bits_of(q);
      // Normal: exponent (bias 7) and 3 mantissa bits; subnormal: q = code * 2^-9.
      code = qb >= 0x3C800000u ? (qb >> 20) - 960u : static_cast<uint32_t>(static_cast<int32_t>(q * 512.0f));
      sat = wanted > e4m3.overflow_above;
      dec = q * tensor_decode;
      const float inverse = 1.0f / dec;
      enc = inverse < FLT_MAX ? inverse : FLT_MAX;
      small = q == 0.0f;
    } else if constexpr (kKind == fp8::ScalingRecipe::Float8Block) {
      // TransformerEngine's compute_scale_from_amax: 1 for a zero or infinite amax, FLT_MAX where
      // the division overflows.
      const float am = a < fb_epsilon ? fb_epsilon : a;
      const float q = fb_max / am;
      const uint32_t usable = (am != 0.0f) & (am <= FLT_MAX);
      sat = usable & (q > FLT_MAX);
      float scale = q > FLT_MAX ? FLT_MAX : q;
      scale = usable ? scale : 1.0f;
      enc = float_of(bits_of(scale) & fb_mask);
      dec = 1.0f / enc;
      code = bits_of(dec) >> 23;
      small = 0;
    } else if constexpr (kRule == fp8::MxScaleRule::RoundUp) {
      const uint32_t x = bits_of(a * mx_rcp);
      // Up to the next power of two when a mantissa bit is set (e8m0_encode's rule).
      uint32_t e = (x >> 23) + (((x & 0x7FFFFFu) != 0u) & (x > 0x00400000u) & (x < 0x7f800000u));
      // Arithmetic in place of comparisons of e: the compiler threads a select on e through the
      // rest of the body, and the sums it leaves conditional do not vectorise.
      e -= (e + 1u) >> 8;  // 0xFF saturates to 0xFE (e <= 0xFF)
      const uint32_t is_min = (e - 1u) >> 31;  // e == 0
      code = e;
      enc = float_of((254u - e - 127u * is_min) << 23);  // 2^(127 - e), 1 for code 0
      dec = float_of((e << 23) | (is_min << 22));         // 2^(e - 127), the subnormal 2^-127 for code 0
      sat = ((e ^ 0xFEu) - 1u) >> 31;                      // e == 0xFE
      small = is_min;
    } else {
      // OCP: floor(log2(amax)) - emax, clamped at 2^-127; a block with inf or NaN is lost.
      const int32_t shared = static_cast<int32_t>(bits_of(a) >> 23) - static_cast<int32_t>(ocp_bias);
      small = shared < -127;
      const uint32_t e = static_cast<uint32_t>(small ? 0 : shared + 127);
      const uint32_t lost = (special[k] != 0) | (a > FLT_MAX);
      code = lost ? fp8::kE8M0NaN : e;
      enc = lost ? 0.0f : float_of((254u - e) << 23);  // 2^(127 - code), 2^127 for code 0
      dec = float_of(lost ? fp8::detail::kFloatCanonicalNaN : (e << 23) | (((e - 1u) >> 31) << 22));  // 2^-127 for code 0
      small = small & (1u - lost);
    }
    out_code[k] = static_cast<uint8_t>(code);
    out_encode[k] = enc;
    out_decode[k] = dec;
    const uint32_t is_zero = a == 0.0f;
    zero += is_zero;
    saturated += sat;
    // Clamped at the smallest scale with something to scale: counted as all clamped blocks less
    // the zero ones, two plain sums (a conditional one does not vectorise).
    clamped += small;
    clamped_zero += small & is_zero;
    nonfinite += special[k];
    out_path[k] = static_cast<uint8_t>(block_path(a, low[k], special[k] != 0, enc, dec, element));
  }
  tally.zero += zero;
  tally.saturated += saturated;
  tally.at_min += clamped - clamped_zero;
  tally.nonfinite += nonfinite;
}

template <fp8::ScalingRecipe kKind, fp8::MxScaleRule kRule>
__attribute__((always_inline)) inline void scales_for(const float* amax, const float* low, const uint8_t* special,
                                                      int64_t n, const ScaleRule& rule, const ScaleOut& out,
                                                      ScaleTally& tally) {
  // Blocks of 2^20 at a time: the tallies' 32-bit lanes never overflow.
  for (int64_t k = 0; k < n; k += int64_t{1} << 20) {
    const int64_t len = std::min(n - k, int64_t{1} << 20);
    scales_body<kKind, kRule>(amax + k, low + k, special + k, len, rule,
                              ScaleOut{out.code + k, out.encode + k, out.decode + k, out.path + k, out.element}, tally);
  }
}

__attribute__((always_inline)) inline void scales_any(const float* amax, const float* low, const uint8_t* special,
                                                      int64_t n, const ScaleRule& rule, const ScaleOut& out,
                                                      ScaleTally& tally) {
  using fp8::MxScaleRule;
  using fp8::ScalingRecipe;
  if (rule.kind == ScalingRecipe::NVFP4) return scales_for<ScalingRecipe::NVFP4, MxScaleRule::RoundUp>(amax, low, special, n, rule, out, tally);
  if (rule.kind == ScalingRecipe::Float8Block) {
    return scales_for<ScalingRecipe::Float8Block, MxScaleRule::RoundUp>(amax, low, special, n, rule, out, tally);
  }
  if (rule.rule == MxScaleRule::RoundUp) return scales_for<ScalingRecipe::MXFP8, MxScaleRule::RoundUp>(amax, low, special, n, rule, out, tally);
  scales_for<ScalingRecipe::MXFP8, MxScaleRule::OcpFloor>(amax, low, special, n, rule, out, tally);
}

// One variant per level and block size, each the same body in its instruction set and its
// register width.
template <int kBlock>
SENTINEL_ISA_V4 void amaxes_v4(const float* p, int64_t n, float* a, float* lo,
                                                                   uint8_t* s) {
  amaxes_body<64, kBlock>(p, n, a, lo, s);
}
template <int kBlock>
SENTINEL_ISA_V3 void amaxes_v3(const float* p, int64_t n, float* a, float* lo,
                                                                   uint8_t* s) {
  amaxes_body<32, kBlock>(p, n, a, lo, s);
}
template <int kBlock>
__attribute__((noinline)) void amaxes_baseline(const float* p, int64_t n, float* a, float* lo, uint8_t* s) {
  amaxes_body<16, kBlock>(p, n, a, lo, s);
}

SENTINEL_ISA_V4 void scales_v4(const float* a, const float* lo, const uint8_t* s,
                                                                   int64_t n, const ScaleRule& r, const ScaleOut& o,
                                                                   ScaleTally& t) {
  scales_any(a, lo, s, n, r, o, t);
}
SENTINEL_ISA_V3 void scales_v3(const float* a, const float* lo, const uint8_t* s,
                                                                   int64_t n, const ScaleRule& r, const ScaleOut& o,
                                                                   ScaleTally& t) {
  scales_any(a, lo, s, n, r, o, t);
}
__attribute__((noinline)) void scales_baseline(const float* a, const float* lo, const uint8_t* s, int64_t n,
                                               const ScaleRule& r, const ScaleOut& o, ScaleTally& t) {
  scales_any(a, lo, s, n, r, o, t);
}

template <int kBlock>
void block_amaxes_of(const float* p, int64_t nblocks, float* amax, float* low, uint8_t* special) {
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return amaxes_v4<kBlock>(p, nblocks, amax, low, special);
    case stats::SimdLevel::V3: return amaxes_v3<kBlock>(p, nblocks, amax, low, special);
    case stats::SimdLevel::Baseline: break;
  }
  amaxes_baseline<kBlock>(p, nblocks, amax, low, special);
}

}  // namespace

void block_amaxes(const float* p, int64_t nblocks, int block, float* amax, float* low, uint8_t* special) {
  if (block == 16) return block_amaxes_of<16>(p, nblocks, amax, low, special);
  block_amaxes_of<32>(p, nblocks, amax, low, special);
}

void block_scales(const float* amax, const float* low, const uint8_t* special, int64_t n, const ScaleRule& rule,
                  const stats::Fp8ProbeParams& element, uint8_t* code, float* encode, float* decode, uint8_t* path,
                  ScaleTally& tally) {
  const ScaleOut out{code, encode, decode, path, &element};
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return scales_v4(amax, low, special, n, rule, out, tally);
    case stats::SimdLevel::V3: return scales_v3(amax, low, special, n, rule, out, tally);
    case stats::SimdLevel::Baseline: break;
  }
  scales_baseline(amax, low, special, n, rule, out, tally);
}

}  // namespace recipes
}  // namespace sentinel

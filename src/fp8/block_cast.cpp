// The cast pass of the block recipes (block_kernels.h): every element of a buffer of whole blocks
// with its block's factors, in vector lanes, compiled once per SIMD level. A group of blocks in
// which nothing can saturate (block_path) takes a loop without the overflow count and the
// saturation; one in which nothing can flush to zero or be zero either, a loop without any count:
// up to a third fewer operations per vector.
#include <cstring>
#include <type_traits>

#include "fp8/block_kernels.h"
#include "fp8/block_lanes.h"
#include "fp8/fp8_round_lanes.h"
#include "stats/isa.h"
#include "stats/simd_level.h"

namespace sentinel {
namespace recipes {
namespace {

// The cast's float sums over a few vectors: two sets, filled alternately, so that consecutive
// vectors do not wait on each other's additions. In a group of quiet blocks (nothing saturates,
// flushes or is zero) the sum of x_hat^2 is not kept but derived, in double, as se - xx + 2 xq:
// there every x_hat is at least two thirds of its x (the worst is the smallest subnormal, taken
// from just under 1.5 times it), so x_hat^2 sums to at least 4/9 of x^2's and the derivation
// loses about a bit of the group's float sums. Where values flush or saturate, x_hat^2 can sum
// to a vanishing fraction of x^2's (a 2-D tile's row far below its max), and the sum is kept.
template <int kBytes>
struct CastSums {
  using V = typename Vec<kBytes>::V;
  V se = V{}, xq = V{}, xx = V{}, qq = V{};
};

// kPowerOfTwo: every block that is not cast exactly has encode = 2^k and decode = 2^-k, both
// normal (MXFP8's E8M0 scales: block_path sends the blocks whose scale is zero, lost, or as
// small as 2^-127 to the exact cast, as their amax is below kSmallForFloatSums). Scaling by
// 2^k then commutes with every step of the cast - the product, the magic-number rounding, the
// comparisons (a product below float's normal range flushes either way) - so the loops cast |x|
// itself against thresholds scaled by 2^-k, once per block, and x_hat = q * decode is the
// rounded value: two multiplies fewer per vector, the same bits.
template <int kBytes, int kBlock, bool kPowerOfTwo>
__attribute__((always_inline)) inline void cast_body(const float* p, int64_t nblocks, const float* encode,
                                                     const float* decode, const uint8_t* path,
                                                     const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  using V = typename Vec<kBytes>::V;
  using M = typename Vec<kBytes>::M;
  using U = typename Vec<kBytes>::U;
  using D = typename Vec<kBytes>::D;
  constexpr int L = Vec<kBytes>::L;
  constexpr int kVectors = kBlock / L;         // per block
  constexpr int kStep = kVectors >= 2 ? 1 : 2;  // blocks per step: at least two vectors
  constexpr int kGroup = 512 / kBlock;          // blocks summed in float lanes, then widened
  static_assert(kBlock % L == 0 && kGroup % 8 == 0, "whole vectors per block, paths read 8 at a time");
  const V vmax = V{} + e.max, vfloor = V{} + e.magic_floor, zero = V{};
  const V vover = V{} + e.overflow_above, vbelow = V{} + e.underflow_below;
  const U exp_mask = U{} + 0x7f800000u, offset = U{} + e.magic_offset;
  // Counts by thresholds on the scaled value (rounding is monotonic in it), one plain comparison
  // each: masks combined with & or ~ make the compiler scalarise the AVX-512 clone.
  M over = M{}, below = M{}, zeros = M{};
  CastSums<kBytes> sums[2];
  D se = D{}, xq = D{}, xx = D{}, qq = D{};
  // A threshold of the scaled value, as the loops compare |x| with it (vdec: the block's decode).
  auto scaled = [&](const V& threshold, const V& vdec, V& out) __attribute__((always_inline)) {
    if constexpr (kPowerOfTwo) {
      out = threshold * vdec;
    } else {
      out = threshold;
    }
  };
  auto add_sums = [&](const V& ax, const V& xh, CastSums<kBytes>& s, auto keep_qq) __attribute__((always_inline)) {
    const V err = ax - xh;
    s.se += err * err;
    s.xq += ax * xh;
    s.xx += ax * ax;
    if constexpr (decltype(keep_qq)::value) s.qq += xh * xh;
  };
  // |x|, the value compared with the thresholds (its scaled value, or |x| itself with scaled
  // thresholds), and that value rounded to the grid before saturation.
  auto round_vector = [&](const float* x, const V& venc, const V& vdec, V& ax, V& a, V& q0)
                          __attribute__((always_inline)) {
    load_abs<kBytes>(x, ax);
    if constexpr (kPowerOfTwo) {
      a = ax;
    } else {
      a = ax * venc;
      keep_rounded(a);
    }
    V floor;
    scaled(vfloor, vdec, floor);
    stats::fp8_round_lanes(a, exp_mask, offset, floor, q0);
  };
  auto add_cast = [&](const V& ax, const V& q, const V& vdec, CastSums<kBytes>& s, auto keep_qq)
                      __attribute__((always_inline)) {
    if constexpr (kPowerOfTwo) {
      add_sums(ax, q, s, keep_qq);  // q is x_hat
    } else {
      add_sums(ax, q * vdec, s, keep_qq);
    }
  };
  auto count_flushes = [&](const V& a, const V& ax, const V& vdec) __attribute__((always_inline)) {
    V threshold;
    scaled(vbelow, vdec, threshold);
    if constexpr (kBytes == 64) {  // AVX-512: an add under the comparison's mask
      below = a < threshold ? below + 1 : below;
      zeros = ax == zero ? zeros + 1 : zeros;
    } else {  // a comparison is a vector of -1s
      below -= a < threshold;
      zeros -= ax == zero;
    }
  };
  auto counted_vector = [&](const float* x, const V& venc, const V& vdec, CastSums<kBytes>& s)
                            __attribute__((always_inline)) {
    V ax, a, q0, over_above, max;
    round_vector(x, venc, vdec, ax, a, q0);
    scaled(vover, vdec, over_above);
    if constexpr (kBytes == 64) {
      over = a > over_above ? over + 1 : over;
    } else {
      over -= a > over_above;
    }
    count_flushes(a, ax, vdec);
    scaled(vmax, vdec, max);
    const V q = q0 < max ? q0 : max;  // NaN (a value too large for its magic): max
    add_cast(ax, q, vdec, s, std::true_type{});
  };
  // No element can saturate: every a <= overflow_above, so q0 <= max and `over` would not move.
  auto flushing_vector = [&](const float* x, const V& venc, const V& vdec, CastSums<kBytes>& s)
                             __attribute__((always_inline)) {
    V ax, a, q;
    round_vector(x, venc, vdec, ax, a, q);
    count_flushes(a, ax, vdec);
    add_cast(ax, q, vdec, s, std::true_type{});
  };
  // Nothing can saturate or flush to zero, and nothing is zero: no count would move.
  auto quiet_vector = [&](const float* x, const V& venc, const V& vdec, CastSums<kBytes>& s)
                          __attribute__((always_inline)) {
    V ax, a, q;
    round_vector(x, venc, vdec, ax, a, q);
    add_cast(ax, q, vdec, s, std::false_type{});
  };
  // kStep blocks from block k, their vectors alternating between the two sets; the next buffer's
  // lines are fetched meanwhile, so that its amax pass reads from L1.
  auto cast_step = [&](int64_t k, auto& cast_vector) __attribute__((always_inline)) {
#pragma GCC unroll 2
    for (int j = 0; j < kStep; ++j) {
      const V venc = encode[k + j] - V{}, vdec = decode[k + j] - V{};  // x - 0 is x, even -0
#pragma GCC unroll 2
      for (int i = 0; i < kBlock; i += 16) __builtin_prefetch(p + (nblocks + k + j) * kBlock + i, 0, 3);
#pragma GCC unroll 8
      for (int i = 0; i < kVectors; ++i) cast_vector(p + (k + j) * kBlock + i * L, venc, vdec, sums[(j * kVectors + i) & 1]);
    }
  };
  auto cast_one = [&](int64_t k) {  // one block: in a group that holds exact ones, or the last
    const V venc = encode[k] - V{}, vdec = decode[k] - V{};
    for (int i = 0; i < kVectors; ++i) counted_vector(p + k * kBlock + i * L, venc, vdec, sums[i & 1]);
  };
  // kept: x_hat^2 was summed (every group but a quiet one); otherwise it is derived.
  auto widen = [&](bool kept) {
    const D g_se = __builtin_convertvector(sums[0].se + sums[1].se, D);
    const D g_xq = __builtin_convertvector(sums[0].xq + sums[1].xq, D);
    const D g_xx = __builtin_convertvector(sums[0].xx + sums[1].xx, D);
    se += g_se;
    xq += g_xq;
    xx += g_xx;
    qq += kept ? __builtin_convertvector(sums[0].qq + sums[1].qq, D) : g_se - g_xx + 2 * g_xq;
    sums[0] = sums[1] = CastSums<kBytes>{};
  };
  int64_t k = 0;
  for (; k + kGroup <= nblocks; k += kGroup) {
    uint64_t paths = 0;
    for (int g = 0; g < kGroup; g += 8) {
      uint64_t w;
      std::memcpy(&w, path + k + g, sizeof w);
      paths |= w;
    }
    if (paths == 0) {
      for (int g = 0; g < kGroup; g += kStep) cast_step(k + g, quiet_vector);
    } else if ((paths & in_word(kExactCast | kMaySaturate)) == 0) {
      for (int g = 0; g < kGroup; g += kStep) cast_step(k + g, flushing_vector);
    } else if ((paths & in_word(kExactCast)) == 0) {
      for (int g = 0; g < kGroup; g += kStep) cast_step(k + g, counted_vector);
    } else {
      for (int g = 0; g < kGroup; ++g) {
        if (!(path[k + g] & kExactCast)) cast_one(k + g);
      }
    }
    widen(paths != 0);
  }
  for (; k < nblocks; ++k) {
    if (!(path[k] & kExactCast)) cast_one(k);
  }
  widen(true);
  for (int l = 0; l < L; ++l) {
    out.sum_sq_error += se[l];
    out.sum_x_q += xq[l];
    out.sum_x_sq += xx[l];
    out.sum_q_sq += qq[l];
    out.overflow += static_cast<uint32_t>(over[l]);
    out.underflow += static_cast<uint32_t>(below[l] - zeros[l]);  // below counts the zeros too
  }
}

// One variant per level, block size and kind of scale, each the same body in its instruction set
// and its register width.
template <int kBlock, bool kPow2>
SENTINEL_ISA_V4 void cast_v4(const float* p, int64_t n, const float* enc,
                                                                 const float* dec, const uint8_t* path,
                                                                 const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<64, kBlock, kPow2>(p, n, enc, dec, path, e, out);
}
template <int kBlock, bool kPow2>
SENTINEL_ISA_V3 void cast_v3(const float* p, int64_t n, const float* enc,
                                                                 const float* dec, const uint8_t* path,
                                                                 const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<32, kBlock, kPow2>(p, n, enc, dec, path, e, out);
}
template <int kBlock, bool kPow2>
__attribute__((noinline)) void cast_baseline(const float* p, int64_t n, const float* enc, const float* dec,
                                             const uint8_t* path, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<16, kBlock, kPow2>(p, n, enc, dec, path, e, out);
}

template <int kBlock, bool kPow2>
void cast_blocks_of(const float* p, int64_t nblocks, const float* encode, const float* decode, const uint8_t* path,
                    const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return cast_v4<kBlock, kPow2>(p, nblocks, encode, decode, path, e, out);
    case stats::SimdLevel::V3: return cast_v3<kBlock, kPow2>(p, nblocks, encode, decode, path, e, out);
    case stats::SimdLevel::Baseline: break;
  }
  cast_baseline<kBlock, kPow2>(p, nblocks, encode, decode, path, e, out);
}

}  // namespace

void cast_blocks(const float* p, int64_t nblocks, int block, bool power_of_two_scales, const float* encode,
                 const float* decode, const uint8_t* path, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  if (block == 16) {
    if (power_of_two_scales) return cast_blocks_of<16, true>(p, nblocks, encode, decode, path, e, out);
    return cast_blocks_of<16, false>(p, nblocks, encode, decode, path, e, out);
  }
  if (power_of_two_scales) return cast_blocks_of<32, true>(p, nblocks, encode, decode, path, e, out);
  cast_blocks_of<32, false>(p, nblocks, encode, decode, path, e, out);
}

}  // namespace recipes
}  // namespace sentinel

// The cast pass of the block recipes (block_kernels.h): every element of a buffer of whole blocks
// with its block's factors, in vector lanes, compiled once per SIMD level. A group of blocks in
// which nothing can saturate (block_path) takes a loop without the overflow count and the
// saturation; one in which nothing can flush to zero or be zero either, a loop without any count:
// up to a third fewer operations per vector.
#include <cstring>

#include "recipes/block_kernels.h"
#include "recipes/block_lanes.h"
#include "stats/fp8_round_lanes.h"
#include "stats/simd_level.h"

namespace sentinel {
namespace recipes {
namespace {

// The cast's float sums over a few vectors: two sets, filled alternately, so that consecutive
// vectors do not wait on each other's additions.
template <int kBytes>
struct CastSums {
  using V = typename Vec<kBytes>::V;
  V se = V{}, xq = V{}, xx = V{}, qq = V{};
};

template <int kBytes, int kBlock>
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
  auto add_sums = [&](const V& ax, const V& xh, CastSums<kBytes>& s) __attribute__((always_inline)) {
    const V err = ax - xh;
    s.se += err * err;
    s.xq += ax * xh;
    s.xx += ax * ax;
    s.qq += xh * xh;
  };
  // |x|, its scaled value a, and a rounded to the grid before saturation.
  auto round_vector = [&](const float* x, const V& venc, V& ax, V& a, V& q0) __attribute__((always_inline)) {
    load_abs<kBytes>(x, ax);
    a = ax * venc;
    keep_rounded(a);
    stats::fp8_round_lanes(a, exp_mask, offset, vfloor, q0);
  };
  auto count_flushes = [&](const V& a, const V& ax) __attribute__((always_inline)) {
    if constexpr (kBytes == 64) {  // AVX-512: an add under the comparison's mask
      below = a < vbelow ? below + 1 : below;
      zeros = ax == zero ? zeros + 1 : zeros;
    } else {  // a comparison is a vector of -1s
      below -= a < vbelow;
      zeros -= ax == zero;
    }
  };
  auto counted_vector = [&](const float* x, const V& venc, const V& vdec, CastSums<kBytes>& s)
                            __attribute__((always_inline)) {
    V ax, a, q0;
    round_vector(x, venc, ax, a, q0);
    if constexpr (kBytes == 64) {
      over = a > vover ? over + 1 : over;
    } else {
      over -= a > vover;
    }
    count_flushes(a, ax);
    const V q = q0 < vmax ? q0 : vmax;  // NaN (a value too large for its magic): max
    add_sums(ax, q * vdec, s);
  };
  // No element can saturate: every a <= overflow_above, so q0 <= max and `over` would not move.
  auto flushing_vector = [&](const float* x, const V& venc, const V& vdec, CastSums<kBytes>& s)
                             __attribute__((always_inline)) {
    V ax, a, q;
    round_vector(x, venc, ax, a, q);
    count_flushes(a, ax);
    add_sums(ax, q * vdec, s);
  };
  // Nothing can saturate or flush to zero, and nothing is zero: no count would move.
  auto quiet_vector = [&](const float* x, const V& venc, const V& vdec, CastSums<kBytes>& s)
                          __attribute__((always_inline)) {
    V ax, a, q;
    round_vector(x, venc, ax, a, q);
    add_sums(ax, q * vdec, s);
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
  auto widen = [&]() {
    se += __builtin_convertvector(sums[0].se + sums[1].se, D);
    xq += __builtin_convertvector(sums[0].xq + sums[1].xq, D);
    xx += __builtin_convertvector(sums[0].xx + sums[1].xx, D);
    qq += __builtin_convertvector(sums[0].qq + sums[1].qq, D);
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
    widen();
  }
  for (; k < nblocks; ++k) {
    if (!(path[k] & kExactCast)) cast_one(k);
  }
  widen();
  for (int l = 0; l < L; ++l) {
    out.sum_sq_error += se[l];
    out.sum_x_q += xq[l];
    out.sum_x_sq += xx[l];
    out.sum_q_sq += qq[l];
    out.overflow += static_cast<uint32_t>(over[l]);
    out.underflow += static_cast<uint32_t>(below[l] - zeros[l]);  // below counts the zeros too
  }
}

// One variant per level and block size, each the same body in its instruction set and its
// register width.
template <int kBlock>
__attribute__((target("arch=x86-64-v4"), noinline)) void cast_v4(const float* p, int64_t n, const float* enc,
                                                                 const float* dec, const uint8_t* path,
                                                                 const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<64, kBlock>(p, n, enc, dec, path, e, out);
}
template <int kBlock>
__attribute__((target("arch=x86-64-v3"), noinline)) void cast_v3(const float* p, int64_t n, const float* enc,
                                                                 const float* dec, const uint8_t* path,
                                                                 const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<32, kBlock>(p, n, enc, dec, path, e, out);
}
template <int kBlock>
__attribute__((noinline)) void cast_baseline(const float* p, int64_t n, const float* enc, const float* dec,
                                             const uint8_t* path, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<16, kBlock>(p, n, enc, dec, path, e, out);
}

template <int kBlock>
void cast_blocks_of(const float* p, int64_t nblocks, const float* encode, const float* decode, const uint8_t* path,
                    const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return cast_v4<kBlock>(p, nblocks, encode, decode, path, e, out);
    case stats::SimdLevel::V3: return cast_v3<kBlock>(p, nblocks, encode, decode, path, e, out);
    case stats::SimdLevel::Baseline: break;
  }
  cast_baseline<kBlock>(p, nblocks, encode, decode, path, e, out);
}

}  // namespace

void cast_blocks(const float* p, int64_t nblocks, int block, const float* encode, const float* decode,
                 const uint8_t* path, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  if (block == 16) return cast_blocks_of<16>(p, nblocks, encode, decode, path, e, out);
  cast_blocks_of<32>(p, nblocks, encode, decode, path, e, out);
}

}  // namespace recipes
}  // namespace sentinel

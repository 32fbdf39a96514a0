#include "recipes/block_kernels.h"

#include <sentinel/microscaling.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "stats/simd_level.h"

namespace sentinel {
namespace recipes {

stats::Fp8ProbeParams element_format(fp8::Format f) { return stats::make_fp8_probe_params(1.0f, f); }

stats::Fp8ProbeParams e2m1_format() {
  return stats::make_element_params(1.0f, fp8::kE2M1Max, /*min_subnormal=*/0.5f, /*mantissa_bits=*/1);
}

float cast_scaled(float ax, float encode, const stats::Fp8ProbeParams& e, bool& overflow) {
  const float q0 = stats::fp8_round_scaled(ax * encode, e);
  overflow = !(q0 <= e.max);
  return stats::fp8_saturate(q0, e.max);  // NaN (a value too large for its magic): max
}

namespace {

template <int kBytes>
struct Vec {
  typedef float V __attribute__((vector_size(kBytes)));
  typedef int32_t M __attribute__((vector_size(kBytes)));
  typedef uint32_t U __attribute__((vector_size(kBytes)));
  static constexpr int L = kBytes / 4;
};

// |p[0..L)| into `out` (by reference: a vector returned by value would change the ABI between
// the variants).
template <int kBytes>
__attribute__((always_inline)) inline void load_abs(const float* p, typename Vec<kBytes>::V& out) {
  typename Vec<kBytes>::M m;
  std::memcpy(&m, p, sizeof m);
  m &= 0x7fffffff;
  std::memcpy(&out, &m, sizeof out);
}

// Folds the lanes in halves (a shuffle and a max or an or each), leaving lane 0 with the max of
// `mx` and the or of `odd`: a lane-by-lane loop is as many extractions as lanes.
template <int kBytes>
__attribute__((always_inline)) inline void fold_lanes(typename Vec<kBytes>::V& mx, typename Vec<kBytes>::M& odd) {
  using V = typename Vec<kBytes>::V;
  using M = typename Vec<kBytes>::M;
  auto step = [&](const V& t, const M& o) {
    mx = t > mx ? t : mx;
    odd |= o;
  };
#define SENTINEL_FOLD(...) step(__builtin_shufflevector(mx, mx, __VA_ARGS__), __builtin_shufflevector(odd, odd, __VA_ARGS__))
  if constexpr (Vec<kBytes>::L == 16) {
    SENTINEL_FOLD(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    SENTINEL_FOLD(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    SENTINEL_FOLD(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    SENTINEL_FOLD(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  } else if constexpr (Vec<kBytes>::L == 8) {
    SENTINEL_FOLD(4, 5, 6, 7, 0, 1, 2, 3);
    SENTINEL_FOLD(2, 3, 0, 1, 6, 7, 4, 5);
    SENTINEL_FOLD(1, 0, 3, 2, 5, 4, 7, 6);
  } else {
    static_assert(Vec<kBytes>::L == 4, "16, 32 or 64-byte vectors");
    SENTINEL_FOLD(2, 3, 0, 1);
    SENTINEL_FOLD(1, 0, 3, 2);
  }
#undef SENTINEL_FOLD
}

template <int kBytes>
__attribute__((always_inline)) inline void amaxes_body(const float* p, int64_t nblocks, int block, float* amax,
                                                       uint8_t* special) {
  using V = typename Vec<kBytes>::V;
  using M = typename Vec<kBytes>::M;
  constexpr int L = Vec<kBytes>::L;
  const M inf_bits = M{} + 0x7f800000;
  for (int64_t k = 0; k < nblocks; ++k) {
    const float* b = p + k * block;
    V mx = V{};
    M odd = M{};
    for (int i = 0; i < block; i += L) {
      V ax;
      load_abs<kBytes>(b + i, ax);
      mx = ax > mx ? ax : mx;  // NaN lanes compare false: ignored
      M bits;
      std::memcpy(&bits, &ax, sizeof bits);
      odd |= bits >= inf_bits;  // inf and NaN, as one integer comparison (a NaN-aware float one is scalarised)
    }
    fold_lanes<kBytes>(mx, odd);
    amax[k] = mx[0];
    special[k] = odd[0] != 0;
  }
}

template <int kBytes>
__attribute__((always_inline)) inline void cast_body(const float* p, int64_t nblocks, int block, const float* encode,
                                                     const float* decode, const uint8_t* skip,
                                                     const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  using V = typename Vec<kBytes>::V;
  using M = typename Vec<kBytes>::M;
  using U = typename Vec<kBytes>::U;
  constexpr int L = Vec<kBytes>::L;
  const V vmax = V{} + e.max, vfloor = V{} + e.magic_floor, zero = V{};
  const V vover = V{} + e.overflow_above, vbelow = V{} + e.underflow_below;
  const U exp_mask = U{} + 0x7f800000u, offset = U{} + e.magic_offset;
  // Counts by thresholds on the scaled value (rounding is monotonic in it), one plain comparison
  // each: masks combined with & or ~ make the compiler scalarise the AVX-512 clone.
  M over = M{}, below = M{}, zeros = M{};
  V se = V{}, xq = V{}, xx = V{}, qq = V{};
  int64_t in_lanes = 0;  // elements summed in the float lanes since they were last widened
  auto widen = [&]() {
    for (int l = 0; l < L; ++l) {
      out.sum_sq_error += se[l];
      out.sum_x_q += xq[l];
      out.sum_x_sq += xx[l];
      out.sum_q_sq += qq[l];
    }
    se = xq = xx = qq = V{};
    in_lanes = 0;
  };
  for (int64_t k = 0; k < nblocks; ++k) {
    if (skip[k]) continue;
    const float* b = p + k * block;
    const V venc = V{} + encode[k], vdec = V{} + decode[k];
    for (int i = 0; i < block; i += L) {
      V ax;
      load_abs<kBytes>(b + i, ax);
      const V a = ax * venc;
      U abits;
      std::memcpy(&abits, &a, sizeof abits);
      const U mbits = (abits & exp_mask) + offset;
      V magic;
      std::memcpy(&magic, &mbits, sizeof magic);
      magic = magic > vfloor ? magic : vfloor;
      const V q0 = (a + magic) - magic;
      over -= a > vover;
      below -= a < vbelow;
      zeros -= ax == zero;
      const V q = q0 < vmax ? q0 : vmax;  // NaN (a value too large for its magic): max
      const V xh = q * vdec;
      const V err = ax - xh;
      se += err * err;
      xq += ax * xh;
      xx += ax * ax;
      qq += xh * xh;
    }
    in_lanes += block;
    if (in_lanes >= 256) widen();
  }
  widen();
  for (int l = 0; l < L; ++l) {
    out.overflow += static_cast<uint32_t>(over[l]);
    out.underflow += static_cast<uint32_t>(below[l] - zeros[l]);  // below counts the zeros too
  }
}

// One variant per level, each the same body in its instruction set and its register width.
__attribute__((target("arch=x86-64-v4"), noinline)) void amaxes_v4(const float* p, int64_t n, int b, float* a, uint8_t* s) {
  amaxes_body<64>(p, n, b, a, s);
}
__attribute__((target("arch=x86-64-v3"), noinline)) void amaxes_v3(const float* p, int64_t n, int b, float* a, uint8_t* s) {
  amaxes_body<32>(p, n, b, a, s);
}
__attribute__((noinline)) void amaxes_baseline(const float* p, int64_t n, int b, float* a, uint8_t* s) {
  amaxes_body<16>(p, n, b, a, s);
}

__attribute__((target("arch=x86-64-v4"), noinline)) void cast_v4(const float* p, int64_t n, int b, const float* enc,
                                                                 const float* dec, const uint8_t* skip,
                                                                 const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<64>(p, n, b, enc, dec, skip, e, out);
}
__attribute__((target("arch=x86-64-v3"), noinline)) void cast_v3(const float* p, int64_t n, int b, const float* enc,
                                                                 const float* dec, const uint8_t* skip,
                                                                 const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<32>(p, n, b, enc, dec, skip, e, out);
}
__attribute__((noinline)) void cast_baseline(const float* p, int64_t n, int b, const float* enc, const float* dec,
                                             const uint8_t* skip, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  cast_body<16>(p, n, b, enc, dec, skip, e, out);
}

}  // namespace

void block_amaxes(const float* p, int64_t nblocks, int block, float* amax, uint8_t* special) {
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return amaxes_v4(p, nblocks, block, amax, special);
    case stats::SimdLevel::V3: return amaxes_v3(p, nblocks, block, amax, special);
    case stats::SimdLevel::Baseline: break;
  }
  amaxes_baseline(p, nblocks, block, amax, special);
}

void cast_blocks(const float* p, int64_t nblocks, int block, const float* encode, const float* decode,
                 const uint8_t* skip, const stats::Fp8ProbeParams& e, stats::Fp8ProbeResult& out) {
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return cast_v4(p, nblocks, block, encode, decode, skip, e, out);
    case stats::SimdLevel::V3: return cast_v3(p, nblocks, block, encode, decode, skip, e, out);
    case stats::SimdLevel::Baseline: break;
  }
  cast_baseline(p, nblocks, block, encode, decode, skip, e, out);
}

}  // namespace recipes
}  // namespace sentinel

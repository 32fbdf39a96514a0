#include "recipes/block_kernels.h"

#include <sentinel/microscaling.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "stats/simd_level.h"

namespace sentinel {
namespace recipes {

namespace {

// The two thresholds of a format, by binary search over float bit patterns (the cast is
// monotonic in its input): the largest scaled value that does not overflow, and the largest
// that rounds to zero.
void find_thresholds(ElementFormat& e) {
  auto last_true = [](auto&& pred) {  // pred true at 0 and monotonic: the last bits where it holds
    uint32_t lo = 0, hi = 0x7F800000u;  // pred(lo); !pred(hi) (inf overflows and is not zero)
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (pred(mid) ? lo : hi) = mid;
    }
    return fp8::detail::bits_to_float(lo);
  };
  e.overflow_above = last_true([&](uint32_t bits) {
    bool overflow = false;
    cast_scaled(fp8::detail::bits_to_float(bits), 1.0f, e, overflow);
    return !overflow;
  });
  e.zero_at_most = last_true([&](uint32_t bits) {
    bool overflow = false;
    return cast_scaled(fp8::detail::bits_to_float(bits), 1.0f, e, overflow) == 0.0f;
  });
}

}  // namespace

ElementFormat element_format(fp8::Format f) {
  ElementFormat e;
  e.max = fp8::max_value(f);
  e.magic_floor = fp8::min_subnormal(f) * 8388608.0f;  // * 2^23: the subnormal range's quantum
  e.magic_offset = static_cast<uint32_t>(23 - (f == fp8::Format::E4M3 ? 3 : 2)) << 23;
  e.name = fp8::format_name(f);
  find_thresholds(e);
  return e;
}

ElementFormat e2m1_format() {
  ElementFormat e;
  e.max = fp8::kE2M1Max;
  e.magic_floor = 0.5f * 8388608.0f;             // the quantum below 1 (subnormals) is 0.5
  e.magic_offset = static_cast<uint32_t>(23 - 1) << 23;  // one mantissa bit
  e.name = "E2M1";
  find_thresholds(e);
  return e;
}

float cast_scaled(float ax, float encode, const ElementFormat& e, bool& overflow) {
  const float a = ax * encode;
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  bits = (bits & 0x7F800000u) + e.magic_offset;
  float magic;
  std::memcpy(&magic, &bits, sizeof magic);
  magic = magic > e.magic_floor ? magic : e.magic_floor;
  const float q0 = (a + magic) - magic;
  overflow = !(q0 <= e.max);
  return q0 < e.max ? q0 : e.max;  // NaN (a value too large for its magic): max
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
                                                     const float* decode, const uint8_t* skip, const ElementFormat& e,
                                                     BlockSums& out) {
  using V = typename Vec<kBytes>::V;
  using M = typename Vec<kBytes>::M;
  using U = typename Vec<kBytes>::U;
  constexpr int L = Vec<kBytes>::L;
  const V vmax = V{} + e.max, vfloor = V{} + e.magic_floor, zero = V{};
  const V vover = V{} + e.overflow_above, vunder = V{} + e.zero_at_most;
  const U exp_mask = U{} + 0x7f800000u, offset = U{} + e.magic_offset;
  // Counts by thresholds on the scaled value (rounding is monotonic in it), one plain comparison
  // each: masks combined with & or ~ make the compiler scalarise the AVX-512 clone.
  M over = M{}, below = M{}, zeros = M{};
  V se = V{}, xq = V{}, xx = V{}, qq = V{};
  int64_t in_lanes = 0;  // elements summed in the float lanes since they were last widened
  auto widen = [&]() {
    for (int l = 0; l < L; ++l) {
      out.sum_sq_error += se[l];
      out.sum_x_xhat += xq[l];
      out.sum_x_sq += xx[l];
      out.sum_xhat_sq += qq[l];
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
      below -= a <= vunder;
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
                                                                 const ElementFormat& e, BlockSums& out) {
  cast_body<64>(p, n, b, enc, dec, skip, e, out);
}
__attribute__((target("arch=x86-64-v3"), noinline)) void cast_v3(const float* p, int64_t n, int b, const float* enc,
                                                                 const float* dec, const uint8_t* skip,
                                                                 const ElementFormat& e, BlockSums& out) {
  cast_body<32>(p, n, b, enc, dec, skip, e, out);
}
__attribute__((noinline)) void cast_baseline(const float* p, int64_t n, int b, const float* enc, const float* dec,
                                             const uint8_t* skip, const ElementFormat& e, BlockSums& out) {
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
                 const uint8_t* skip, const ElementFormat& e, BlockSums& out) {
  switch (stats::simd_level()) {
    case stats::SimdLevel::V4: return cast_v4(p, nblocks, block, encode, decode, skip, e, out);
    case stats::SimdLevel::V3: return cast_v3(p, nblocks, block, encode, decode, skip, e, out);
    case stats::SimdLevel::Baseline: break;
  }
  cast_baseline(p, nblocks, block, encode, decode, skip, e, out);
}

}  // namespace recipes
}  // namespace sentinel

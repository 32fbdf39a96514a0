#include "recipes/block_kernels.h"

#include <sentinel/microscaling.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "stats/simd_level.h"

namespace sentinel {
namespace recipes {

ElementFormat element_format(fp8::Format f) {
  ElementFormat e;
  e.max = fp8::max_value(f);
  e.magic_floor = fp8::min_subnormal(f) * 8388608.0f;  // * 2^23: the subnormal range's quantum
  e.magic_offset = static_cast<uint32_t>(23 - (f == fp8::Format::E4M3 ? 3 : 2)) << 23;
  e.name = fp8::format_name(f);
  return e;
}

ElementFormat e2m1_format() {
  ElementFormat e;
  e.max = fp8::kE2M1Max;
  e.magic_floor = 0.5f * 8388608.0f;             // the quantum below 1 (subnormals) is 0.5
  e.magic_offset = static_cast<uint32_t>(23 - 1) << 23;  // one mantissa bit
  e.name = "E2M1";
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

template <int kBytes>
__attribute__((always_inline)) inline void amaxes_body(const float* p, int64_t nblocks, int block, float* amax,
                                                       uint8_t* special) {
  using V = typename Vec<kBytes>::V;
  using M = typename Vec<kBytes>::M;
  constexpr int L = Vec<kBytes>::L;
  const V big = V{} + FLT_MAX;
  for (int64_t k = 0; k < nblocks; ++k) {
    const float* b = p + k * block;
    V mx = V{};
    M odd = M{};
    for (int i = 0; i < block; i += L) {
      V ax;
      load_abs<kBytes>(b + i, ax);
      mx = ax > mx ? ax : mx;           // NaN lanes compare false: ignored
      odd |= ~(ax <= big);              // inf and NaN
    }
    float m = 0;
    int32_t o = 0;
    for (int l = 0; l < L; ++l) {
      m = mx[l] > m ? mx[l] : m;
      o |= odd[l];
    }
    amax[k] = m;
    special[k] = o != 0;
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
  const U exp_mask = U{} + 0x7f800000u, offset = U{} + e.magic_offset;
  M over = M{}, under = M{};
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
      over -= ~(q0 <= vmax);
      const V q = q0 < vmax ? q0 : vmax;
      under -= (ax != zero) & (q == zero);
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
    out.underflow += static_cast<uint32_t>(under[l]);
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

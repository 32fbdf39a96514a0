#pragma once
// The vector types and loads shared by the block recipes' loops (block_kernels.cpp, block_cast.cpp):
// GCC vectors of a given byte width, compiled once per SIMD level. Internal.
#include <cstdint>
#include <cstring>

namespace sentinel {
namespace recipes {

template <int kBytes>
struct Vec {
  typedef float V __attribute__((vector_size(kBytes)));
  typedef int32_t M __attribute__((vector_size(kBytes)));
  typedef uint32_t U __attribute__((vector_size(kBytes)));
  typedef double D __attribute__((vector_size(2 * kBytes)));  // the lanes widened
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

// A product that feeds the rounding add must be rounded on its own, as the hardware's cast rounds
// it: these files are built with contraction on (the error sums are fused multiply-adds), and the
// empty asm keeps the compiler from fusing the product into the add.
template <typename T>
__attribute__((always_inline)) inline void keep_rounded(T& v) {
  __asm__("" : "+v"(v));
}

}  // namespace recipes
}  // namespace sentinel

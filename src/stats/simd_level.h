#pragma once
// Which instruction-set variant the statistics and FP8 loops run: each loop is compiled once per
// level (src/stats/simd_kernels.h, src/fp8/fp8_probe.cpp) and dispatched here. The CPU's best
// level is the default; tests force every level the CPU can run, so that no variant - the
// baseline above all - goes untested on a machine that would never pick it.
#include <optional>

namespace sentinel {
namespace stats {

enum class SimdLevel : int {
  Baseline = 0,  // x86-64 (SSE2); the portable variant elsewhere (NEON on aarch64)
  V3 = 1,        // x86-64-v3: AVX2, FMA
  V4 = 2,        // x86-64-v4: AVX-512
};

const char* to_string(SimdLevel level);
bool cpu_supports(SimdLevel level);
// The level the loops run at now.
SimdLevel simd_level();
// Tests: run every loop at `level` (which the CPU must support); nullopt restores the default.
// Throws sentinel::InputError for a level this CPU cannot run.
void force_simd_level_for_testing(std::optional<SimdLevel> level);

}  // namespace stats
}  // namespace sentinel

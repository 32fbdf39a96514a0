#include "stats/simd_level.h"

#include "stats/isa.h"

#include <sentinel/errors.h>

#include <atomic>
#include <string>

namespace sentinel {
namespace stats {
namespace {

SimdLevel best_level() {
#if SENTINEL_X86_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return SimdLevel::V4;
  if (__builtin_cpu_supports("x86-64-v3")) return SimdLevel::V3;
#endif
  return SimdLevel::Baseline;
}

const SimdLevel kBest = best_level();
std::atomic<int> forced{-1};

}  // namespace

const char* to_string(SimdLevel level) {
  switch (level) {
#if SENTINEL_X86_LEVELS
    case SimdLevel::Baseline: return "x86-64 baseline";
#else
    case SimdLevel::Baseline: return "portable";
#endif
    case SimdLevel::V3: return "x86-64-v3 (AVX2)";
    case SimdLevel::V4: return "x86-64-v4 (AVX-512)";
  }
  return "?";
}

bool cpu_supports(SimdLevel level) { return static_cast<int>(level) <= static_cast<int>(kBest); }

SimdLevel simd_level() {
  const int f = forced.load(std::memory_order_relaxed);
  return f < 0 ? kBest : static_cast<SimdLevel>(f);
}

void force_simd_level_for_testing(std::optional<SimdLevel> level) {
  if (level && !cpu_supports(*level)) {
    throw InputError(std::string("sentinel: this CPU cannot run ") + to_string(*level) + " code");
  }
  forced.store(level ? static_cast<int>(*level) : -1, std::memory_order_relaxed);
}

}  // namespace stats
}  // namespace sentinel

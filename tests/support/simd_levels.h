#pragma once
// Runs a check once per SIMD level this CPU can run (stats/simd_level.h), forcing each in turn,
// so that every variant of the statistics and FP8 loops is tested whatever level the CPU picks.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "stats/simd_level.h"

namespace sentinel_test {

inline std::vector<sentinel::stats::SimdLevel> runnable_simd_levels() {
  std::vector<sentinel::stats::SimdLevel> out;
  for (auto l : {sentinel::stats::SimdLevel::Baseline, sentinel::stats::SimdLevel::V3, sentinel::stats::SimdLevel::V4}) {
    if (sentinel::stats::cpu_supports(l)) out.push_back(l);
  }
  return out;
}

struct ForcedSimdLevel {
  explicit ForcedSimdLevel(sentinel::stats::SimdLevel l) { sentinel::stats::force_simd_level_for_testing(l); }
  ~ForcedSimdLevel() { sentinel::stats::force_simd_level_for_testing(std::nullopt); }
  ForcedSimdLevel(const ForcedSimdLevel&) = delete;
  ForcedSimdLevel& operator=(const ForcedSimdLevel&) = delete;
};

// Says which levels a test ran and which this CPU cannot run (an AVX2 machine cannot run the
// AVX-512 variant: it is tested on the machines that have it).
inline void say_simd_levels_run() {
  std::string ran, not_here;
  for (auto l : {sentinel::stats::SimdLevel::Baseline, sentinel::stats::SimdLevel::V3, sentinel::stats::SimdLevel::V4}) {
    std::string& to = sentinel::stats::cpu_supports(l) ? ran : not_here;
    to += (to.empty() ? "" : ", ") + std::string(sentinel::stats::to_string(l));
  }
  ::testing::Test::RecordProperty("simd_levels_run", ran);
  std::cout << "[ simd     ] ran at: " << ran << (not_here.empty() ? "" : "; not runnable on this CPU: " + not_here)
            << std::endl;
}

template <typename Body>
void at_every_simd_level(Body&& body) {
  for (auto level : runnable_simd_levels()) {
    SCOPED_TRACE(sentinel::stats::to_string(level));
    ForcedSimdLevel forced(level);
    body();
  }
  say_simd_levels_run();
}

}  // namespace sentinel_test

// Every one of the 2^32 float bit patterns, both formats, both saturation
// modes, against CUDA's __nv_cvt_float_to_fp8. Slow (about a minute per core
// pair), so ctest registers it with the label "slow".
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda_block_oracle.h"
#include "cuda_fp8_oracle.h"
#include "sentinel/microscaling.h"
#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {
namespace {

using oracle::cuda_encode;
using oracle::float_of;
using oracle::kAllModes;
using oracle::mode_name;

constexpr int kModes = 4;
constexpr uint64_t kChunk = uint64_t{1} << 22;
constexpr uint64_t kTotal = uint64_t{1} << 32;

struct Mismatch {
  uint32_t bits;
  int mode;
  uint8_t ours;
  uint8_t cuda;
};

TEST(Fp8Exhaustive, EncodeMatchesCudaOnAllFloats) {
  std::atomic<uint64_t> next_chunk{0};
  uint64_t mismatches[kModes] = {0, 0, 0, 0};
  std::mutex mutex;  // guards mismatches and first
  std::vector<Mismatch> first;  // a few examples to print

  auto work = [&] {
    uint64_t local[kModes] = {};
    for (;;) {
      const uint64_t begin = next_chunk.fetch_add(kChunk);
      if (begin >= kTotal) break;
      for (uint64_t i = begin; i < begin + kChunk; ++i) {
        const uint32_t b = static_cast<uint32_t>(i);
        const float x = float_of(b);
        for (int m = 0; m < kModes; ++m) {
          const uint8_t ours = encode(x, kAllModes[m].format, kAllModes[m].saturate);
          const uint8_t cuda = cuda_encode(x, kAllModes[m].format, kAllModes[m].saturate);
          if (ours != cuda) {
            if (local[m]++ < 4) {
              std::lock_guard<std::mutex> lock(mutex);
              if (first.size() < 16) first.push_back({b, m, ours, cuda});
            }
          }
        }
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (int m = 0; m < kModes; ++m) mismatches[m] += local[m];
  };

  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();

  for (const Mismatch& mm : first) {
    std::printf("  %s: bits=0x%08x x=%.9g ours=0x%02x cuda=0x%02x\n", mode_name(kAllModes[mm.mode]),
                mm.bits, static_cast<double>(float_of(mm.bits)), mm.ours, mm.cuda);
  }
  for (int m = 0; m < kModes; ++m) {
    EXPECT_EQ(mismatches[m], 0u) << mode_name(kAllModes[m]);
  }
}

// E8M0 in its four modes and E2M1, on every float: the same sweep, counted per conversion.
TEST(Fp8Exhaustive, E8M0AndE2M1MatchCudaOnAllFloats) {
  std::atomic<uint64_t> next_chunk{0};
  std::atomic<uint64_t> e8m0_mismatches{0}, e2m1_mismatches{0};
  auto work = [&] {
    uint64_t e8 = 0, e2 = 0;
    for (;;) {
      const uint64_t begin = next_chunk.fetch_add(kChunk);
      if (begin >= kTotal) break;
      for (uint64_t i = begin; i < begin + kChunk; ++i) {
        const float x = float_of(static_cast<uint32_t>(i));
        for (int mode = 0; mode < 4; ++mode) {
          e8 += e8m0_encode(x, mode & 1, mode & 2) != oracle::cuda_e8m0(x, mode & 1, mode & 2);
        }
        e2 += e2m1_encode(x) != oracle::cuda_e2m1(x);
      }
    }
    e8m0_mismatches += e8;
    e2m1_mismatches += e2;
  };
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n_threads; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  EXPECT_EQ(e8m0_mismatches.load(), 0u);
  EXPECT_EQ(e2m1_mismatches.load(), 0u);
}

}  // namespace
}  // namespace fp8
}  // namespace sentinel

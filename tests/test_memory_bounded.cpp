// Resident memory stays flat over 10,000 watched batches: the frame ring, the per-batch caches,
// the string and place tables and the FP8 history are all bounded, so a long run under the
// watchdog holds no more memory at its end than after its first thousand batches.
// Two measures: the process's resident set (what the issue of a long run is about) and the bytes
// malloc has handed out and not taken back (exact, so even a small per-batch leak shows).
#include <gtest/gtest.h>
#include <malloc.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <fstream>
#include <sstream>
#include <string>

#include "support/test_paths.h"

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // the sanitizers' allocators keep freed memory in quarantine
#else
constexpr bool kSanitized = false;
#endif

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

int64_t malloc_in_use() { return static_cast<int64_t>(mallinfo2().uordblks); }

struct Growth {
  int64_t resident = 0, in_use = 0;
};

// Runs `batch` 10,000 times and returns the growth from batch 1,000 to batch 10,000.
template <typename Batch>
Growth growth_over_ten_thousand(Batch&& batch) {
  for (int i = 0; i < 1000; ++i) batch(i);
  malloc_trim(0);
  const int64_t resident0 = resident_bytes(), in_use0 = malloc_in_use();
  for (int i = 1000; i < 10000; ++i) batch(i);
  malloc_trim(0);
  return Growth{resident_bytes() - resident0, malloc_in_use() - in_use0};
}

// A leak of 8 bytes a batch is 72 KB over the 9,000 measured batches.
constexpr int64_t kInUseSlack = 64 * 1024;
constexpr int64_t kResidentSlack = 1024 * 1024;

TEST(MemoryBounded, TenThousandWatchedTrainingStepsHoldNoMoreMemory) {
  if (kSanitized) GTEST_SKIP() << "sanitizer allocators quarantine freed memory";
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8));
  torch::optim::SGD sgd(model->parameters(), 1e-3);
  std::ostringstream out;
  // Every feature that keeps something across batches: FP8 watching with all recipes, headroom.
  using sentinel::fp8::ScalingRecipe;
  const auto options = sentinel::Options().output(out).headroom(true).fp8(sentinel::Fp8Options().enabled(true).recipes(
      {ScalingRecipe::Delayed, ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4, ScalingRecipe::Float8Block}));
  sentinel::Watchdog watch(model.ptr(), options);
  const auto x = torch::randn({16, 32});
  const Growth g = growth_over_ten_thousand([&](int) {
    auto step = watch.batch();
    sgd.zero_grad();
    model->forward(x).pow(2).mean().backward();
    sgd.step();
    step.finish();
  });
  EXPECT_EQ(watch.batch_number(), 10000);
  EXPECT_LE(static_cast<int64_t>(watch.saved_frames().size()), options.max_frames_to_save());
  EXPECT_LT(g.in_use, kInUseSlack) << "malloc'd bytes grew by " << g.in_use;
  EXPECT_LT(g.resident, kResidentSlack) << "resident memory grew by " << g.resident;
}

TEST(MemoryBounded, TenThousandTorchScriptBatchesHoldNoMoreMemory) {
  if (kSanitized) GTEST_SKIP() << "sanitizer allocators quarantine freed memory";
  auto model = torch::jit::load(sentinel_test::test_data_dir() + "/mlp_scripted.pt");
  model.eval();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(model, sentinel::Options().output(out));
  const std::vector<c10::IValue> inputs{torch::randn({4, 4})};
  const Growth g = growth_over_ten_thousand([&](int) { debug.forward(inputs); });
  EXPECT_EQ(debug.batch_number(), 10000);
  EXPECT_LT(g.in_use, kInUseSlack) << "malloc'd bytes grew by " << g.in_use;
  EXPECT_LT(g.resident, kResidentSlack) << "resident memory grew by " << g.resident;
}

}  // namespace

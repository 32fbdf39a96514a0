// Several watchdogs at once, on several threads; and detaching leaves LibTorch as it was.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/record_function.h>
#include <sentinel/sentinel.h>

#include <atomic>
#include <sstream>
#include <thread>

#include "support/test_models.h"

namespace {

using namespace sentinel_test;

TEST(Threads, TwoWatchedModelsRunAtOnceAndEachReportsOnlyItsOwn) {
  struct Result {
    int64_t tripped_batch = -1;
    std::string trigger_path;
    int64_t batches = 0;
    std::string output;
  };
  auto run = [](bool overflow_at_5, Result& result) {
    torch::manual_seed(overflow_at_5 ? 1 : 2);
    TwoBlocks model;
    std::ostringstream out;
    sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
    for (int i = 0; i < 20; ++i) {
      const double scale = (overflow_at_5 && i == 5) ? 5000.0 : 0.5;
      try {
        debug.forward(small_input(8, 4, scale));
      } catch (const sentinel::NonFiniteError& e) {
        result.tripped_batch = e.report().batch_number;
        result.trigger_path = e.report().trigger().module_path;
      }
    }
    result.batches = debug.batch_number();
    result.output = out.str();
  };
  Result a, b;
  std::thread ta(run, true, std::ref(a));
  std::thread tb(run, false, std::ref(b));
  ta.join();
  tb.join();
  EXPECT_EQ(a.tripped_batch, 5);
  EXPECT_EQ(a.trigger_path, "encoder.0");
  EXPECT_EQ(a.batches, 20);
  EXPECT_EQ(b.tripped_batch, -1);
  EXPECT_EQ(b.batches, 20);
  EXPECT_EQ(b.output, "");
}

TEST(Detach, DestroyingTheWatchdogRemovesItsCallbackAndChangesNoResult) {
  torch::manual_seed(0);
  Mlp model;
  auto x = small_input();
  const bool had_callbacks = at::hasGlobalCallbacks();
  const auto before = model->forward(x);
  {
    std::ostringstream out;
    sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
    EXPECT_TRUE(at::hasGlobalCallbacks());
    EXPECT_TRUE(torch::equal(debug.forward(x), before));
    {
      std::ostringstream out2;
      sentinel::DebugUnderflowOverflow second(model, sentinel::Options().output(out2));
      second.forward(x);
    }
    EXPECT_TRUE(at::hasGlobalCallbacks());  // the first one still watches
    EXPECT_TRUE(torch::equal(debug.forward(x), before));
  }
  EXPECT_EQ(at::hasGlobalCallbacks(), had_callbacks);
  EXPECT_TRUE(torch::equal(model->forward(x), before));
  // Gradients are unchanged too.
  auto loss = model->forward(x).sum();
  loss.backward();
  auto grad_plain = model->fc1->weight.grad().clone();
  model->zero_grad();
  {
    std::ostringstream out;
    sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
    auto step = watch.batch();
    model->forward(x).sum().backward();
    step.finish();
  }
  EXPECT_TRUE(torch::equal(model->fc1->weight.grad(), grad_plain));
}

TEST(Detach, AWatchdogDestroyedOnAnotherThreadIsNeverTouchedAgain) {
  torch::manual_seed(0);
  auto model = torch::jit::Module("M");
  model.register_parameter("w", torch::ones({2, 2}), false);
  model.define(R"(
def forward(self, x):
    return torch.matmul(x, self.w)
)");
  auto* watch = new sentinel::Watchdog(model, sentinel::Options());
  std::thread([&] { delete watch; }).join();
  EXPECT_NO_THROW(model.forward({torch::ones({2, 2})}));  // this thread's reference has expired
}

}  // namespace

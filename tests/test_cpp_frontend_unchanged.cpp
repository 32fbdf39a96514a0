// Watching a C++ model changes nothing of it: its results, bit for bit, and the ops a profiler
// sees, with and without tensor dumps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>
#include <unistd.h>

#include "support/test_models.h"

namespace {

using namespace sentinel_test;

// Watching never changes results: unwatched then watched, in this process, bit for bit.
TEST(CppFrontend, WatchedForwardEqualsUnwatchedBitForBit) {
  torch::manual_seed(0);
  TwoBlocks model;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> inputs, unwatched;
  for (int b = 0; b < 3; ++b) inputs.push_back(torch::randn({5, 4}) * (b + 1));
  for (const auto& x : inputs) unwatched.push_back(model->forward(x));
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).headroom(true));
  for (size_t b = 0; b < inputs.size(); ++b) EXPECT_TRUE(torch::equal(debug.forward(inputs[b]), unwatched[b])) << b;
}

// What a profiler sees over one training step of `model`: the model's own ops, the same watched
// as unwatched. The sentinel's own work (statistics, and the copies a tensor dump makes inside
// the op callbacks) is never recorded.
template <typename Forward, typename Backward>
std::vector<std::string> ops_a_profiler_sees(Mlp& model, const torch::Tensor& x, Forward forward, Backward backward) {
  model->zero_grad(/*set_to_none=*/true);  // each run's AccumulateGrad starts from no gradient
  static thread_local std::vector<std::string>* seen = nullptr;
  std::vector<std::string> names;
  struct Recording {
    at::CallbackHandle handle;
    ~Recording() {
      at::removeCallback(handle);
      seen = nullptr;
    }
  } recording{at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (seen) seen->emplace_back(fn.name());
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}))};
  seen = &names;
  backward(forward(x).pow(2).sum());
  return names;
}

TEST(CppFrontend, AProfilerSeesTheSameOpsWatchedAsUnwatched) {
  torch::manual_seed(0);
  Mlp model;
  const auto x = small_input();
  const auto unwatched = ops_a_profiler_sees(
      model, x, [&](const torch::Tensor& in) { return model->forward(in); }, [](const torch::Tensor& loss) { loss.backward(); });
  ASSERT_GT(unwatched.size(), 10u);

  const auto dir = std::filesystem::temp_directory_path() / ("sentinel_profiled_" + std::to_string(::getpid()));
  std::ostringstream out;
  for (bool dumps : {false, true}) {
    auto options = sentinel::Options().output(out);
    if (dumps) options.dumps(sentinel::DumpOptions().enabled(true).dir(dir.string()));
    sentinel::DebugUnderflowOverflow debug(model, options);
    const auto watched = ops_a_profiler_sees(
        model, x, [&](const torch::Tensor& in) { return debug.forward(in); }, [&](const torch::Tensor& loss) { debug.backward(loss); });
    size_t same = 0;
    while (same < watched.size() && same < unwatched.size() && watched[same] == unwatched[same]) ++same;
    EXPECT_EQ(same, unwatched.size()) << (dumps ? "with tensor dumps" : "default options") << ": op " << same << " is "
                                      << (same < watched.size() ? watched[same] : "missing") << " watched, "
                                      << (same < unwatched.size() ? unwatched[same] : "missing") << " unwatched";
    EXPECT_EQ(watched.size(), unwatched.size());
  }
  EXPECT_TRUE(std::filesystem::exists(dir / "fc1.weight.step0.pt"));  // the dumps did copy tensors
  std::filesystem::remove_all(dir);
}

}  // namespace

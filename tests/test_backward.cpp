// Gradient frames, origin in backward, parameter gradients by name, and where in the code.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <ATen/ThreadLocalState.h>

#include <sentinel/sentinel.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/demo_model.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;

// sqrt(relu(h)): finite forward (sqrt(0) = 0), but d/dh sqrt at 0 is 1/(2*0) = inf - the
// non-finite value exists only in the gradient.
struct SqrtHeadImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor h) {
    auto s = sentinel::scope(*this);
    return torch::sqrt(torch::relu(h));
  }
};
TORCH_MODULE(SqrtHead);

struct SqrtNetImpl : torch::nn::Module {
  SqrtNetImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    head = register_module("head", SqrtHead());
  }
  torch::Tensor forward(torch::Tensor x) { return head(fc(x)).sum(); }
  torch::nn::Linear fc{nullptr};
  SqrtHead head{nullptr};
};
TORCH_MODULE(SqrtNet);

TEST(Backward, InfMadeOnlyInTheGradientIsFoundAtTheNodeWithItsForwardModule) {
  torch::manual_seed(0);
  SqrtNet model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).max_frames_to_save(50));
  auto loss = debug.forward(small_input());  // relu clamps some h to exactly 0
  ASSERT_TRUE(std::isfinite(loss.item<float>()));
  try {
    debug.backward(loss);
    FAIL() << "expected NonFiniteError from the backward pass";
  } catch (const sentinel::NonFiniteError& e) {
    const auto& r = e.report();
    const auto& f = r.trigger();
    EXPECT_EQ(f.direction, sentinel::Direction::Backward);
    EXPECT_EQ(f.op, "SqrtBackward0");
    EXPECT_EQ(f.forward_op, "aten::sqrt");
    EXPECT_EQ(f.module_path, "head");
    EXPECT_EQ(f.module_class, "SqrtHead");
    EXPECT_EQ(r.batch_number, 0);  // the batch of its forward, though the batch had ended
    EXPECT_TRUE(r.produced_here) << r.origin;
    EXPECT_NE(r.origin.find("backward node SqrtBackward0 (the gradient of aten::sqrt in head"), std::string::npos)
        << r.origin;
    int64_t produced_inf = 0;
    for (const auto& en : f.entries) {
      if (en.label.rfind("output", 0) == 0) produced_inf += en.stats.pos_inf + en.stats.neg_inf;
    }
    EXPECT_GT(produced_inf, 0);
    const std::string text = e.what();
    EXPECT_NE(text.find("frames (forward and backward):"), std::string::npos);
    EXPECT_NE(text.find("                  grad of head SqrtHead aten::sqrt SqrtBackward0\n"), std::string::npos);
  }
}

TEST(Backward, ACleanStepRecordsGradientFramesAndParameterGradientsByName) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).max_frames_to_save(100));
  auto loss = debug.forward(small_input()).pow(2).sum();
  debug.backward(loss);
  bool saw_addmm_backward = false, saw_fc1_grads = false;
  for (const auto& f : debug.saved_frames()) {
    if (f.direction != sentinel::Direction::Backward) continue;
    EXPECT_EQ(f.batch_number, 0);
    if (f.op == "AddmmBackward0" && f.module_path == "fc2") {
      saw_addmm_backward = true;
      EXPECT_EQ(f.forward_op, "aten::addmm");
    }
    if (f.op == "TBackward0") {
      EXPECT_TRUE(f.module_path == "fc1" || f.module_path == "fc2") << f.module_path;  // the viewed weight's owner
      EXPECT_EQ(f.forward_op, "aten::t");
    }
    if (f.op == "AccumulateGrad" && f.module_path == "fc1") {
      ASSERT_EQ(f.entries.size(), 2u);
      EXPECT_EQ(f.entries[0].label, "weight.grad");
      EXPECT_EQ(f.entries[1].label, "bias.grad");
      EXPECT_EQ(f.entries[0].stats.count, 8 * 4);
      saw_fc1_grads = true;
    }
  }
  EXPECT_TRUE(saw_addmm_backward);
  EXPECT_TRUE(saw_fc1_grads);
}

TEST(Backward, TheGradientsMagnitudeIsKnownAsReadUntilTheyAreWritten) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  debug.backward(debug.forward(small_input()).pow(2).sum());
  std::vector<torch::Tensor> grads;
  double largest = 0.0;
  for (const auto& p : model->parameters()) {
    grads.push_back(p.grad());
    largest = std::max(largest, p.grad().abs().max().item<double>());
  }
  EXPECT_EQ(debug.read_magnitude(grads), largest);  // as torch finds it
  EXPECT_TRUE(std::isnan(debug.read_magnitude({torch::ones({3})})));  // never read
  {
    torch::NoGradGuard no_grad;
    grads[0].mul_(2);  // written since: no longer known
  }
  EXPECT_TRUE(std::isnan(debug.read_magnitude(grads)));
  EXPECT_EQ(debug.read_magnitude({grads[1]}), grads[1].abs().max().item<double>());
}

TEST(Backward, BadParameterGradientIsNamedByParameter) {
  torch::manual_seed(0);
  Mlp model;
  // A gradient hook (as clipping or averaging code might install) spoils fc2.bias's gradient.
  model->fc2->bias.register_hook([](torch::Tensor g) { return g * std::numeric_limits<float>::infinity(); });
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto loss = debug.forward(small_input()).sum();
  try {
    debug.backward(loss);
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    const auto& f = e.report().trigger();
    EXPECT_EQ(f.op, "AccumulateGrad");
    EXPECT_EQ(f.module_path, "fc2");
    bool bias_bad = false;
    for (const auto& en : f.entries) bias_bad = bias_bad || (en.label == "bias.grad" && !en.stats.finite());
    EXPECT_TRUE(bias_bad);
    EXPECT_NE(e.report().origin.find("the parameter gradients of fc2 (Linear) produced the first inf/nan (in bias.grad)"),
              std::string::npos)
        << e.report().origin;
  }
}

TEST(Backward, TrainingStepInsideABatchGuardIsOneBatch) {
  torch::manual_seed(0);
  SqrtNet model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  auto step = watch.batch();
  model->forward(small_input()).backward();
  EXPECT_THROW(step.finish(), sentinel::NonFiniteError);
  ASSERT_TRUE(watch.last_report().has_value());
  EXPECT_EQ(watch.last_report()->trigger().op, "SqrtBackward0");
}

// A user function whose signature mentions LibTorch types is still the user's code.
__attribute__((noinline)) at::Tensor run_user_step(sentinel::DebugUnderflowOverflow<Mlp>& debug, at::Tensor x) {
  return debug.forward(x);
}

TEST(WhereInTheCode, UserFunctionsTakingTensorsAreNotCollapsed) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto bad = small_input();
  bad[0][0] = std::nanf("");
  const auto stack = joined(expect_nonfinite([&] { run_user_step(debug, bad); }).stack);
  EXPECT_NE(stack.find("run_user_step("), std::string::npos) << stack;
}

TEST(WhereInTheCode, TheStackNamesTheCallersOwnFunction) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto bad = small_input();
  bad[0][0] = std::nanf("");
  const auto report = expect_nonfinite([&] { debug.forward(bad); });
  const auto stack = joined(report.stack);
  EXPECT_NE(stack.find("WhereInTheCode_TheStackNamesTheCallersOwnFunction_Test::TestBody"), std::string::npos)
      << stack;
  EXPECT_NE(stack.find("library frames]"), std::string::npos) << stack;  // LibTorch collapsed
  EXPECT_EQ(stack.find("at::_ops::"), std::string::npos) << stack;
  EXPECT_NE(sentinel::render_text(report).find("C++ call stack at detection"), std::string::npos);
}

// The stack is where the report stops: under the place rule, the line where the inf leaves the
// module that made it; strict, the line of the op that made it.
TEST(WhereInTheCode, TorchScriptModelsGiveTheScriptLine) {
  auto model = sentinel::demo::make_t5_encoder();
  std::ostringstream out;
  torch::NoGradGuard no_grad;
  auto stack_of = [&](sentinel::Options options) {
    sentinel::DebugUnderflowOverflow debug(model, options.output(out));
    return joined(expect_nonfinite([&] {
                    for (auto& b : sentinel::demo::make_batches()) debug.forward(b);
                  }).torchscript_stack);
  };
  const auto where_it_left = stack_of(sentinel::Options());
  EXPECT_NE(where_it_left.find("hidden_states + self.DenseReluDense.forward(hidden_states"), std::string::npos)
      << where_it_left;
  const auto where_it_was_made = stack_of(sentinel::Options().strict(true));
  EXPECT_NE(where_it_was_made.find("hidden_gelu * hidden_linear"), std::string::npos) << where_it_was_made;
}

TEST(Underflow, SubnormalsAreCountedAndShownWithoutBreakingHfColumns) {
  struct TinyImpl : torch::nn::Module {
    torch::Tensor forward(torch::Tensor x) { return x * 1e-39f; }  // below float32's smallest normal
  };
  auto model = std::make_shared<TinyImpl>();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).trace_batch_nums({0}));
  debug.forward(torch::ones({2, 3}));
  const auto frames = debug.saved_frames();
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].entries.back().stats.subnormal, 6);
  // HF's three columns first; the count follows as an extra column.
  EXPECT_NE(out.str().find("1.00e-39 1.00e-39 output subnormal=6\n"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("1.00e+00 1.00e+00 input[0]\n"), std::string::npos) << out.str();
}

// Watching never changes results, in training: the same seeded run unwatched and watched, in
// this process, gives the same losses and the same weights bit for bit.
TEST(Backward, WatchingATrainingRunChangesNoLossAndNoWeight) {
  auto train = [](bool watched) {
    torch::manual_seed(0);
    TwoBlocks model;
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    std::ostringstream out;
    std::unique_ptr<sentinel::Watchdog> watch;
    if (watched) watch = std::make_unique<sentinel::Watchdog>(model.ptr(), sentinel::Options().output(out));
    std::vector<torch::Tensor> results;
    for (int step = 0; step < 4; ++step) {
      optimizer.zero_grad();
      std::optional<sentinel::BatchGuard> batch;
      if (watch) batch.emplace(watch->batch());
      auto loss = model->forward(small_input(4, 4, 1.0 + step)).pow(2).mean();
      if (watch) watch->backward(loss); else loss.backward();
      if (batch) batch->finish();
      optimizer.step();
      results.push_back(loss.detach().clone());
    }
    for (const auto& p : model->parameters()) results.push_back(p.detach().clone());
    return results;
  };
  const auto unwatched = train(false);
  const auto watched = train(true);
  ASSERT_EQ(watched.size(), unwatched.size());
  for (size_t i = 0; i < watched.size(); ++i) EXPECT_TRUE(torch::equal(watched[i], unwatched[i])) << "result " << i;
}

// Leaves NaN bits in freed memory of `n` floats, unseen by the watchdog (raw writes).
void free_nan_block(int64_t n) {
  auto junk = torch::empty({n});
  std::fill_n(junk.data_ptr<float>(), n, std::numeric_limits<float>::quiet_NaN());
}

// Buffers an op leaves uninitialized (empty_like in a forward, new_empty_strided inside
// AsStridedBackward) hold whatever bits the allocator had: never read, never a trip. A NaN-filled
// block of the same size is freed first, so that the buffers most likely reuse its NaN memory.
TEST(Backward, UninitializedBuffersAreNotRead) {
  struct BufferImpl : torch::nn::Module {
    BufferImpl() { fc = register_module("fc", torch::nn::Linear(4, 256)); }
    torch::Tensor forward(torch::Tensor x) {
      auto h = fc(x);
      free_nan_block(h.numel());
      auto buffer = torch::empty_like(h);
      buffer.copy_(h);
      return buffer.as_strided({2, 128}, {256, 2}).sum();
    }
    torch::nn::Linear fc{nullptr};
  };
  torch::manual_seed(0);
  auto model = std::make_shared<BufferImpl>();
  std::ostringstream out;
  sentinel::Watchdog watch(model, sentinel::Options().output(out).max_frames_to_save(100));
  for (int step = 0; step < 3; ++step) {
    auto batch = watch.batch();
    free_nan_block(2 * 256);
    watch.backward(model->forward(small_input()));
    batch.finish();
  }
  EXPECT_FALSE(watch.last_report().has_value()) << out.str();
  bool saw_as_strided_backward = false;
  for (const auto& f : watch.saved_frames()) {
    EXPECT_NE(f.op, "aten::empty_like");
    saw_as_strided_backward = saw_as_strided_backward || f.op.rfind("AsStridedBackward", 0) == 0;
  }
  EXPECT_TRUE(saw_as_strided_backward);
}

// LibTorch runs the backward of CUDA tensors on an autograd worker thread, one per device, that
// never ran a batch: its nodes still belong to the watchdog. A backward started on a thread of its
// own stands in for it on the CPU.
TEST(Backward, NodesRunOnAThreadThatNeverRanABatchAreWatched) {
  torch::manual_seed(0);
  SqrtNet model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(50));
  torch::Tensor loss;
  {
    auto batch = watch.batch();
    loss = model->forward(small_input());
    batch.finish();
  }
  // As LibTorch's autograd runs CUDA nodes: on a worker thread of its own, under the thread-local
  // state (RecordFunction callbacks included) of the thread that called backward().
  const at::ThreadLocalState callers_state;
  std::thread([&] {
    at::ThreadLocalStateGuard as_the_caller(callers_state);
    loss.backward();
  }).join();
  const auto report = expect_nonfinite([&] { watch.check(); });
  EXPECT_EQ(report.trigger().op, "SqrtBackward0");
  EXPECT_EQ(report.trigger().module_path, "head");
}

}  // namespace

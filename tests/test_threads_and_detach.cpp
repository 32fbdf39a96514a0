// Several watchdogs at once, on several threads; reads beside ops, also across fork(); and
// detaching leaves LibTorch as it was.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/record_function.h>
#include <sentinel/sentinel.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "overlap/side_reader.h"
#include "overlap/spare_core.h"
#include "stats/tensor_stats.h"
#include "support/compute_threads.h"
#include "support/forked_child.h"
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
        // The place rule: exp's inf in encoder.0 is an error where encoder.1 reads it.
        result.trigger_path = e.report().origin_frame ? e.report().origin_frame->module_path : "";
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

// Two layers whose weights are large enough to be read on the second thread while their GEMM runs.
struct WideImpl : torch::nn::Module {
  WideImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(512, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 512));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Wide);

struct WideRun {
  std::vector<torch::Tensor> outputs;
  std::optional<sentinel::Report> report;
  sentinel::DeviceCounters counters;
};

// Six batches; before the fifth, a NaN is written into fc2's weight. One BLAS and one ATen
// thread unless said otherwise: a core is left idle wherever there are two.
WideRun run_wide(bool beside, bool watched, int blas_threads = 1) {
  ScopedComputeThreads threads(blas_threads, 1);
  torch::manual_seed(3);
  Wide model;
  std::ostringstream out;
  std::optional<sentinel::DebugUnderflowOverflow<Wide>> debug;
  if (watched) debug.emplace(model, sentinel::Options().output(out).read_inputs_beside_ops(beside));
  WideRun run;
  for (int i = 0; i < 6; ++i) {
    if (i == 4) {
      torch::NoGradGuard no_grad;
      model->fc2->weight[5][9] = std::nanf("");
    }
    const auto x = torch::randn({64, 512});
    try {
      run.outputs.push_back(watched ? debug->forward(x) : model->forward(x));
    } catch (const sentinel::NonFiniteError& e) {
      run.report = e.report();
      break;
    }
  }
  if (watched) run.counters = debug->device_counters();
  return run;
}

// Whether this machine has a second core to read on at all.
bool two_cpus() { return sentinel::overlap::core_use().cpus >= 2; }

TEST(ReadsBesideOps, FramesAndDetectionAreThoseOfReadsOnTheOpsThread) {
  if (!two_cpus()) GTEST_SKIP() << "one CPU: no core is left idle to read beside an op";
  const WideRun beside = run_wide(true, true), inline_reads = run_wide(false, true), plain = run_wide(false, false);
  EXPECT_GT(beside.counters.tensors_read_beside_ops, 0);
  EXPECT_EQ(inline_reads.counters.tensors_read_beside_ops, 0);
  ASSERT_TRUE(beside.report && inline_reads.report);
  const sentinel::Report& a = *beside.report;
  const sentinel::Report& b = *inline_reads.report;
  auto same = [](double x, double y) { return std::isnan(x) ? std::isnan(y) : x == y; };
  EXPECT_EQ(a.batch_number, 4);
  EXPECT_EQ(a.trigger().module_path, "fc2");
  EXPECT_FALSE(a.trigger().inputs_finite);
  EXPECT_EQ(a.batch_number, b.batch_number);
  ASSERT_EQ(a.frames.size(), b.frames.size());
  for (size_t i = 0; i < a.frames.size(); ++i) {
    const auto &fa = a.frames[i], &fb = b.frames[i];
    const std::string where = "frame " + std::to_string(i) + " " + fa.module_path + " " + fa.op;
    EXPECT_EQ(fa.op, fb.op) << where;
    EXPECT_EQ(fa.module_path, fb.module_path) << where;
    EXPECT_EQ(fa.inputs_finite, fb.inputs_finite) << where;
    EXPECT_EQ(fa.outputs_finite, fb.outputs_finite) << where;
    ASSERT_EQ(fa.entries.size(), fb.entries.size()) << where;
    for (size_t j = 0; j < fa.entries.size(); ++j) {
      const auto &ea = fa.entries[j].stats, &eb = fb.entries[j].stats;
      const std::string entry = where + " " + fa.entries[j].label;
      EXPECT_EQ(fa.entries[j].label, fb.entries[j].label) << entry;
      EXPECT_EQ(ea.count, eb.count) << entry;
      EXPECT_EQ(ea.nan, eb.nan) << entry;
      EXPECT_EQ(ea.zeros, eb.zeros) << entry;
      EXPECT_TRUE(same(ea.abs_min, eb.abs_min)) << entry << ": " << ea.abs_min << " vs " << eb.abs_min;
      EXPECT_TRUE(same(ea.abs_max, eb.abs_max)) << entry << ": " << ea.abs_max << " vs " << eb.abs_max;
    }
  }
  // The weight that holds the NaN is shown with it.
  bool shown = false;
  for (const auto& e : a.trigger().entries) shown = shown || (e.label == "weight" && e.stats.nan == 1);
  EXPECT_TRUE(shown);
  // Watching, with or without the second thread, changes no result.
  ASSERT_EQ(beside.outputs.size(), 4u);  // the batches before the trip
  for (size_t i = 0; i < beside.outputs.size(); ++i) EXPECT_TRUE(torch::equal(beside.outputs[i], plain.outputs[i]));
}

// With a BLAS thread on every core, a read beside a GEMM would take a core from it: every
// tensor is read on the op's thread, and the report is the same.
TEST(ReadsBesideOps, OnlyWhileTheBlasLeavesACoreIdle) {
  if (!two_cpus()) GTEST_SKIP() << "one CPU: no core is left idle to read beside an op";
  const int cpus = sentinel::overlap::core_use().cpus;
  const WideRun busy = run_wide(true, true, cpus), idle = run_wide(true, true, 1);
  EXPECT_EQ(busy.counters.tensors_read_beside_ops, 0);
  EXPECT_GT(idle.counters.tensors_read_beside_ops, 0);
  ASSERT_TRUE(busy.report && idle.report);
  EXPECT_EQ(busy.report->batch_number, 4);
  EXPECT_EQ(busy.report->trigger().module_path, idle.report->trigger().module_path);
  EXPECT_EQ(busy.report->frames.size(), idle.report->frames.size());
}

// batch_norm writes its running statistics without its schema saying so, and add_ writes its
// self: their inputs are read before them, on their own thread.
struct NormThenAddImpl : torch::nn::Module {
  NormThenAddImpl() { bn = register_module("bn", torch::nn::BatchNorm1d(256)); }
  torch::Tensor forward(const torch::Tensor& x, bool pure_op) {
    if (pure_op) return torch::relu(x);  // writes only its result: x may be read beside it
    auto y = bn(x);
    return y.add_(x);
  }
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(NormThenAdd);

TEST(ReadsBesideOps, OpsThatMayWriteTheirArgumentsAreReadOnTheirOwnThread) {
  if (!two_cpus()) GTEST_SKIP() << "one CPU: no core is left idle to read beside an op";
  torch::manual_seed(4);
  NormThenAdd model;
  std::ostringstream out;
  ScopedComputeThreads threads(1, 1);
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  const auto x = torch::randn({1024, 256});  // 1 MiB: large enough to be read beside a pure op
  debug.forward(x, false);
  EXPECT_EQ(debug.device_counters().tensors_read_beside_ops, 0);
  debug.forward(x, true);
  EXPECT_EQ(debug.device_counters().tensors_read_beside_ops, 1);
}

TEST(Detach, DestroyingTheWatchdogRemovesItsCallbackAndChangesNoResult) {
  torch::manual_seed(0);
  Mlp model;
  auto x = small_input();
  const bool had_callbacks = at::hasCallbacks();
  const auto before = model->forward(x);
  {
    std::ostringstream out;
    sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
    EXPECT_TRUE(at::hasCallbacks());
    EXPECT_TRUE(torch::equal(debug.forward(x), before));
    {
      std::ostringstream out2;
      sentinel::DebugUnderflowOverflow second(model, sentinel::Options().output(out2));
      second.forward(x);
    }
    EXPECT_TRUE(at::hasCallbacks());  // the first one still watches
    EXPECT_TRUE(torch::equal(debug.forward(x), before));
  }
  EXPECT_EQ(at::hasCallbacks(), had_callbacks);
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

// The ops a thread runs between training steps (an optimizer's, thousands a step in LibTorch's)
// make no frame: after a batch that held its backward and the gradients' check, the thread's
// callback comes off, and its next batch puts it back. A batch of a forward alone keeps it: its
// backward may follow outside it.
TEST(Detach, BetweenTrainingStepsTheThreadsOpsReachNoCallbackAndTheNextBatchWatchesAgain) {
  torch::manual_seed(0);
  Mlp model;
  const auto x = small_input();
  const bool had_callbacks = at::hasThreadLocalCallbacks();
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  {
    auto step = watch.batch();
    EXPECT_TRUE(at::hasThreadLocalCallbacks());
    watch.backward(model->forward(x).sum());
    step.finish();
  }
  EXPECT_EQ(at::hasThreadLocalCallbacks(), had_callbacks);
  torch::Tensor loss;
  {
    auto forward_only = watch.batch();
    EXPECT_TRUE(at::hasThreadLocalCallbacks());
    loss = model->forward(x).sum();
    forward_only.finish();
  }
  EXPECT_TRUE(at::hasThreadLocalCallbacks());
  loss.backward();
  {
    torch::NoGradGuard no_grad;
    model->fc2->weight[1][2] = std::numeric_limits<float>::quiet_NaN();
  }
  try {
    auto step = watch.batch();
    watch.backward(model->forward(x).sum());
    step.finish();
    FAIL() << "the NaN weight was not found after a step that took the callback off\n" << out.str();
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_EQ(e.report().trigger().direction, sentinel::Direction::Forward);
    EXPECT_EQ(e.report().trigger().module_path, "fc2");
  }
}

TEST(Detach, AWatchdogDestroyedOnAnotherThreadIsNeverTouchedAgain) {
  torch::manual_seed(0);
  auto model = torch::jit::Module("M");
  model.register_parameter("w", torch::ones({2, 2}), false);
  model.define(R"(
def forward(self, x):
    return torch.matmul(x, self.w)
)");
  const auto x = torch::ones({2, 2});
  const auto unwatched = model.forward({x}).toTensor();
  const bool had_callbacks = at::hasCallbacks();
  std::ostringstream out;
  auto* watch = new sentinel::Watchdog(model, sentinel::Options().output(out));
  EXPECT_TRUE(torch::equal(model.forward({x}).toTensor(), unwatched));  // a batch of its own
  EXPECT_EQ(watch->batch_number(), 1);
  EXPECT_TRUE(at::hasCallbacks());
  std::thread([&] { delete watch; }).join();
  // This thread's callback cannot be removed from another thread: this thread removes it itself,
  // at its next ops, and nothing reaches the destroyed watchdog meanwhile.
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(torch::equal(model.forward({x}).toTensor(), unwatched));
  EXPECT_EQ(at::hasCallbacks(), had_callbacks);
}

// A watchdog the user keeps in a thread_local (or, on the main thread, a static) object made before
// the sentinel's own state of that thread is destroyed after it, at the thread's exit.
TEST(Detach, AWatchdogOutlivingItsThreadsStateIsDestroyedWithoutTouchingIt) {
  torch::manual_seed(0);
  TwoBlocks model;
  const auto x = small_input(2, 4, 1.0);
  const auto unwatched = model->forward(x);
  const bool had_callbacks = at::hasCallbacks();
  std::ostringstream out;
  torch::Tensor watched;
  std::thread([&] {
    thread_local std::unique_ptr<sentinel::Watchdog> kept;  // made before the watchdog's thread state
    kept = std::make_unique<sentinel::Watchdog>(model.ptr(), sentinel::Options().output(out));
    auto step = kept->batch();
    watched = model->forward(x);
    step.finish();
  }).join();
  ASSERT_TRUE(watched.defined()) << out.str();
  EXPECT_TRUE(torch::equal(watched, unwatched)) << watched << unwatched << out.str();
  EXPECT_EQ(at::hasCallbacks(), had_callbacks)
      << "the watchdog's callback outlived it: global " << at::hasGlobalCallbacks() << ", this thread's "
      << at::hasThreadLocalCallbacks() << "\n" << out.str();
  const auto after = model->forward(x);
  EXPECT_TRUE(torch::equal(after, unwatched)) << after << unwatched << out.str();
}

// fork() copies only the forking thread. A child of a process whose second thread was reading,
// or was waiting for work, must still read (on its own thread) and destroy the reader without
// waiting for a thread it does not have: neither on that thread's mutex, nor on the condition
// variable it was waiting on, nor to join it.
namespace fork_check {

bool same_as_compute(const sentinel::TensorStats& s, const at::Tensor& t) {
  sentinel::TensorStats want;
  sentinel::stats::compute(t, want);
  return s.count == want.count && s.abs_min == want.abs_min && s.abs_max == want.abs_max && s.zeros == want.zeros;
}

// In the child: collects what the parent had posted (as the watchdog does, reading again what
// failed), reads once more on the child's own thread, destroys the reader, and exits with 0 only
// if every read equals the tensor's statistics.
[[noreturn]] void child(std::unique_ptr<sentinel::overlap::SideReader> reader, const void* parent_owner,
                        int parent_reads, const at::Tensor& t) {
  const int child_owner = 0;
  int good = 0;
  auto check = [&](const sentinel::overlap::SideReader::Read& r) {
    sentinel::TensorStats s = r.stats;
    if (r.failed) sentinel::stats::compute(r.tensor, s);
    good += same_as_compute(s, t);
  };
  reader->collect(parent_owner, check);
  reader->post(&child_owner, t, 0, 0);
  reader->start(&child_owner);
  reader->collect(&child_owner, check);
  reader.reset();
  _exit(good == parent_reads + 1 ? 0 : 1);
}

}  // namespace fork_check

// Forks while the second thread reads, or has just been woken to read: repeated, as which of the
// two it is at the fork is up to the scheduler.
TEST(ReadsBesideOps, AForkedChildFinishesTheReadsItsParentHadStartedAndNeverWaits) {
  const at::Tensor t = at::randn({1024, 1024});
  auto reader = std::make_unique<sentinel::overlap::SideReader>();
  const int owner = 0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < sentinel::overlap::SideReader::kMaxReads; ++i) reader->post(&owner, t, 0, i);
    reader->start(&owner);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) fork_check::child(std::move(reader), &owner, sentinel::overlap::SideReader::kMaxReads, t);
    int good = 0;
    reader->collect(&owner, [&](const sentinel::overlap::SideReader::Read& r) {
      good += !r.failed && fork_check::same_as_compute(r.stats, t);
    });
    EXPECT_EQ(good, sentinel::overlap::SideReader::kMaxReads);
    expect_child_exits_with_zero(pid, "the forked child's reads differ from the statistics of the tensor");
    if (HasFailure()) return;
  }
}

// Forks while the second thread sleeps, waiting for work: the usual state between ops.
TEST(ReadsBesideOps, AForkedChildOfAProcessWhoseReaderWaitsForWorkReadsAndDestroysIt) {
  const at::Tensor t = at::randn({1024, 1024});
  auto reader = std::make_unique<sentinel::overlap::SideReader>();
  const int owner = 0;
  reader->post(&owner, t, 0, 0);
  reader->start(&owner);
  int good = 0;
  reader->collect(&owner, [&](const sentinel::overlap::SideReader::Read& r) {
    good += fork_check::same_as_compute(r.failed ? sentinel::TensorStats{} : r.stats, t);
  });
  EXPECT_EQ(good, 1);
  // Not a timing: whether or not the thread is asleep by then, the child must work.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed";
  if (pid == 0) fork_check::child(std::move(reader), &owner, 0, t);
  expect_child_exits_with_zero(pid, "the forked child's reads differ from the statistics of the tensor");
}

}  // namespace

// The capture layer's per-op protocol and the watchdog's lifetime: tensors with nothing in memory
// to read, a read that throws inside a callback, batches of two watchdogs on one thread, a
// watchdog destroyed while other threads are inside its callbacks, roles carried as data, user
// strings that are not UTF-8, and what a destroyed watchdog still held.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sentinel/sentinel.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "core/read_faults.h"
#include "frames/frame_ring.h"
#include "support/deferred_compare.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;
namespace fs = std::filesystem;

const sentinel::Frame* find_frame(const std::vector<sentinel::Frame>& frames, const std::string& op) {
  for (const auto& f : frames) {
    if (f.op == op) return &f;
  }
  return nullptr;
}

// A zero tensor has no memory at all (its data pointer is null), a nested tensor's storage is not
// its view's elements: reading either would fault or throw inside the callback.
TEST(CaptureProtocol, TensorsWithNothingToReadAreLabelledAndTheirFramesKept) {
  Mlp model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(50));
  auto step = watch.batch();
  const auto zero = at::_efficientzerotensor({2, 4});
  const auto nested = at::_nested_tensor_from_tensor_list({torch::ones({2}), torch::ones({3})});
  const auto y = model->forward(torch::ones({2, 4}));
  step.finish();
  const auto frames = watch.saved_frames();
  const auto* z = find_frame(frames, "aten::_efficientzerotensor");
  ASSERT_NE(z, nullptr) << out.str();
  ASSERT_EQ(z->entries.size(), 1u);
  EXPECT_EQ(z->entries[0].kind, sentinel::EntryKind::Skipped);
  EXPECT_EQ(z->entries[0].skip_reason, "zero tensor");
  const auto* n = find_frame(frames, "aten::_nested_tensor_from_tensor_list");
  ASSERT_NE(n, nullptr) << out.str();
  bool nested_output = false;
  for (const auto& e : n->entries) nested_output = nested_output || (e.is_output && e.skip_reason == "nested");
  EXPECT_TRUE(nested_output);
  for (const auto& f : frames) EXPECT_TRUE(f.error.empty()) << f.op << ": " << f.error;
}

// What a read throws inside a callback is caught there: the frame is kept, marked with it, and
// detection still runs on what was read.
TEST(CaptureProtocol, AReadThatThrowsInsideACallbackKeepsTheFrameAndSaysWhy) {
  Mlp model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  const auto h = torch::full({2, 4}, 100.0f);
  // The start fails (its input's read): the end still reads the output, which is inf.
  auto report = expect_nonfinite([&] {
    auto step = watch.batch();
    sentinel::core::testing::fail_read(1);
    auto e = torch::exp(h);
    step.finish();
  });
  sentinel::core::testing::fail_read(0);
  ASSERT_FALSE(report.frames.empty());
  EXPECT_EQ(report.trigger().op, "aten::exp");
  EXPECT_NE(report.trigger().error.find("injected read failure"), std::string::npos);
  EXPECT_FALSE(report.trigger().outputs_finite);
  EXPECT_NE(sentinel::render_text(report).find("read failed"), std::string::npos);

  // The end fails (the output's read): the frame is kept with its input, and the next op, which
  // receives the inf, reports it.
  report = expect_nonfinite([&] {
    auto step = watch.batch();
    sentinel::core::testing::fail_read(2);
    auto e = torch::exp(h);
    auto f = e + 1;
    step.finish();
  });
  sentinel::core::testing::fail_read(0);
  const auto* exp_frame = find_frame(report.frames, "aten::exp");
  ASSERT_NE(exp_frame, nullptr);
  EXPECT_NE(exp_frame->error.find("injected read failure"), std::string::npos);
  EXPECT_EQ(report.trigger().op, "aten::add");
  EXPECT_FALSE(report.trigger().inputs_finite);
}

// A second watchdog's batch opened and closed inside the first's: both watch, and the rest of
// the first batch is still watched.
TEST(CaptureProtocol, NestedBatchesOfTwoWatchdogsBothWatch) {
  Mlp outer_model, inner_model;
  std::ostringstream out_a, out_b;
  sentinel::Watchdog a(outer_model.ptr(), sentinel::Options().output(out_a).max_frames_to_save(100));
  sentinel::Watchdog b(inner_model.ptr(), sentinel::Options().output(out_b).max_frames_to_save(100));
  const auto x = small_input();
  const auto report = expect_nonfinite([&] {
    auto outer = a.batch();
    outer_model->forward(x);
    {
      auto inner = b.batch();
      inner_model->forward(x);
      inner.finish();
    }
    auto inf = torch::exp(torch::full({2}, 1000.0f));  // after the inner batch
    outer.finish();
  });
  EXPECT_EQ(report.trigger().op, "aten::exp");
  int addmm = 0;
  for (const auto& f : report.frames) addmm += f.op == "aten::addmm";
  EXPECT_EQ(addmm, 4);  // both models' GEMMs: the inner batch's ops were the outer's too
  int inner_addmm = 0;
  for (const auto& f : b.saved_frames()) inner_addmm += f.op == "aten::addmm";
  EXPECT_EQ(inner_addmm, 2);
  EXPECT_FALSE(b.last_report().has_value());
}

// Threads that ran a batch keep running backward passes (outside any batch: their nodes are the
// watchdog's) while another thread destroys the watchdog. Under ASan or TSan, a callback that
// outruns the watchdog's lifetime is a use after free.
TEST(CaptureProtocol, AWatchdogDestroyedWhileOtherThreadsAreInItsCallbacks) {
  for (int round = 0; round < 3; ++round) {
    Mlp model;
    std::ostringstream out;
    auto watch = std::make_unique<sentinel::Watchdog>(model.ptr(), sentinel::Options().output(out));
    std::atomic<int> ready{0}, passes{0};
    std::atomic<bool> stop{false}, wrong{false};
    std::mutex one_batch_at_a_time;
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        {
          std::lock_guard<std::mutex> lock(one_batch_at_a_time);
          auto step = watch->batch();
          model->forward(small_input());
          step.finish();
        }
        ++ready;
        while (!stop) {
          auto w = torch::ones({8, 8}, torch::requires_grad());
          (w * 3).sin().sum().backward();
          wrong = wrong || !torch::allclose(w.grad(), 3 * torch::cos(torch::full({8, 8}, 3.0)));
          ++passes;
        }
      });
    }
    while (ready < 2 || passes < 20) std::this_thread::yield();
    watch.reset();
    const int at_destruction = passes;
    while (passes < at_destruction + 20) std::this_thread::yield();
    stop = true;
    for (auto& t : threads) t.join();
    EXPECT_FALSE(wrong);
  }
}

// The role of an entry is data: a parameter called input_proj is a parameter.
struct ProjImpl : torch::nn::Module {
  ProjImpl() { input_proj = register_parameter("input_proj", torch::ones({4, 4})); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::mm(x, input_proj); }
  torch::Tensor input_proj;
};
TORCH_MODULE(Proj);
struct WithProjImpl : torch::nn::Module {
  WithProjImpl() { proj = register_module("proj", Proj()); }
  torch::Tensor forward(const torch::Tensor& x) { return proj(x); }
  Proj proj{nullptr};
};
TORCH_MODULE(WithProj);

TEST(CaptureProtocol, AParameterNamedLikeAnInputIsReportedAsAParameter) {
  WithProj model;
  {
    torch::NoGradGuard no_grad;
    model->proj->input_proj[0][0] = std::nanf("");
  }
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  const auto report = expect_nonfinite([&] { debug.forward(torch::ones({2, 4})); });
  EXPECT_NE(report.origin.find("it was already in parameter proj.input_proj"), std::string::npos) << report.origin;
  bool parameter = false;
  for (const auto& e : report.trigger().entries) parameter = parameter || (e.label == "input_proj" && e.role == sentinel::EntryRole::Parameter);
  EXPECT_TRUE(parameter);
  const auto j = nlohmann::json::parse(sentinel::render_json(report));
  bool in_json = false;
  for (const auto& e : j["frames"].back()["entries"]) in_json = in_json || (e["label"] == "input_proj" && e["role"] == "parameter");
  EXPECT_TRUE(in_json);
}

// Module names are the user's strings: one that is not UTF-8 still gets its report files, and the
// FP8 metrics a destroyed watchdog writes do not end the program.
struct OddNameImpl : torch::nn::Module {
  OddNameImpl() {
    lin = register_module(std::string("lin\xff\xfe"), torch::nn::Linear(4, 4));
    // Fixed weights (LibTorch seeds its generator at random): exp(lin(1e4)) = exp(2e4) = inf.
    torch::NoGradGuard no_grad;
    lin->weight.fill_(0.5);
    lin->bias.zero_();
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::exp(lin(x)); }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(OddName);

TEST(CaptureProtocol, NamesThatAreNotUtf8AreWrittenReplacedNeverLost) {
  const fs::path dir = fs::temp_directory_path() / ("sentinel_utf8_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  OddName model;
  std::ostringstream out;
  {
    sentinel::DebugUnderflowOverflow debug(
        model, sentinel::Options().output(out).report_dir(dir.string()).fp8(
                   sentinel::Fp8Options().enabled(true).layers(".*").alarm_action(sentinel::Action::Warn)));
    expect_nonfinite([&] { debug.forward(torch::full({2, 4}, 1.0e4f)); });
    // A training step whose next batch never comes: its FP8 step closes when the watchdog goes.
    debug.forward(torch::ones({2, 4}, torch::requires_grad())).sum().backward();
  }
  const auto json_path = dir / "sentinel_batch0.json";
  ASSERT_TRUE(fs::exists(json_path)) << out.str();
  std::ifstream in(json_path);
  const auto j = nlohmann::json::parse(in);
  bool replaced = false;  // the Linear's frame: its path with U+FFFD for each byte
  for (const auto& f : j["frames"]) replaced = replaced || f["module_path"] == "lin\xef\xbf\xbd\xef\xbf\xbd";
  EXPECT_TRUE(replaced);
  EXPECT_TRUE(fs::exists(dir / "sentinel_batch0.html"));
  ASSERT_TRUE(fs::exists(dir / "fp8_metrics.jsonl"));
  std::ifstream metrics(dir / "fp8_metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) lines += !nlohmann::json::parse(line).is_null();
  EXPECT_GT(lines, 0);
  fs::remove_all(dir);
}

// What a watchdog holds when it is destroyed is delivered: the last step's FP8 alarm, and the
// frames still waiting for the device (here a backward after the last batch that made an inf).
struct SqrtHeadImpl : torch::nn::Module {
  SqrtHeadImpl() { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::sqrt(torch::relu(lin(x))); }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(SqrtHead);

TEST(CaptureProtocol, ADestroyedWatchdogDeliversItsLastAlarmAndWhatTheDeviceHeld) {
  std::ostringstream alarm_out;
  {
    Mlp model;
    sentinel::DebugUnderflowOverflow debug(
        model, sentinel::Options().output(alarm_out).fp8(
                   sentinel::Fp8Options().enabled(true).layers("fc1").overflow_alarm(1e-3).alarm_action(sentinel::Action::Warn)));
    // One training step, never followed by another batch: its amax (1000) overflows E4M3 at the
    // first scale (1).
    debug.forward(torch::full({2, 4}, 1000.0f, torch::requires_grad())).sum().backward();
    EXPECT_EQ(alarm_out.str().find("FP8 alarm"), std::string::npos);
  }
  EXPECT_NE(alarm_out.str().find("FP8 alarm during batch_number=0"), std::string::npos) << alarm_out.str();

  sentinel_test::DeviceFactoryScope deferring(sentinel::device::make_cpu_deferred_device);
  std::ostringstream out;
  {
    SqrtHead model;
    {
      torch::NoGradGuard no_grad;
      model->lin->bias.fill_(-100);  // relu gives 0 everywhere: sqrt's gradient is inf there
    }
    sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).device_readback_frames(1000));
    debug.forward(torch::ones({2, 4}, torch::requires_grad())).sum().backward();
    EXPECT_EQ(out.str().find("Detected inf/nan"), std::string::npos);  // still on the device
  }
  EXPECT_NE(out.str().find("Detected inf/nan during batch_number=0"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("SqrtBackward0"), std::string::npos) << out.str();
}

// The ring makes its slots as frames come: a large bound costs nothing until it is used.
TEST(CaptureProtocol, TheFrameRingAllocatesAsFramesComeAndKeepsTheLastN) {
  sentinel::frames::FrameRing big(1000000);
  EXPECT_EQ(big.allocated(), 0u);
  sentinel::frames::FrameRecord f;
  for (int i = 0; i < 5; ++i) {
    f.op_index = i;
    big.push(f);
  }
  EXPECT_EQ(big.allocated(), 5u);
  EXPECT_EQ(big.at(0).op_index, 0);
  sentinel::frames::FrameRing small(3);
  for (int i = 0; i < 7; ++i) {
    f.op_index = i;
    small.push(f);
  }
  EXPECT_EQ(small.allocated(), 3u);
  ASSERT_EQ(small.size(), 3u);
  EXPECT_EQ(small.at(0).op_index, 4);
  EXPECT_EQ(small.at(2).op_index, 6);
}

}  // namespace

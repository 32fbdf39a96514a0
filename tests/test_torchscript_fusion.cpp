// TorchScript's fuser and the watchdog: an inf made inside a chain of elementwise ops that
// TorchScript would fuse (T5's gelu(wi_0(x)) * wi_1(x)) is still found at its op, and the fusers'
// settings are as they were once the watchdogs are gone. The CPU fuser is switched on here so
// that this build fuses as CUDA builds do by default.
#include <gtest/gtest.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/tensorexpr/kernel.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <algorithm>
#include <sstream>

#include "cli/run_command.h"
#include "support/test_models.h"
#include "torchscript/fusion_guard.h"

namespace torch {
namespace jit {
TORCH_API void overrideCanFuseOnCPU(bool value);
}  // namespace jit
}  // namespace torch

namespace {

using namespace sentinel_test;
using sentinel::torchscript::current_fusion_settings;

// Fusion on the CPU, as a CUDA build has it on the GPU: the tensor-expression fuser may use its
// interpreter where LibTorch was built without LLVM. Restored after each test.
class TorchScriptFusion : public ::testing::Test {
 protected:
  void SetUp() override {
    before_ = current_fusion_settings();
    llvm_only_ = torch::jit::tensorexpr::getTEMustUseLLVMOnCPU();
    torch::jit::overrideCanFuseOnCPU(true);
    torch::jit::tensorexpr::getTEMustUseLLVMOnCPU() = false;
    model_ = torch::jit::load(data_path("t5_ff_scripted.pt"));
    model_.eval();
    batches_ = sentinel::cli::load_batches(data_path("t5_ff_inputs.pt"));
    ASSERT_EQ(batches_.size(), 5u);
  }
  void TearDown() override {
    torch::jit::overrideCanFuseOnCPU(before_.cpu);
    torch::jit::tensorexpr::getTEMustUseLLVMOnCPU() = llvm_only_;
  }

  // Runs the clean batches 0..2 unwatched and says whether the last run was fused.
  bool warm_up_fuses() {
    for (int b = 0; b < 3; ++b) model_.forward(batches_[b]);
    return last_run_fused();
  }
  static bool last_run_fused() {
    std::ostringstream graph;
    graph << *torch::jit::lastExecutedOptimizedGraph();
    return graph.str().find("TensorExprGroup") != std::string::npos;
  }

  torch::NoGradGuard no_grad_;  // fused inference, as served
  sentinel::torchscript::FusionSettings before_;
  bool llvm_only_ = true;
  torch::jit::Module model_;
  std::vector<std::vector<c10::IValue>> batches_;
};

TEST_F(TorchScriptFusion, ThisBuildFusesTheGatedProductWhenNotWatched) {
  // Without this the tests below would prove nothing.
  EXPECT_TRUE(warm_up_fuses());
}

TEST_F(TorchScriptFusion, AnInfMadeInsideAFusableChainIsFoundAtItsMulEvenAfterWarmUp) {
  ASSERT_TRUE(warm_up_fuses());  // the model's plan is fused before it is watched
  std::ostringstream out;
  std::optional<sentinel::Report> report;
  {
    sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(
        model_, sentinel::Options().output(out).callback([&](const sentinel::Report& r) {
          if (!report) report = r;
        }));
    for (int b = 0; b < 5 && !report; ++b) debug.forward(batches_[b]);
    EXPECT_FALSE(last_run_fused()) << "the watched model still ran a fused plan";
  }
  ASSERT_TRUE(report.has_value());
  // The place rule: the report stops where the inf leaves ff and names the op that made it.
  ASSERT_TRUE(report->origin_frame) << report->origin;
  const sentinel::Frame& last = *report->origin_frame;
  EXPECT_EQ(last.op, "aten::mul") << report->origin;
  EXPECT_EQ(last.module_path, "ff");
  EXPECT_EQ(last.batch_number, 3);
  EXPECT_TRUE(last.inputs_finite);
  EXPECT_FALSE(last.outputs_finite);
  EXPECT_NE(report->origin.find("aten::mul"), std::string::npos) << report->origin;
  const bool gelu_seen = std::any_of(report->frames.begin(), report->frames.end(),
                                     [](const sentinel::Frame& f) { return f.op == "aten::gelu"; });
  EXPECT_TRUE(gelu_seen);
}

TEST_F(TorchScriptFusion, KeptFusionShowsEachFusedGroupAsOneFrame) {
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(
      model_, sentinel::Options().output(out).keep_torchscript_fusion(true).max_frames_to_save(50));
  for (int b = 0; b < 3; ++b) debug.forward(batches_[b]);
  EXPECT_TRUE(last_run_fused());
  const auto frames = debug.saved_frames();
  // TorchScript keeps no module call stack for a fused group: it is placed at the model's root.
  const bool group = std::any_of(frames.begin(), frames.end(), [](const sentinel::Frame& f) {
    return f.op == "fused_gelu_mul" && f.batch_number == 2 && f.entries.size() == 1 &&
           f.entries[0].skip_reason == "inside a fused kernel: not read";
  });
  std::string ops;
  for (const auto& f : frames) ops += std::to_string(f.batch_number) + ":" + f.module_path + ":" + f.op + " ";
  EXPECT_TRUE(group) << "no fused_gelu_mul frame in batch 2: " << ops;
}

TEST_F(TorchScriptFusion, WithFusionKeptTheOriginNamesTheUnreadGroupBeforeTheFirstInf) {
  std::ostringstream out;
  std::optional<sentinel::Report> report;
  sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(
      model_, sentinel::Options().output(out).keep_torchscript_fusion(true).callback([&](const sentinel::Report& r) {
        if (!report) report = r;
      }));
  for (int b = 0; b < 5 && !report; ++b) debug.forward(batches_[b]);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->frames.back().op, "aten::dropout");  // the first op whose tensors were read
  EXPECT_NE(report->origin.find("fused TorchScript group fused_gelu_mul ran before it unread"), std::string::npos)
      << report->origin;
}

TEST_F(TorchScriptFusion, TheFusersAreOffWhileWatchedAndAsTheyWereAfterTheLastWatchdog) {
  const auto found = current_fusion_settings();
  ASSERT_TRUE(found.cpu);
  std::ostringstream out;
  {
    auto first = std::make_unique<sentinel::Watchdog>(model_, sentinel::Options().output(out));
    const auto off = current_fusion_settings();
    EXPECT_FALSE(off.texpr_fuser || off.cpu || off.gpu || off.cpu_legacy);
    {
      sentinel::Watchdog second(model_, sentinel::Options().output(out));
      EXPECT_FALSE(current_fusion_settings().cpu);
    }
    EXPECT_FALSE(current_fusion_settings().cpu) << "the second watchdog's end turned fusion back on";
    {
      sentinel::Watchdog keeps(model_, sentinel::Options().output(out).keep_torchscript_fusion(true));
      EXPECT_FALSE(current_fusion_settings().cpu) << "another watchdog still needs fusion off";
    }
  }
  EXPECT_TRUE(current_fusion_settings() == found);
  // And the model, compiled again without fusion while watched, fuses again.
  EXPECT_TRUE(warm_up_fuses());
}

}  // namespace

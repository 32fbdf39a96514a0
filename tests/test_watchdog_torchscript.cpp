// TorchScript models: exact module paths, automatic batches, detection - on models saved by
// Python (tests/data, made by make_fixtures.py) and on the embedded demo.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sentinel/sentinel.h>

#include <fstream>
#include <set>
#include <sstream>

#include "cli/demo_model.h"
#include "cli/run_command.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;

nlohmann::json expected() {
  std::ifstream in(data_path("expected.json"));
  return nlohmann::json::parse(in);
}

std::set<std::string> module_paths_from_python(const std::string& model) {
  std::set<std::string> paths;
  const auto all = expected();  // keep the document alive while iterating into it
  for (const auto& m : all["models"][model]["modules"]) paths.insert(m["path"].get<std::string>());
  return paths;
}

TEST(TorchScript, FramePathsAreNamedModulesPathsIncludingModuleListContainers) {
  auto model = torch::jit::load(data_path("mlp_scripted.pt"));
  auto batches = sentinel::cli::load_batches(data_path("mlp_inputs_clean.pt"));
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).max_frames_to_save(100));
  torch::NoGradGuard no_grad;
  debug.forward(batches[0]);
  const auto python_paths = module_paths_from_python("mlp_scripted.pt");
  std::set<std::string> seen;
  for (const auto& f : debug.saved_frames()) {
    EXPECT_TRUE(python_paths.count(f.module_path)) << "not a named_modules() path: " << f.module_path;
    seen.insert(f.module_path);
  }
  // The ModuleList `blocks` does not appear in TorchScript's call stack; its children must still
  // read blocks.0.lin, as Python's named_modules() says.
  EXPECT_TRUE(seen.count("blocks.0.lin"));
  EXPECT_TRUE(seen.count("blocks.1.lin"));
  EXPECT_TRUE(seen.count("fc1"));
  EXPECT_TRUE(seen.count("act"));
  for (const auto& f : debug.saved_frames()) {
    if (f.module_path == "blocks.0.lin") {
      EXPECT_EQ(f.module_class, "Linear");
      EXPECT_EQ(f.attribution, sentinel::Attribution::ModuleHierarchy);
    }
  }
}

// Watching never changes results: the same model and batches, unwatched then watched, in this
// process (so the same BLAS kernels), bit for bit.
TEST(TorchScript, WatchedOutputsEqualUnwatchedBitForBit) {
  auto model = torch::jit::load(data_path("mlp_scripted.pt"));
  auto batches = sentinel::cli::load_batches(data_path("mlp_inputs_clean.pt"));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> unwatched;
  for (auto& b : batches) unwatched.push_back(model.forward(b).toTensor());
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  for (size_t i = 0; i < batches.size(); ++i) {
    auto y = debug.forward(batches[i]).toTensor();
    EXPECT_TRUE(torch::equal(y, unwatched[i])) << "batch " << i;
  }
}

// Against Python's own run of the same archive. Python computed these on another machine, whose
// BLAS may choose other kernels (a float32 GEMM then rounds differently in the last bits), so
// they agree to a stated tolerance, not bit for bit.
TEST(TorchScript, WatchedOutputsMatchPythonsWithinRounding) {
  constexpr double kRelative = 1e-5, kAbsolute = 1e-6;  // ~100 float32 ulps of these magnitudes
  auto model = torch::jit::load(data_path("mlp_scripted.pt"));
  auto batches = sentinel::cli::load_batches(data_path("mlp_inputs_clean.pt"));
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  const auto all = expected();
  int compared = 0;
  for (const auto& c : all["cases"]) {
    if (c["model"] != "mlp_scripted.pt" || c["inputs"] != "mlp_inputs_clean.pt") continue;
    for (const auto& b : c["batches"]) {
      auto y = debug.forward(batches[b["index"].get<size_t>()]).toTensor();
      auto want = b["fp32"]["values"];
      for (int64_t i = 0; i < y.size(0); ++i) {
        for (int64_t j = 0; j < y.size(1); ++j) {
          const double got = y[i][j].item<float>(), w = want[i][j].get<double>();
          EXPECT_NEAR(got, w, kAbsolute + kRelative * std::fabs(w)) << "batch " << b["index"] << " [" << i << "][" << j << "]";
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(TorchScript, OverflowIsFoundInTheModulePythonHooksName) {
  auto model = torch::jit::load(data_path("mlp_scripted.pt"));
  auto batches = sentinel::cli::load_batches(data_path("mlp_inputs_overflow.pt"));
  const auto e = expected()["overflow"];
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  try {
    for (auto& b : batches) debug.forward(b);
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& err) {
    // Python's hooks name the first module whose output holds inf; the place rule tolerates the
    // inf inside that module and stops where the next one reads it, naming the op that made it.
    const auto& r = err.report();
    EXPECT_EQ(r.batch_number, e["batch"].get<int64_t>());
    ASSERT_TRUE(r.origin_frame);
    EXPECT_EQ(r.origin_frame->module_path, e["first_nonfinite_module"].get<std::string>());
    EXPECT_TRUE(r.origin_frame->inputs_finite);
    EXPECT_FALSE(r.origin_frame->outputs_finite);
    EXPECT_EQ(r.escape, sentinel::Escape::Read);
    EXPECT_NE(r.trigger().module_path, r.origin_frame->module_path);
  }
}

TEST(TorchScript, NanInTheInputIsPassedThrough) {
  auto model = torch::jit::load(data_path("mlp_scripted.pt"));
  auto batches = sentinel::cli::load_batches(data_path("mlp_inputs_nan_input.pt"));
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  debug.forward(batches[0]);
  try {
    debug.forward(batches[1]);
    FAIL();
  } catch (const sentinel::NonFiniteError& err) {
    EXPECT_EQ(err.report().batch_number, expected()["nan_input"]["batch"].get<int64_t>());
    EXPECT_FALSE(err.report().produced_here);
    EXPECT_NE(err.report().origin.find("input[0]"), std::string::npos) << err.report().origin;
  }
}

TEST(TorchScript, DirectForwardCallsAreBatchesAndErrorsWaitForASafePoint) {
  auto model = torch::jit::load(data_path("mlp_scripted.pt"));
  auto batches = sentinel::cli::load_batches(data_path("mlp_inputs_overflow.pt"));
  std::ostringstream out;
  sentinel::Watchdog watch(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  model.forward(batches[0]);
  model.forward(batches[1]);
  EXPECT_EQ(watch.batch_number(), 2);
  model.forward(batches[2]);  // overflows: printed now, thrown at the next safe point
  EXPECT_NE(out.str().find("Detected inf/nan during batch_number=2"), std::string::npos);
  EXPECT_THROW(watch.check(), sentinel::NonFiniteError);
}

TEST(TorchScript, TwoPositionalArgumentsFromTuplesAndLists) {
  auto model = torch::jit::load(data_path("two_input_scripted.pt"));
  for (const char* name : {"two_input_batches.pt", "two_input_batches_list.pt"}) {
    auto batches = sentinel::cli::load_batches(data_path(name));
    ASSERT_EQ(batches[0].size(), 2u) << name;
    std::ostringstream out;
    sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
    torch::NoGradGuard no_grad;
    for (auto& b : batches) {
      auto y = debug.forward(b).toTensor();
      EXPECT_TRUE(torch::allclose(y, b[0].toTensor() * 2 + b[1].toTensor()));
    }
  }
}

TEST(TorchScript, DemoOverflowsInsideTheGatedFeedForwardAtItsKnownBatch) {
  auto model = sentinel::demo::make_t5_encoder();
  auto batches = sentinel::demo::make_batches();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  try {
    for (auto& b : batches) debug.forward(b);
    FAIL();
  } catch (const sentinel::NonFiniteError& err) {
    const auto& r = err.report();
    EXPECT_EQ(r.batch_number, sentinel::demo::kOverflowBatch);
    // The mul makes the inf inside the gated feed-forward; the residual add of the layer around
    // it reads it (the place rule).
    ASSERT_TRUE(r.origin_frame);
    EXPECT_EQ(r.origin_frame->op, "aten::mul");
    EXPECT_EQ(r.origin_frame->module_path, "encoder.block_1.layer_ff.DenseReluDense");
    EXPECT_EQ(r.origin_frame->module_class, "T5DenseGatedGeluDense");
    EXPECT_TRUE(r.origin_frame->inputs_finite);
    EXPECT_EQ(r.trigger().op, "aten::add");
    EXPECT_EQ(r.trigger().module_path, "encoder.block_1.layer_ff");
    EXPECT_EQ(r.escape, sentinel::Escape::Read);
    EXPECT_EQ(static_cast<int64_t>(r.frames.size()), 21);
  }
}

}  // namespace

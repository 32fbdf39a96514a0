// Third-party TorchScript models: torchvision's classification zoo, scripted by Python at test
// time (tests/zoo/make_zoo.py, fixture `zoo`). For each model: every frame names a module as
// named_modules() does, in inference and in training; a clean model never trips; an overflow
// planted deep inside (one layer's weights scaled) and a bad batch (an inf pixel) are found in the
// batch HF's hook-based detection finds them, at the module HF names, one of its descendants, or
// one of its ancestors.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sentinel/sentinel.h>

#include <fstream>
#include <set>
#include <sstream>

#include "cli/run_command.h"
#include "support/test_paths.h"

namespace {

std::string zoo_path(const std::string& name) { return sentinel_test::zoo_dir() + "/" + name; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "missing " << path << " (made by the ctest fixture zoo_fixtures)";
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

// The models make_zoo.py writes (the test list is fixed when the tests are discovered, before
// the fixture runs).
const std::vector<std::string> kZooModels = {
    "resnet18",       "vit_b_16",       "swin_t",        "convnext_tiny",  "mobilenet_v3_small", "efficientnet_b0",
    "regnet_y_400mf", "densenet121",    "squeezenet1_0", "shufflenet_v2_x0_5", "googlenet"};

TEST(ZooFixtures, EveryModelWasScripted) {
  const auto index = read_json(zoo_path("zoo.json"));
  std::vector<std::string> written;
  for (const auto& m : index.value("models", nlohmann::json::array())) written.push_back(m.get<std::string>());
  EXPECT_EQ(written, kZooModels);
  EXPECT_TRUE(index.value("skipped", nlohmann::json::object()).empty()) << index.dump(2);
}

struct ZooModel {
  std::string name;
  nlohmann::json meta;
  std::set<std::string> modules;
  std::vector<std::vector<c10::IValue>> batches;
};

ZooModel load(const std::string& name) {
  ZooModel z{name, read_json(zoo_path(name + ".json")), {}, {}};
  for (const auto& m : z.meta.value("named_modules", nlohmann::json::array())) z.modules.insert(m.get<std::string>());
  z.batches = sentinel::cli::load_batches(zoo_path(name + "_inputs.pt"));
  return z;
}

// Every frame's path, in every direction, is a named_modules() name.
void expect_named_modules(const ZooModel& z, const std::vector<sentinel::Frame>& frames) {
  ASSERT_FALSE(frames.empty());
  std::set<std::string> wrong;
  for (const auto& f : frames) {
    if (!z.modules.count(f.module_path)) wrong.insert(f.module_path + "  (" + f.module_class + " " + f.op + ")");
  }
  std::string list;
  for (const auto& w : wrong) list += "  " + w + "\n";
  EXPECT_TRUE(wrong.empty()) << z.name << ": frame paths that named_modules() does not have:\n" << list;
}

// Frames enough for a whole batch of these small models, forward and backward.
sentinel::Options all_frames(std::ostream& out) { return sentinel::Options().output(out).max_frames_to_save(20000); }

class Zoo : public ::testing::TestWithParam<std::string> {};

TEST_P(Zoo, CleanInferenceNeverTripsAndNamesModulesAsNamedModules) {
  const auto z = load(GetParam());
  auto model = torch::jit::load(zoo_path(z.name + ".pt"));
  model.eval();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::Watchdog watch(model, all_frames(out));
  for (const auto& b : z.batches) {
    auto step = watch.batch();
    model.forward(b);
    step.finish();
    expect_named_modules(z, watch.saved_frames());
  }
  EXPECT_FALSE(watch.last_report().has_value()) << out.str();
}

TEST_P(Zoo, TrainingStepNamesModulesAsNamedModules) {
  const auto z = load(GetParam());
  if (!z.meta.value("trainable", false)) GTEST_SKIP() << z.name << " returns no tensor in train mode";
  auto model = torch::jit::load(zoo_path(z.name + ".pt"));
  model.train();
  std::ostringstream out;
  sentinel::Watchdog watch(model, all_frames(out));
  auto step = watch.batch();
  auto loss = model.forward(z.batches.front()).toTensor().pow(2).mean();
  watch.backward(loss);
  step.finish();
  const auto frames = watch.saved_frames();
  expect_named_modules(z, frames);
  bool backward = false;
  for (const auto& f : frames) backward = backward || f.direction == sentinel::Direction::Backward;
  EXPECT_TRUE(backward);
  EXPECT_FALSE(watch.last_report().has_value()) << out.str();
}

// Runs `model_file` on `batches` and checks the trip against HF's detection `hf` ({batch, module}).
void expect_found_where_hf_finds_it(const ZooModel& z, const std::string& model_file,
                                    const std::vector<std::vector<c10::IValue>>& batches, const nlohmann::json& hf) {
  auto model = torch::jit::load(zoo_path(model_file));
  model.eval();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::Watchdog watch(model, sentinel::Options().output(out));
  const int64_t hf_batch = hf["batch"].get<int64_t>();
  const std::string hf_module = hf["module"].get<std::string>();
  const auto report = [&]() -> std::optional<sentinel::Report> {
    try {
      for (const auto& b : batches) {
        auto step = watch.batch();
        watch.batch_returned(model.forward(b));
        step.finish();
      }
    } catch (const sentinel::NonFiniteError& e) {
      return e.report();
    }
    return std::nullopt;
  }();
  ASSERT_TRUE(report.has_value()) << z.name << ": no trip";
  EXPECT_EQ(report->batch_number, hf_batch);
  // The module whose op made the value: under the place rule the report stops where the value
  // leaves that module (HF's hooks see it there), and names the maker as the origin frame.
  const std::string& ours =
      report->origin_frame ? report->origin_frame->module_path : report->trigger().module_path;
  auto under = [](const std::string& path, const std::string& root) {
    return root.empty() || path == root || path.rfind(root + ".", 0) == 0;
  };
  EXPECT_TRUE(under(ours, hf_module) || under(hf_module, ours))
      << z.name << ": HF names " << hf_module << ", the sentinel " << ours << "\n" << report->origin;
  EXPECT_TRUE(z.modules.count(ours)) << ours;
}

TEST_P(Zoo, PlantedOverflowIsFoundWhereHfFindsIt) {
  const auto z = load(GetParam());
  expect_found_where_hf_finds_it(z, z.name + "_overflow.pt", z.batches, z.meta["hf_overflow"]);
}

TEST_P(Zoo, BadBatchIsFoundWhereHfFindsIt) {
  const auto z = load(GetParam());
  expect_found_where_hf_finds_it(z, z.name + ".pt", sentinel::cli::load_batches(zoo_path(z.name + "_bad_inputs.pt")),
                                 z.meta["hf_bad_batch"]);
}

INSTANTIATE_TEST_SUITE_P(Torchvision, Zoo, ::testing::ValuesIn(kZooModels),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace

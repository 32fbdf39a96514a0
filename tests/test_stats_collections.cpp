// Statistics collections in the watchdog: which layers, tensors and steps are read, the values
// against a float64 reference taken from the same tensors here, the FP8 percentages against the
// probe's own metrics, the loggers (file, JSON lines, custom) and what happens when one fails.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sentinel/loggers.h>
#include <sentinel/sentinel.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "support/shell.h"
#include "support/test_paths.h"

namespace {

namespace fs = std::filesystem;

// fc1's output kept with its gradient retained: the gradient operand of fc1's backward GEMM.
struct TwoLayersImpl : torch::nn::Module {
  TwoLayersImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    hidden = fc1(x);
    if (hidden.requires_grad()) hidden.retain_grad();
    return fc2(torch::relu(hidden));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor hidden;
};
TORCH_MODULE(TwoLayers);

struct Recorder : sentinel::StatsLogger {
  std::vector<sentinel::StatRecord> records;
  int flushes = 0;
  void log(const std::vector<sentinel::StatRecord>& r) override { records.insert(records.end(), r.begin(), r.end()); }
  void flush() override { ++flushes; }
};

struct Thrower : sentinel::StatsLogger {
  int calls = 0;
  void log(const std::vector<sentinel::StatRecord>&) override {
    ++calls;
    throw std::runtime_error("disk on fire");
  }
};

const std::vector<sentinel::Stat> kMenu = {sentinel::Stat::Min,    sentinel::Stat::Max,     sentinel::Stat::Mean,
                                           sentinel::Stat::Std,    sentinel::Stat::L1Norm,  sentinel::Stat::L2Norm,
                                           sentinel::Stat::CurAmax, sentinel::Stat::DynamicRange};

std::map<std::string, double> reference(const torch::Tensor& t) {
  auto d = t.detach().to(torch::kDouble);
  auto a = d.abs();
  const double amax = a.max().item<double>();
  const double min_nonzero = a.masked_select(a > 0).min().item<double>();
  return {{"min", d.min().item<double>()},        {"max", d.max().item<double>()},
          {"mean", d.mean().item<double>()},      {"std", d.std().item<double>()},
          {"l1_norm", a.sum().item<double>()},    {"l2_norm", d.pow(2).sum().sqrt().item<double>()},
          {"cur_amax", amax},                     {"dynamic_range", std::log2(amax / min_nonzero)}};
}

const sentinel::StatRecord* find(const std::vector<sentinel::StatRecord>& rs, int64_t step, const std::string& layer,
                                 const std::string& tensor, const std::string& stat) {
  for (const auto& r : rs) {
    if (r.step == step && r.layer == layer && r.tensor == tensor && r.stat == stat) return &r;
  }
  return nullptr;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("sentinel_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

TEST(StatsCollections, EveryRoleOfTheSelectedLayerEqualsTheFloat64Reference) {
  torch::manual_seed(0);
  TwoLayers model;
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  auto options = sentinel::Options().output(out).add_logger(recorder).stats_collections(
      {sentinel::StatsCollection().layers("fc1").stats(kMenu)});
  {
    sentinel::DebugUnderflowOverflow debug(model, options);
    for (int step = 0; step < 2; ++step) {
      auto x = torch::randn({5, 6}) * (step + 1) + 0.5;
      auto loss = debug.forward(x).pow(2).sum();
      debug.backward(loss);
      const auto weight = model->fc1->weight.detach().clone();
      const auto gradient = model->hidden.grad().clone();
      for (const auto& [role, tensor] : std::vector<std::pair<std::string, torch::Tensor>>{
               {"activation", x}, {"weight", weight}, {"gradient", gradient}}) {
        for (const auto& [stat, want] : reference(tensor)) {
          const auto* r = find(recorder->records, step, "fc1", role, stat);
          ASSERT_NE(r, nullptr) << step << " " << role << " " << stat;
          EXPECT_NEAR(r->value, want, 1e-9 * std::max(1.0, std::fabs(want))) << step << " " << role << " " << stat;
        }
      }
      torch::NoGradGuard no_grad;
      model->fc1->weight.mul_(0.5);  // the next step's weight differs
    }
    EXPECT_EQ(find(recorder->records, 0, "fc2", "activation", "max"), nullptr);  // not selected
    EXPECT_EQ(recorder->records.size(), 2u * 3 * kMenu.size());
    EXPECT_EQ(debug.collected_stats().size(), 3 * kMenu.size());
    EXPECT_EQ(debug.collected_stats().front().step, 1);
  }
  EXPECT_EQ(recorder->flushes, 1);  // at destruction
}

TEST(StatsCollections, StepsTensorsAndLayersAreSelectedAsConfigured) {
  torch::manual_seed(0);
  TwoLayers model;
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).add_logger(recorder).stats_collections(
                 {sentinel::StatsCollection()
                      .layers("fc.")
                      .stats({sentinel::Stat::L2Norm})
                      .tensors({sentinel::fp8::Role::Weight})
                      .freq(2)
                      .start_step(1)
                      .end_step(5)}));
  torch::NoGradGuard no_grad;
  for (int step = 0; step < 8; ++step) debug.forward(torch::randn({2, 6}));
  std::vector<int64_t> steps;
  for (const auto& r : recorder->records) {
    EXPECT_EQ(r.tensor, "weight");
    EXPECT_EQ(r.stat, "l2_norm");
    if (steps.empty() || steps.back() != r.step) steps.push_back(r.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 5}));  // end_step is inclusive
  EXPECT_EQ(recorder->records.size(), 3u * 2);        // fc1 and fc2
  EXPECT_NEAR(find(recorder->records, 3, "fc2", "weight", "l2_norm")->value,
              model->fc2->weight.to(torch::kDouble).norm().item<double>(), 1e-12);
}

TEST(StatsCollections, Fp8PercentagesAreTheProbesOwn) {
  torch::manual_seed(0);
  TwoLayers model;
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  // No Options::fp8: the collection turns the probe on for its layers, without alarms.
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).add_logger(recorder).stats_collections(
                 {sentinel::StatsCollection().layers("fc2").stats({sentinel::Stat::Underflows, sentinel::Stat::Overflows})}));
  torch::NoGradGuard no_grad;
  debug.forward(torch::randn({4, 6}));        // step 0: scale 1
  debug.forward(torch::randn({64, 6}) * 50);  // step 1: a delayed scale from step 0, overflowing
  const auto metrics = debug.fp8_metrics();
  ASSERT_FALSE(metrics.empty());
  for (const auto& m : metrics) {
    EXPECT_EQ(m.module_path, "fc2");
    EXPECT_EQ(find(recorder->records, 1, "fc2", m.role, "underflows")->value, m.underflow_pct);
    EXPECT_EQ(find(recorder->records, 1, "fc2", m.role, "overflows")->value, m.overflow_pct);
  }
  EXPECT_EQ(out.str().find("alarm"), std::string::npos) << out.str();
}

TEST(StatsCollections, FileAndJsonLinesLoggersWriteEveryRecord) {
  torch::manual_seed(0);
  TwoLayers model;
  const fs::path dir = fresh_dir("loggers");
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  {
    sentinel::DebugUnderflowOverflow debug(
        model, sentinel::Options().output(out).log_dir(dir.string()).loggers({"file", "jsonl"}).add_logger(recorder)
                   .stats_collections({sentinel::StatsCollection().name("mine").layers("fc1").stats(kMenu)}));
    torch::NoGradGuard no_grad;
    for (int step = 0; step < 3; ++step) debug.forward(torch::randn({3, 6}));
  }
  ASSERT_EQ(recorder->records.size(), 3u * 2 * kMenu.size());  // activation and weight, no backward
  std::ifstream debug_log(dir / "debug_logs" / "sentinel_rank-0.log");
  std::stringstream debug_text;
  debug_text << debug_log.rdbuf();
  EXPECT_NE(debug_text.str().find("collection mine"), std::string::npos) << debug_text.str();
  EXPECT_NE(debug_text.str().find("selected layers (1): fc1"), std::string::npos) << debug_text.str();

  std::ifstream jsonl(dir / "debug_statistics_logs" / "sentinel_rank-0.jsonl");
  size_t i = 0;
  for (std::string line; std::getline(jsonl, line); ++i) {
    ASSERT_LT(i, recorder->records.size());
    const auto j = nlohmann::json::parse(line);
    const auto& r = recorder->records[i];
    EXPECT_EQ(j["step"], r.step);
    EXPECT_EQ(j["layer"], r.layer);
    EXPECT_EQ(j["tensor"], r.tensor);
    EXPECT_EQ(j["stat"], r.stat);
    EXPECT_EQ(j["value"].get<double>(), r.value);  // every digit
  }
  EXPECT_EQ(i, recorder->records.size());

  std::ifstream file_log(dir / "debug_statistics_logs" / "sentinel_rank-0.log");
  i = 0;
  for (std::string line; std::getline(file_log, line); ++i) {
    ASSERT_LT(i, recorder->records.size());
    const auto& r = recorder->records[i];
    std::istringstream fields(line);
    std::string name, iteration, value;
    fields >> name >> iteration >> value;
    EXPECT_EQ(name, r.layer + "_" + r.tensor + "_" + r.stat);
    EXPECT_EQ(std::stoll(iteration.substr(iteration.find('=') + 1)), r.step);
    const double v = std::stod(value.substr(value.find('=') + 1));
    EXPECT_NEAR(v, r.value, 1e-6 * std::fabs(r.value) + 1e-300);
  }
  EXPECT_EQ(i, recorder->records.size());
  fs::remove_all(dir);
}

// TensorBoard's files read back by an independent reader (tests/loggers/read_tensorboard_events.py:
// Python's protobuf from Debian, every record's CRC-32C checked by the crc32c module).
TEST(StatsCollections, TensorBoardEventsReadBackByAnIndependentReader) {
  torch::manual_seed(0);
  TwoLayers model;
  const fs::path dir = fresh_dir("tensorboard");
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  {
    sentinel::DebugUnderflowOverflow debug(
        model, sentinel::Options().output(out).log_dir(dir.string()).loggers({"tensorboard"}).add_logger(recorder)
                   .stats_collections({sentinel::StatsCollection().stats(kMenu)}));
    for (int step = 0; step < 2; ++step) {
      auto loss = debug.forward(torch::randn({3, 6})).pow(2).sum();
      debug.backward(loss);
    }
  }
  if (sentinel_test::shell("/usr/bin/python3 -c 'import google.protobuf, crc32c'").code != 0) {
    GTEST_SKIP() << "/usr/bin/python3 lacks google.protobuf or crc32c (Debian: python3-protobuf python3-crc32c)";
  }
  const auto read = sentinel_test::shell(std::string("/usr/bin/python3 ") + sentinel_test::tensorboard_reader() + " --protoc " +
                                         sentinel_test::protoc_program() + " " + sentinel_test::tensorboard_proto() + " " +
                                         (dir / "tensorboard").string());
  ASSERT_EQ(read.code, 0) << read.output;
  const std::string& text = read.output;
  std::map<std::pair<int64_t, std::string>, double> scalars;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("tag")) continue;
    ASSERT_TRUE(j["value"].is_number()) << line;
    scalars[{j["step"].get<int64_t>(), j["tag"].get<std::string>()}] = j["value"].get<double>();
  }
  ASSERT_EQ(scalars.size(), recorder->records.size()) << text;
  for (const auto& r : recorder->records) {
    const std::string tag = (r.layer.empty() ? "root" : r.layer) + "/" + r.tensor + "_" + r.stat;
    auto it = scalars.find({r.step, tag});
    ASSERT_NE(it, scalars.end()) << tag;
    EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(r.value))) << tag;  // TensorBoard keeps float32
  }
  fs::remove_all(dir);
}

TEST(StatsCollections, AFailingLoggerIsDroppedAndTheModelRunsOn) {
  torch::manual_seed(0);
  TwoLayers model;
  auto thrower = std::make_shared<Thrower>();
  auto recorder = std::make_shared<Recorder>();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).add_logger(thrower).add_logger(recorder).stats_collections(
                 {sentinel::StatsCollection().layers("fc1").stats({sentinel::Stat::Max})}));
  torch::NoGradGuard no_grad;
  for (int step = 0; step < 3; ++step) EXPECT_NO_THROW(debug.forward(torch::randn({2, 6})));
  EXPECT_EQ(thrower->calls, 1);
  EXPECT_EQ(recorder->records.size(), 3u * 2);
  EXPECT_NE(out.str().find("the custom logger failed and is dropped: disk on fire"), std::string::npos) << out.str();
}

// Loggers run without the watchdog's lock: one may ask the watchdog for what it just logged.
TEST(StatsCollections, ALoggerMayCallTheWatchdog) {
  struct Asking : sentinel::StatsLogger {
    sentinel::Watchdog* watch = nullptr;
    size_t seen = 0;
    void log(const std::vector<sentinel::StatRecord>& records) override {
      seen += records.size();
      EXPECT_EQ(watch->collected_stats().size(), records.size());
    }
  };
  torch::manual_seed(0);
  TwoLayers model;
  auto asking = std::make_shared<Asking>();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).add_logger(asking).stats_collections(
                 {sentinel::StatsCollection().layers("fc2").stats({sentinel::Stat::Mean})}));
  asking->watch = &debug;
  debug.backward(debug.forward(torch::randn({2, 6})).sum());
  EXPECT_EQ(asking->seen, 3u);  // activation, weight, gradient
}

TEST(StatsCollections, BadCollectionsAndLogDirsAreNamed) {
  TwoLayers model;
  std::ostringstream out;
  auto make = [&](sentinel::Options o) { sentinel::DebugUnderflowOverflow debug(model, o.output(out)); };
  auto message = [&](sentinel::Options o) -> std::string {
    try {
      make(o);
    } catch (const sentinel::OptionError& e) {
      return e.what();
    }
    return "no error";
  };
  const auto nothing = sentinel::StatsCollection().layers("decoder.*").stats({sentinel::Stat::Max}).source("cfg.yaml:7");
  EXPECT_NE(message(sentinel::Options().stats_collections({nothing})).find("cfg.yaml:7"), std::string::npos);
  EXPECT_NE(message(sentinel::Options().stats_collections({nothing})).find("match none of the model's"),
            std::string::npos);
  EXPECT_NE(message(sentinel::Options().stats_collections({sentinel::StatsCollection().layers("(").stats({sentinel::Stat::Max})}))
                .find("invalid"),
            std::string::npos);
  EXPECT_NE(message(sentinel::Options().stats_collections({sentinel::StatsCollection().layers("fc1")})).find("no statistics"),
            std::string::npos);
  EXPECT_NE(message(sentinel::Options().loggers({"printer"}).log_dir("x")).find("unknown logger 'printer'"),
            std::string::npos);
  const fs::path file = fresh_dir("not_a_dir");
  std::ofstream(file.string()) << "a file";
  const auto collection = sentinel::StatsCollection().layers("fc1").stats({sentinel::Stat::Max});
  EXPECT_NE(message(sentinel::Options().log_dir((file / "logs").string()).stats_collections({collection}))
                .find((file / "logs").string()),
            std::string::npos);
  fs::remove(file);
}

TEST(StatsCollections, WatchingWithCollectionsNeverChangesResults) {
  torch::manual_seed(0);
  TwoLayers model;
  auto x = torch::randn({7, 6});
  torch::Tensor plain_out, plain_grad;
  {
    auto y = model->forward(x);
    y.pow(2).sum().backward();
    plain_out = y.detach().clone();
    plain_grad = model->fc1->weight.grad().clone();
    model->zero_grad();
  }
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).stats_collections({sentinel::StatsCollection().stats(kMenu)}));
  auto y = debug.forward(x);
  debug.backward(y.pow(2).sum());
  EXPECT_TRUE(torch::equal(y.detach(), plain_out));
  EXPECT_TRUE(torch::equal(model->fc1->weight.grad(), plain_grad));
}

// docs/config.md's complete config is the one examples/stats_collection.cpp runs, and it loads.
TEST(StatsCollections, TheDocumentedConfigIsTheExamplesAndLoads) {
  const fs::path root = sentinel_test::source_dir();
  std::ifstream doc(root / "docs" / "config.md");
  ASSERT_TRUE(doc);
  std::vector<std::string> blocks;
  bool inside = false;
  for (std::string line; std::getline(doc, line);) {
    if (!inside && line == "```yaml") {
      inside = true;
      blocks.emplace_back();
    } else if (inside && line == "```") {
      inside = false;
    } else if (inside) {
      blocks.back() += line + "\n";
    }
  }
  ASSERT_FALSE(blocks.empty());
  std::ifstream example(root / "examples" / "configs" / "debug_config.yaml");
  std::stringstream text;
  text << example.rdbuf();
  EXPECT_EQ(blocks.front(), text.str());
  const fs::path dir = fresh_dir("doc_configs");
  fs::create_directories(dir);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const fs::path path = dir / ("block" + std::to_string(i) + ".yaml");
    std::ofstream(path) << blocks[i];
    const auto options = sentinel::Options::from_yaml(path.string());
    EXPECT_FALSE(options.stats_collections().empty()) << "block " << i;
  }
  fs::remove_all(dir);
}

}  // namespace

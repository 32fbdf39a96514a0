// Bad options and odd tensors: a clear error naming what was wrong, or a labelled entry; never a
// crash and never a lost report.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/test_models.h"

namespace {

using namespace sentinel_test;

template <class F>
std::string option_error(F&& make) {
  try {
    make();
  } catch (const sentinel::OptionError& e) {
    return e.what();
  }
  return "<no OptionError>";
}

TEST(Options, InvalidValuesAreRejectedWithTheirName) {
  Mlp model;
  auto make = [&](sentinel::Options o) { return [&model, o] { sentinel::Watchdog w(model.ptr(), o); }; };
  EXPECT_NE(option_error(make(sentinel::Options().max_frames_to_save(0))).find("max_frames_to_save must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(option_error(make(sentinel::Options().trace_batch_nums({2, -1}))).find("got -1"), std::string::npos);
  EXPECT_NE(option_error(make(sentinel::Options().abort_after_batch_num(-3))).find("abort_after_batch_num"),
            std::string::npos);
  EXPECT_NE(option_error(make(sentinel::Options().action(sentinel::Action::Callback))).find("callback"),
            std::string::npos);
  EXPECT_NE(option_error([] { sentinel::Watchdog w(std::shared_ptr<torch::nn::Module>(), {}); }).find("null"),
            std::string::npos);
}

TEST(Options, ModuleBoundariesAreRefusedWhereNoHookSeesThem) {
  // exact: false needs the Python module's hooks: a C++ model's first batch, and a TorchScript
  // model at once, say so instead of watching nothing.
  Mlp model;
  sentinel::Watchdog cpp(model.ptr(), sentinel::Options().exact(false));
  EXPECT_NE(option_error([&] { auto batch = cpp.batch(); }).find("exact: false watches module boundaries"),
            std::string::npos);
  torch::jit::Module scripted("m");
  EXPECT_NE(option_error([&] { sentinel::Watchdog w(scripted, sentinel::Options().exact(false)); })
                .find("the C++ API, TorchScript and the command line watch every op"),
            std::string::npos);
  // exact (the default) watches every op: the batch opens.
  sentinel::Watchdog exact(model.ptr());
  auto batch = exact.batch();
  batch.finish();
}

TEST(Options, ChainedSettersReadBack) {
  auto o = sentinel::Options().max_frames_to_save(50).trace_batch_nums({1, 3}).abort_after_batch_num(7).report_dir("d");
  EXPECT_EQ(o.max_frames_to_save(), 50);
  EXPECT_EQ(o.trace_batch_nums(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(*o.abort_after_batch_num(), 7);
  EXPECT_EQ(o.report_dir(), "d");
  EXPECT_EQ(o.action(), sentinel::Action::Throw);
  EXPECT_EQ(sentinel::Options().max_frames_to_save(), 21);  // HF's default
}

TEST(ReportDir, UnwritableOrNotADirectoryIsAClearErrorAtConstruction) {
  Mlp model;
  const auto file = std::filesystem::temp_directory_path() / "sentinel_not_a_dir";
  std::ofstream(file) << "x";
  const std::string msg = option_error([&] { sentinel::Watchdog w(model.ptr(), sentinel::Options().report_dir(file.string())); });
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  const std::string sub = (file / "sub").string();
  EXPECT_NE(option_error([&] { sentinel::Watchdog w(model.ptr(), sentinel::Options().report_dir(sub)); }).find(sub),
            std::string::npos);
  std::filesystem::remove(file);
}

TEST(ReportDir, ReportsAreWrittenAsTextAndJson) {
  Mlp model;
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_reports_test";
  std::filesystem::remove_all(dir);
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).report_dir(dir.string()));
  auto bad = small_input();
  bad[0][0] = std::nanf("");
  EXPECT_THROW(debug.forward(bad), sentinel::NonFiniteError);
  std::ifstream txt(dir / "sentinel_batch0.txt");
  std::stringstream content;
  content << txt.rdbuf();
  EXPECT_EQ(content.str(), debug.last_report() ? sentinel::render_text(*debug.last_report()) : "");
  EXPECT_TRUE(std::filesystem::exists(dir / "sentinel_batch0.json"));
  std::filesystem::remove_all(dir);
}

TEST(ReportDir, ADirectoryThatVanishesLosesNoReport) {
  Mlp model;
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_vanishing_dir";
  std::filesystem::remove_all(dir);
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).report_dir(dir.string()));
  std::filesystem::remove_all(dir);
  auto bad = small_input();
  bad[0][0] = std::nanf("");
  try {
    debug.forward(bad);
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("Detected inf/nan"), std::string::npos);
  }
  EXPECT_NE(out.str().find("could not write"), std::string::npos);
  EXPECT_NE(out.str().find("Detected inf/nan during batch_number=0"), std::string::npos);
}

// A model whose forward meets every kind of tensor the issue list names.
struct OddTensorsImpl : torch::nn::Module {
  OddTensorsImpl() { emb = register_module("emb", torch::nn::Embedding(10, 4)); }
  torch::Tensor forward(torch::Tensor ids) {
    auto s = sentinel::scope(*this);
    auto h = emb(ids);                                                      // integer input
    auto t = h.transpose(0, 1).contiguous().transpose(0, 1) * 2;            // non-contiguous input
    auto e = torch::ones({0, 4}) + 1;                                       // empty tensors
    auto m = torch::ones({2, 4}, torch::device(torch::kMeta)) * 3;          // meta tensors
    auto sp = torch::ones({2, 2}).to_sparse() * 2;                          // sparse tensors
    auto half = h.to(torch::kBFloat16) * 2;                                 // bf16
    (void)e; (void)m; (void)sp; (void)half;
    return t.sum(1);
  }
  torch::nn::Embedding emb{nullptr};
};
TORCH_MODULE(OddTensors);

TEST(OddTensors, AreLabelledAndNeverCrash) {
  OddTensors model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).max_frames_to_save(100));
  auto ids = torch::tensor({{1, 2, 3}, {4, 5, 6}}, torch::kLong);
  auto y = debug.forward(ids);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 4}));
  std::set<std::string> reasons;
  bool saw_int_input = false;
  for (const auto& f : debug.saved_frames()) {
    for (const auto& e : f.entries) {
      if (e.kind == sentinel::EntryKind::Skipped) reasons.insert(e.skip_reason);
      if (f.op == "aten::embedding" && e.dtype == "int64") saw_int_input = true;
    }
  }
  EXPECT_TRUE(reasons.count("empty"));
  EXPECT_TRUE(reasons.count("meta"));
  EXPECT_TRUE(reasons.count("sparse"));
  EXPECT_TRUE(saw_int_input);
  // LibTorch logs and swallows what a callback throws, dropping the frame: every odd op must
  // have its frame, whole.
  std::map<std::string, int> ops;
  for (const auto& f : debug.saved_frames()) {
    ++ops[f.op];
    EXPECT_TRUE(f.error.empty()) << f.op << ": " << f.error;
  }
  EXPECT_EQ(ops["aten::embedding"], 1);
  EXPECT_EQ(ops["aten::to_sparse"], 1);
  EXPECT_EQ(ops["aten::sum"], 1);
  EXPECT_GE(ops["aten::mul"], 4);  // the transposed copy, the meta, sparse and bf16 products
}

}  // namespace

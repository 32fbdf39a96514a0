// Tensor dumps: the selected layers' GEMM tensors as files torch.load opens (read back here and
// by Python's own torch.load), the size cap, an unwritable directory, and at detection the op's
// arguments, which `sentinel replay` re-runs to make the inf/nan again.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <sentinel/sentinel.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <csignal>
#include <sys/resource.h>
#include <sys/wait.h>

#include "support/shell.h"
#include "support/test_models.h"
#include "support/test_paths.h"

namespace {

namespace fs = std::filesystem;

using sentinel_test::shell;

c10::IValue load(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::jit::pickle_load(bytes);
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("sentinel_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

TEST(TensorDumps, SelectedLayersGemmTensorsAreSavedAndLoadBackExactly) {
  torch::manual_seed(0);
  sentinel_test::Mlp model;
  const fs::path dir = fresh_dir("dumps");
  std::ostringstream out;
  auto dumps = sentinel::DumpOptions().enabled(true).dir(dir.string()).layers("fc1").freq(2);
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).dumps(dumps));
  std::vector<torch::Tensor> inputs;
  for (int step = 0; step < 3; ++step) {
    inputs.push_back(torch::randn({3, 4}));
    auto loss = debug.forward(inputs.back()).pow(2).sum();
    debug.backward(loss);
  }
  for (int step : {0, 2}) {
    auto path = [&](const char* role) { return dir / ("fc1." + std::string(role) + ".step" + std::to_string(step) + ".pt"); };
    for (const char* role : {"activation", "weight", "output", "gradient"}) {
      ASSERT_TRUE(fs::exists(path(role))) << path(role);
    }
    EXPECT_TRUE(torch::equal(load(path("activation")).toTensor(), inputs[step]));
    EXPECT_EQ(load(path("weight")).toTensor().numel(), model->fc1->weight.numel());
    EXPECT_EQ(load(path("output")).toTensor().sizes(), (std::vector<int64_t>{3, 8}));
  }
  EXPECT_FALSE(fs::exists(dir / "fc1.activation.step1.pt"));  // freq 2
  EXPECT_FALSE(fs::exists(dir / "fc2.activation.step0.pt"));  // not selected
  // The last weight saved is the one in the model (no optimizer ran), as the GEMM reads it: the
  // C++ frontend's Linear multiplies by weight.t() (aten::addmm) on LibTorch 1.13.
  const auto saved = load(dir / "fc1.weight.step2.pt").toTensor();
  const auto weight = model->fc1->weight.detach();
  EXPECT_TRUE(torch::equal(saved, saved.sizes() == weight.sizes() ? weight : weight.t()));

  // Python's own torch.load opens them, with the default of torch 2.6 and later that users get
  // (weights_only=True, said here so that the check holds on any torch): a dump is tensors only.
  const auto py = shell(sentinel_test::torch_python() +
                        " -c \"import torch,sys; t=torch.load(sys.argv[1], weights_only=True); "
                        "print(repr(t.double().sum().item()))\" " + (dir / "fc1.activation.step2.pt").string());
  ASSERT_EQ(py.code, 0) << py.output;
  EXPECT_DOUBLE_EQ(std::stod(py.output), inputs[2].to(torch::kDouble).sum().item<double>());
  fs::remove_all(dir);
}

TEST(TensorDumps, TheSizeCapAndAnUnwritableDirectoryStopDumpsNotTheModel) {
  torch::manual_seed(0);
  sentinel_test::Mlp model;
  const fs::path dir = fresh_dir("dumps_cap");
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).dumps(sentinel::DumpOptions().enabled(true).dir(dir.string()).max_bytes(3000)));
  torch::NoGradGuard no_grad;
  for (int step = 0; step < 3; ++step) EXPECT_NO_THROW(debug.forward(torch::randn({2, 4})));
  EXPECT_NE(out.str().find("tensor dumps stop"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("max_bytes 3000"), std::string::npos) << out.str();
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) total += static_cast<int64_t>(fs::file_size(e.path()));
  EXPECT_GT(total, 0);
  EXPECT_LE(total, 3000);
  fs::remove_all(dir);

  const fs::path file = fresh_dir("dumps_file");
  std::ofstream(file.string()) << "a file, not a directory";
  std::ostringstream out2;
  sentinel::DebugUnderflowOverflow debug2(
      model, sentinel::Options().output(out2).dumps(sentinel::DumpOptions().enabled(true).dir((file / "d").string())));
  EXPECT_NO_THROW(debug2.forward(torch::randn({2, 4})));
  EXPECT_NE(out2.str().find((file / "d").string()), std::string::npos) << out2.str();
  fs::remove(file);
}

// A full disk, as write(2) sees it: the file-size limit makes writes fail with EFBIG.
TEST(TensorDumps, AFullDiskIsSaidAndLeavesNoTruncatedFile) {
  torch::manual_seed(0);
  sentinel_test::Mlp model;
  const fs::path dir = fresh_dir("dumps_full");
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      model, sentinel::Options().output(out).dumps(sentinel::DumpOptions().enabled(true).dir(dir.string())));
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 200;  // smaller than any saved tensor
  setrlimit(RLIMIT_FSIZE, &small);
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(debug.forward(torch::randn({2, 4})));
  EXPECT_NO_THROW(debug.forward(torch::randn({2, 4})));
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(out.str().find("tensor dumps stop: cannot write"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("tensor dumps stop", out.str().find("tensor dumps stop") + 1), std::string::npos)
      << "said once: " << out.str();
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 0u);  // the partial file is removed
  fs::remove_all(dir);
}

// The op a report stops at is saved. Strict, that is the op that made the inf; under the place
// rule it is where the inf left its module (here the model's return, which is no op to save).
TEST(TensorDumps, AtDetectionTheOpIsSavedAndReplayMakesTheInfAgain) {
  torch::manual_seed(0);
  sentinel_test::Block model;
  const fs::path dir = fresh_dir("dump_detect");
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model,
                                         sentinel::Options().output(out).report_dir(dir.string()).strict(true));
  torch::NoGradGuard no_grad;
  debug.forward(torch::ones({2, 4}));
  try {
    debug.forward(torch::full({2, 4}, 1e4f));  // exp overflows
    FAIL() << "no detection";
  } catch (const sentinel::NonFiniteError& e) {
    const std::string dump = e.report().dump_dir;
    ASSERT_FALSE(dump.empty()) << out.str();
    EXPECT_EQ(fs::path(dump).parent_path(), dir);
    EXPECT_NE(e.what(), std::string());
    EXPECT_NE(out.str().find("sentinel replay " + dump), std::string::npos);
    std::ifstream json(dir / "sentinel_batch1.json");
    std::stringstream text;
    text << json.rdbuf();
    EXPECT_NE(text.str().find("\"dump_dir\""), std::string::npos);

    auto replay = shell(sentinel_test::cli_program() + " replay " + dump);
    EXPECT_EQ(replay.code, 3) << replay.output;
    EXPECT_NE(replay.output.find("reproduced: aten::exp makes inf/nan from finite arguments"), std::string::npos)
        << replay.output;

    // A corrupt dump is named, not a crash.
    std::ofstream(fs::path(dump) / "inputs.pt", std::ios::trunc) << "garbage";
    auto corrupt = shell(sentinel_test::cli_program() + " replay " + dump);
    EXPECT_EQ(corrupt.code, 4) << corrupt.output;
    EXPECT_NE(corrupt.output.find("inputs.pt"), std::string::npos) << corrupt.output;
  }
  auto missing = shell(sentinel_test::cli_program() + " replay " + (dir / "nowhere").string());
  EXPECT_EQ(missing.code, 4) << missing.output;
  fs::remove_all(dir);
}

TEST(TensorDumps, ReplaySaysWhenTheOpGivesFiniteResults) {
  const fs::path dir = fresh_dir("dump_finite");
  fs::create_directories(dir);
  auto save = [&](const std::string& name, c10::IValue v) {
    const auto bytes = torch::jit::pickle_save(v);
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  save("inputs.pt", c10::ivalue::Tuple::create({torch::ones({3}), torch::full({3}, 2.0f)}));
  save("outputs.pt", c10::ivalue::Tuple::create({torch::full({3}, 2.0f)}));
  std::ofstream(dir / "op.json") << R"({"op": "aten::mul", "overload": "Tensor", "module_path": "m", "batch": 0})";
  auto r = shell(sentinel_test::cli_program() + " replay " + dir.string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("not reproduced"), std::string::npos) << r.output;
  std::ofstream(dir / "op.json", std::ios::trunc) << R"({"op": "aten::no_such_op", "overload": ""})";
  r = shell(sentinel_test::cli_program() + " replay " + dir.string());
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("aten::no_such_op"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace

// The sentinel command line, run as a user runs it, on files written by Python.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include <nlohmann/json.hpp>
#include <sentinel/sentinel.h>

#include "support/shell.h"
#include "support/test_models.h"
#include "support/test_paths.h"

namespace {

using sentinel_test::data_path;

using sentinel_test::Run;

Run sentinel_cli(const std::string& args) { return sentinel_test::shell(sentinel_test::cli_program() + " " + args); }

std::string run_args(const std::string& model, const std::string& inputs) {
  return "run --model " + data_path(model) + " --inputs " + data_path(inputs);
}

TEST(Cli, CleanBatchesExitZero) {
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_clean.pt"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ran 3 batches; no inf/nan detected"), std::string::npos) << r.output;
  // A list of one batch, which Python pickles with another opcode (APPEND) than longer lists.
  r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_single.pt"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ran 1 batches; no inf/nan detected"), std::string::npos) << r.output;
}

TEST(Cli, OverflowExitsThreeWithTheReport) {
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_overflow.pt") + " --max-frames 3");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("Detected inf/nan during batch_number=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Last 3 forward frames:"), std::string::npos);
  EXPECT_NE(r.output.find("                  fc1 Linear aten::linear"), std::string::npos);
}

// --set reaches every option of the table, a section's fields by dotted name, as the flags do.
TEST(Cli, SetReachesEveryOptionAsTheFlagsDo) {
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_overflow.pt") +
                        " --set max_frames_to_save=3 --set fp8.recipes=delayed,mxfp8 --set fp8.mx_scale_rule=OCP_FLOOR");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("Last 3 forward frames:"), std::string::npos) << r.output;
  // `sentinel options` prints the page of every option, which the docs hold as it is.
  auto page = sentinel_cli("options");
  EXPECT_EQ(page.code, 0) << page.output;
  std::ifstream in(sentinel_test::source_dir() + "/docs/options.md");
  const std::string docs{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(page.output, docs) << "docs/options.md is not what the option table says: run `sentinel options > docs/options.md`";
  for (const char* name : {"max_frames_to_save", "mx_scale_rule", "fp8_format", "save_tensor", "blockwise_dims"}) {
    EXPECT_NE(page.output.find(std::string("`") + name + "`"), std::string::npos) << name;
  }
}

TEST(Cli, TupleBatchesArePositionalArguments) {
  auto r = sentinel_cli(run_args("two_input_scripted.pt", "two_input_batches.pt"));
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST(Cli, TraceAndAbortAfter) {
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --trace-batches 0,2 --abort-after 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("*** Starting batch number=0 ***"), std::string::npos);
  EXPECT_EQ(r.output.find("*** Starting batch number=2 ***"), std::string::npos);  // stopped before
  EXPECT_NE(r.output.find("stopped after batch 1"), std::string::npos) << r.output;
}

TEST(Cli, WarnKeepsRunningAndStillExitsThree) {
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_overflow.pt") + " --warn");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("ran 4 batches; inf/nan detected"), std::string::npos) << r.output;
  auto stopped = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_overflow.pt") + " --warn --abort-after 2");
  EXPECT_EQ(stopped.code, 3) << stopped.output;
}

TEST(Cli, ReportDirGetsBothFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_cli_reports";
  std::filesystem::remove_all(dir);
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_overflow.pt") + " --report-dir " + dir.string());
  EXPECT_EQ(r.code, 3);
  EXPECT_TRUE(std::filesystem::exists(dir / "sentinel_batch2.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir / "sentinel_batch2.json"));
  std::filesystem::remove_all(dir);
}

TEST(Cli, DemoIsTheDefaultAndFindsItsOverflow) {
  auto r = sentinel_cli("");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("Detected inf/nan during batch_number=3"), std::string::npos);
  EXPECT_NE(r.output.find("origin: aten::mul in encoder.block_1.layer_ff.DenseReluDense"), std::string::npos);
  EXPECT_EQ(sentinel_cli("demo").code, 3);
}

TEST(Cli, Fp8DemoCatchesTheDriftBeforeTheOverflow) {
  auto r = sentinel_cli("demo fp8");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("FP8 alarm during batch_number=6"), std::string::npos) << r.output;
  const auto first_overflow_alarm = r.output.find("overflow 2.502% > 1.000%");
  const auto first_drift_alarm = r.output.find("drift 0.26 > 0.25");
  ASSERT_NE(first_drift_alarm, std::string::npos) << r.output;
  EXPECT_LT(first_drift_alarm, first_overflow_alarm);
  EXPECT_EQ(sentinel_cli("demo nonsense").code, 2);
}

struct BadCase {
  std::string args;
  int code;
  std::string message;
};

TEST(Cli, BadInputGetsAClearMessageAndItsOwnExitCode) {
  const std::string missing = data_path("no_such_model.pt");
  const std::vector<BadCase> cases = {
      {"run --model " + missing + " --inputs " + data_path("mlp_inputs_clean.pt"), 4, "cannot open model file '" + missing + "'"},
      {"run --model " + data_path("mlp_inputs_clean.pt") + " --inputs " + data_path("mlp_inputs_clean.pt"), 4,
       "is not a TorchScript model"},
      {run_args("mlp_scripted.pt", "no_such_inputs.pt"), 4, "cannot open inputs file"},
      {run_args("mlp_scripted.pt", "corrupt.pt"), 4, "could not be read as a torch.save file"},
      {run_args("mlp_scripted.pt", "not_a_list.pt"), 4, "holds a GenericDict; expected a list of batches"},
      {run_args("mlp_scripted.pt", "not_a_list_tensor.pt"), 4, "expected a list of batches"},
      {run_args("mlp_scripted.pt", "empty_list.pt"), 4, "holds no batches"},
      {run_args("mlp_scripted.pt", "two_input_batches.pt"), 4, "the model failed on batch 0"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --max-frames 0", 2, "--max-frames"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --trace-batches 1,x", 2, "expected an integer, got 'x'"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --trace-batches a,b", 2, "--trace-batches"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --abort-after -3", 2,
       "--abort-after: abort_after_batch_num must be at least 0, got -3"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --set max_frames_to_save=0", 2,
       "--set max_frames_to_save: max_frames_to_save must be at least 1"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --set nope=1", 2, "no option 'nope'"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --set fp8.recipes=delayed,fp9", 2, "'fp9' is not one of"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --set fp8", 2, "expected NAME=VALUE"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --set fp8=2", 2, "is a section"},
      {run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --report-dir /proc/sentinel", 2, "/proc/sentinel"},
      {"run --inputs " + data_path("mlp_inputs_clean.pt"), 2, "--model is required"},
      {"frobnicate", 2, "frobnicate"},
  };
  for (const auto& c : cases) {
    auto r = sentinel_cli(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("sentinel: sentinel:"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("0000000000"), std::string::npos) << "a bound printed in full: " << r.output;
  }
}

// `sentinel run --device`: the CPU as before, and a clear usage error for a device this LibTorch
// or this machine does not have (on a machine with a GPU, the same run on it).
TEST(Cli, DeviceFlagRunsThereOrSaysWhyItCannot) {
  const std::string t5 = run_args("t5_ff_scripted.pt", "t5_ff_inputs.pt");
  auto cpu = sentinel_cli(t5 + " --device cpu");
  EXPECT_EQ(cpu.code, 3) << cpu.output;
  EXPECT_NE(cpu.output.find("origin: aten::mul in ff"), std::string::npos) << cpu.output;
  for (const std::string bad : {"gpu", "cuda:x", "cpu:1", "cuda:", ""}) {
    auto r = sentinel_cli(t5 + " --device '" + bad + "'");
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.output;
    EXPECT_NE(r.output.find("--device '" + bad + "' is not cpu, cuda or cuda:N"), std::string::npos) << r.output;
  }
  auto cuda = sentinel_cli(t5 + " --device cuda");
  if (!at::hasCUDA()) {
    EXPECT_EQ(cuda.code, 2) << cuda.output;
    EXPECT_NE(cuda.output.find("--device cuda: this LibTorch was built without CUDA"), std::string::npos) << cuda.output;
  } else if (torch::cuda::device_count() == 0) {
    EXPECT_EQ(cuda.code, 2) << cuda.output;
    EXPECT_NE(cuda.output.find("--device cuda: no CUDA device is visible"), std::string::npos) << cuda.output;
  } else {
    EXPECT_EQ(cuda.code, 3) << cuda.output;
    EXPECT_NE(cuda.output.find("origin: aten::mul in ff"), std::string::npos) << cuda.output;
    auto past = sentinel_cli(t5 + " --device cuda:" + std::to_string(torch::cuda::device_count()));
    EXPECT_EQ(past.code, 2) << past.output;
    EXPECT_NE(past.output.find("numbered from 0"), std::string::npos) << past.output;
  }
  auto demo = sentinel_cli("demo --device cuda:7");
  EXPECT_EQ(demo.code, 2) << demo.output;
  EXPECT_NE(demo.output.find("--device cuda:7"), std::string::npos) << demo.output;
}

// `sentinel ranks DIR` on reports written as the ranks write them, one of them garbage.
TEST(Cli, RanksSummarizesEachRanksReportsAndNamesTheFirst) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "sentinel_cli_ranks";
  fs::remove_all(dir);
  for (int r = 0; r < 4; ++r) fs::create_directories(dir / ("rank" + std::to_string(r)));
  auto write = [&](const fs::path& path, const sentinel::Report& report) {
    std::ofstream(path) << sentinel::render_json(report);
  };
  sentinel::Frame frame;
  frame.batch_number = 2;
  frame.op_index = 14;
  frame.module_path = "fc1";
  frame.module_class = "Linear";
  frame.op = "aten::addmm";
  sentinel::Report made;
  made.kind = "nonfinite";
  made.rank = 1;
  made.world_size = 4;
  made.batch_number = 2;
  made.frames = {frame};
  made.origin = "origin: aten::addmm in fc1 (Linear) produced the first inf/nan";
  made.ranks.role = sentinel::RankRole::Made;
  write(dir / "rank1" / "sentinel_batch2.json", made);
  sentinel::Report received = made;  // a later op on rank 0, received through the all-reduce
  received.rank = 0;
  received.frames[0].op_index = 3;
  received.frames[0].op = "aten::div_";
  received.ranks.role = sentinel::RankRole::Received;
  write(dir / "rank0" / "sentinel_batch2.json", received);
  std::ofstream(dir / "rank2" / "sentinel_batch2.json") << "{ not json";
  auto r = sentinel_cli("ranks " + dir.string());
  EXPECT_EQ(r.code, 3) << r.output;
  // Made before received within a batch, though rank 0's op index is smaller.
  EXPECT_NE(r.output.find("First to see inf/nan: rank 1, batch 2, forward op 14: fc1 (Linear) aten::addmm (made there)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank2/sentinel_batch2.json is not a sentinel report: skipped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 3: no report"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0: nonfinite in batch 2, role received, at fc1 (Linear) aten::div_"), std::string::npos)
      << r.output;

  fs::remove_all(dir);
  fs::create_directories(dir / "rank0");
  r = sentinel_cli("ranks " + dir.string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("No rank saw inf/nan."), std::string::npos) << r.output;
  fs::remove_all(dir / "rank0");
  r = sentinel_cli("ranks " + dir.string());
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("no rank<R>/ directories"), std::string::npos) << r.output;
  r = sentinel_cli("ranks " + (dir / "missing").string());
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_NE(r.output.find("is not a directory"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

namespace fs = std::filesystem;

// A config drives `sentinel run` as NV_DEBUG_TOOL_CONFIG drives TransformerEngine's tools: the
// TorchScript model's fc1 statistics land in the log directory; the flags override the config.
TEST(Cli, RunWithAConfigWritesTheStatisticsLogs) {
  const fs::path dir = fs::temp_directory_path() / ("sentinel_cli_config_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = dir / "config.yaml";
  std::ofstream(config) << "sentinel:\n  loggers: [file, jsonl]\n  max_frames_to_save: 3\n"
                           "stats:\n  layers:\n    layer_name_regex_pattern: fc1\n"
                           "  collect_tensor_stats:\n    type: [max, l2_norm]\n    tensors: [activation, weight]\n";
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --config " + config.string() +
                        " --log-dir " + (dir / "logs").string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream jsonl(dir / "logs" / "debug_statistics_logs" / "sentinel_rank-0.jsonl");
  int lines = 0;
  for (std::string line; std::getline(jsonl, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["layer"], "fc1");
  }
  EXPECT_EQ(lines, 3 * 2 * 2);  // 3 batches x 2 tensors x 2 statistics
  std::ifstream debug_log(dir / "logs" / "debug_logs" / "sentinel_rank-0.log");
  std::stringstream text;
  text << debug_log.rdbuf();
  EXPECT_NE(text.str().find("config: " + config.string()), std::string::npos) << text.str();

  // SENTINEL_CONFIG is read when --config is not given; a mistake in it names the line.
  std::ofstream(config, std::ios::trunc) << "sentinel:\n  max_frames: 3\n";
  r = sentinel_test::shell("SENTINEL_CONFIG=" + config.string() + " " + sentinel_test::cli_program() + " demo");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(config.string() + ":2: unknown key 'max_frames'"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// Megatron's flags: --log-tensor-name-pattern selects layers by a search in their names (FP8
// metrics and statistics), --save-tensor saves their GEMM tensors.
TEST(Cli, MegatronsTensorFlagsLogAndSave) {
  const fs::path dir = fs::temp_directory_path() / ("sentinel_cli_megatron_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --log-dir " + dir.string() +
                        " --loggers jsonl --log-tensor-name-pattern 'blocks\\.1' --log-tensor-interval 2 --save-tensor");
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream jsonl(dir / "debug_statistics_logs" / "sentinel_rank-0.jsonl");
  std::set<int64_t> steps;
  std::set<std::string> stats;
  for (std::string line; std::getline(jsonl, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["layer"], "blocks.1.lin");
    steps.insert(j["step"].get<int64_t>());
    stats.insert(j["stat"].get<std::string>());
  }
  EXPECT_EQ(steps, (std::set<int64_t>{0, 2}));
  EXPECT_EQ(stats, (std::set<std::string>{"min", "max", "cur_amax", "underflows", "overflows"}));
  EXPECT_TRUE(fs::exists(dir / "saved_tensors" / "blocks.1.lin.activation.step2.pt"));
  EXPECT_TRUE(fs::exists(dir / "saved_tensors" / "blocks.1.lin.output.step0.pt"));
  EXPECT_FALSE(fs::exists(dir / "saved_tensors" / "blocks.1.lin.activation.step1.pt"));
  r = sentinel_cli(run_args("mlp_scripted.pt", "mlp_inputs_clean.pt") + " --log-tensor-name-pattern decoder");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("match none of the model's"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace

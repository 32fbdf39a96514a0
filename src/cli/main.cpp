// sentinel: run a TorchScript model under the watchdog, or the embedded demo.
//   sentinel                      # the demo
//   sentinel demo [fp8] [--report-dir D] [--recipes delayed,current,mxfp8,nvfp4,float8block]
//   sentinel run --model M.pt --inputs B.pt [--max-frames N] [--trace-batches 1,3]
//                [--abort-after N] [--report-dir D] [--warn]
//                [--config C.yaml] [--log-dir D] [--loggers file,jsonl,tensorboard]
//                [--log-tensor-name-pattern P] [--log-tensor-interval N] [--save-tensor] [--save-tensor-dir D]
//                [--recipes delayed,current,mxfp8,nvfp4,float8block] [--mx-scale-rule round_up|ocp_floor]
//                [--dtype bfloat16|float16|float32] [--device cpu|cuda|cuda:N]
//   sentinel ranks DIR             # summary of the per-rank reports of a run of many ranks
//   sentinel replay DUMP           # re-run the op saved at detection (exit 3: inf/nan again)
//   sentinel report FILE.json [--html OUT] [--text]   # a saved report or trace, rendered again
//   sentinel diff A.json B.json [--rtol R] [--atol A] [--html OUT]   # where two traces part
// Exit codes: 0 clean (diff: the same), 1 internal error, 2 usage error, 3 inf/nan detected,
// 4 bad input files, 5 the traces diverge, 6 the traces cannot be compared.
#include <sentinel/errors.h>
#include <sentinel/version.h>

#include <CLI/CLI.hpp>
#include <torch/script.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/demo_model.h"
#include "cli/fp8_demo.h"
#include "cli/ranks_command.h"
#include "cli/replay_command.h"
#include "cli/report_command.h"
#include "cli/run_command.h"

namespace {

// A batch number: a non-negative integer. (CLI11's NonNegativeNumber names its upper bound, the
// largest double, in full: a 300-digit number in the message.)
const CLI::Validator kBatchNumber(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || errno == ERANGE || v < 0) {
        return "'" + text + "' is not a batch number (a non-negative integer)";
      }
      return {};
    },
    "BATCH");

// A tolerance: a finite non-negative number.
const CLI::Validator kTolerance(
    [](std::string& text) -> std::string {
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || errno == ERANGE || !(v >= 0.0) || !std::isfinite(v)) {
        return "'" + text + "' is not a tolerance (a finite number, 0 or more)";
      }
      return {};
    },
    "TOL");

// Errors from the library already begin with "sentinel: ".
std::string message(const std::exception& e) {
  const std::string text = e.what();
  return text.rfind("sentinel: ", 0) == 0 ? text : "sentinel: " + text;
}

struct CommonFlags {
  int64_t max_frames = 21;
  std::vector<int64_t> trace_batches;
  int64_t abort_after = -1;
  std::string report_dir;
  bool warn = false;
  std::string config, log_dir, loggers, tensor_pattern, save_dir, recipes, mx_scale_rule;
  int64_t tensor_interval = 1;
  bool save_tensor = false;
  std::vector<CLI::Option*> given;  // flags that override the config: only when given
  CLI::Option *max_frames_opt, *trace_opt, *abort_opt, *report_opt, *interval_opt;

  void add_to(CLI::App* app) {
    max_frames_opt = app->add_option("--max-frames", max_frames, "frames shown in a report (HF's max_frames_to_save)")
                         ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
    trace_opt = app->add_option("--trace-batches", trace_batches, "batches to trace frame by frame, e.g. 1,3 (0-indexed)")
                    ->delimiter(',')
                    ->check(kBatchNumber);
    abort_opt = app->add_option("--abort-after", abort_after, "stop after this batch (0-indexed)")->check(kBatchNumber);
    report_opt = app->add_option("--report-dir", report_dir, "write the report as .txt and .json into this directory");
    app->add_flag("--warn", warn, "report inf/nan and keep running instead of stopping");
    app->add_option("--config", config,
                    "YAML config (docs/config.md); default: $SENTINEL_CONFIG. Flags given here override it");
    app->add_option("--log-dir", log_dir, "where the statistics loggers write (debug_logs/, debug_statistics_logs/, tensorboard/)");
    app->add_option("--loggers", loggers, "comma-separated: file, jsonl, tensorboard (default: file)");
    app->add_option("--log-tensor-name-pattern", tensor_pattern,
                    "regex searched in module paths: FP8 metrics and statistics of those layers' GEMM tensors");
    interval_opt = app->add_option("--log-tensor-interval", tensor_interval, "every N steps (batches)")
                       ->check(CLI::Range(int64_t{1}, int64_t{1000000000}));
    app->add_flag("--save-tensor", save_tensor, "save the selected layers' GEMM tensors (torch.load opens them)");
    app->add_option("--save-tensor-dir", save_dir, "where --save-tensor writes (default: <log-dir>/saved_tensors)");
    app->add_option("--recipes", recipes,
                    "replay these FP8 recipes side by side on every GEMM's inputs: delayed,current,mxfp8,nvfp4,float8block");
    app->add_option("--mx-scale-rule", mx_scale_rule, "MXFP8 block exponent: round_up (TransformerEngine, default) or ocp_floor")
        ->check(CLI::IsMember({"round_up", "ocp_floor"}));
  }
  sentinel::Options options() const {
    auto o = config.empty() ? sentinel::Options::from_config() : sentinel::Options::from_yaml(config);
    if (max_frames_opt->count()) o.max_frames_to_save(max_frames);
    if (trace_opt->count()) o.trace_batch_nums(trace_batches);
    if (report_opt->count()) o.report_dir(report_dir);
    if (abort_after >= 0) o.abort_after_batch_num(abort_after);
    if (warn) o.action(sentinel::Action::Warn);
    if (!log_dir.empty()) o.log_dir(log_dir);
    if (!loggers.empty()) {
      std::vector<std::string> names;
      std::stringstream list(loggers);
      for (std::string name; std::getline(list, name, ',');) names.push_back(name);
      o.loggers(names);
    }
    if (!tensor_pattern.empty()) {
      // Megatron's hooks search the pattern in the module name; the watchdog matches whole paths.
      const std::string layers = ".*(?:" + tensor_pattern + ").*";
      auto fp8 = o.fp8();
      fp8.enabled(true).layers(layers).freq(tensor_interval);
      o.fp8(fp8);
      auto collections = o.stats_collections();
      collections.push_back(sentinel::StatsCollection()
                                .name("--log-tensor-name-pattern")
                                .layers(layers)
                                .stats({sentinel::Stat::Min, sentinel::Stat::Max, sentinel::Stat::CurAmax,
                                        sentinel::Stat::Underflows, sentinel::Stat::Overflows})
                                .freq(tensor_interval)
                                .source("--log-tensor-name-pattern"));
      o.stats_collections(collections);
    }
    if (!recipes.empty() || !mx_scale_rule.empty()) {
      auto fp8 = o.fp8();
      fp8.enabled(true);
      if (!recipes.empty()) fp8.recipes(sentinel::parse_recipes(recipes));
      if (!mx_scale_rule.empty()) {
        fp8.mx_scale_rule(mx_scale_rule == "ocp_floor" ? sentinel::fp8::MxScaleRule::OcpFloor
                                                       : sentinel::fp8::MxScaleRule::RoundUp);
      }
      o.fp8(fp8);
    }
    if (save_tensor || !save_dir.empty()) {
      auto dumps = o.dumps();
      dumps.enabled(true);
      if (!save_dir.empty()) dumps.dir(save_dir);
      if (!tensor_pattern.empty()) dumps.layers(".*(?:" + tensor_pattern + ").*");
      if (interval_opt->count()) dumps.freq(tensor_interval);
      o.dumps(dumps);
    }
    return o;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Overflow Sentinel " SENTINEL_VERSION_STRING
               ": stops a LibTorch model at the first inf/nan and shows where it came from"};
  app.set_version_flag("--version", SENTINEL_VERSION_STRING);
  app.require_subcommand(0, 1);

  CommonFlags run_flags, demo_flags;
  std::string model_path, inputs_path;
  auto* run = app.add_subcommand("run", "run a TorchScript model on batches saved with torch.save([...])");
  run->add_option("--model", model_path, "TorchScript model (torch.jit.save)")->required();
  run->add_option("--inputs", inputs_path, "batches: torch.save([batch0, batch1, ...])")->required();
  std::string run_dtype, run_device = "cpu", demo_device = "cpu";
  run->add_option("--device", run_device, "cpu (default), cuda or cuda:N: the model and the batches are moved there");
  run->add_option("--dtype", run_dtype, "cast the model's floating parameters and buffers and the inputs first")
      ->check(CLI::IsMember({"bfloat16", "float16", "float32"}));
  run_flags.add_to(run);
  auto* demo = app.add_subcommand("demo", "run the embedded T5-style demo, whose feed-forward overflows");
  demo_flags.add_to(demo);
  demo->add_option("--device", demo_device, "cpu (default), cuda or cuda:N (the overflow demo)");
  std::string demo_name = "overflow";
  demo->add_option("name", demo_name, "overflow (default): inf in a T5 feed-forward; fp8: delayed-scaling drift")
      ->check(CLI::IsMember({"overflow", "fp8"}));

  std::string replay_dir;
  auto* replay = app.add_subcommand("replay", "re-run the op saved beside a report (DIR: sentinel_batch<N>_dump): exit 3 if it makes inf/nan again");
  replay->add_option("dir", replay_dir, "the dump directory")->required();

  std::string ranks_dir;
  auto* ranks = app.add_subcommand("ranks", "summarize the reports of a run of many ranks (DIR/rank<R>/): exit 3 if any rank tripped");
  ranks->add_option("dir", ranks_dir, "the run's report directory")->required();

  std::string report_path, report_html;
  bool report_text = false;
  auto* report = app.add_subcommand("report", "render a saved report or trace (FILE.json) again: text, or an HTML page");
  report->add_option("file", report_path, "a report or trace written by the watchdog (.json)")->required();
  report->add_option("--html", report_html, "write a self-contained HTML page with plots here");
  report->add_flag("--text", report_text, "print the text report (the default without --html)");

  std::string diff_a, diff_b, diff_html;
  double rtol = 1e-2, atol = 1e-6;
  auto* diff = app.add_subcommand(
      "diff", "compare two traces of one model (sentinel_trace_batch<N>.json): exit 0 same, 5 diverged, 6 not comparable");
  diff->add_option("a", diff_a, "trace A (e.g. the float32 run)")->required();
  diff->add_option("b", diff_b, "trace B (e.g. the bfloat16 run)")->required();
  diff->add_option("--rtol", rtol, "relative tolerance (default 1e-2)")->check(kTolerance);
  diff->add_option("--atol", atol, "absolute tolerance (default 1e-6)")->check(kTolerance);
  diff->add_option("--html", diff_html, "also write the comparison as an HTML page with a plot");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return sentinel::cli::kUsageError;
  }

  try {
    if (ranks->parsed()) return sentinel::cli::summarize_ranks(ranks_dir, std::cout, std::cerr);
    if (replay->parsed()) return sentinel::cli::replay_dump(replay_dir, std::cout);
    if (report->parsed()) return sentinel::cli::render_report(report_path, report_html, report_text, std::cout);
    if (diff->parsed()) return sentinel::cli::diff_traces(diff_a, diff_b, rtol, atol, diff_html, std::cout);
    if (run->parsed()) {
      auto options = run_flags.options();
      options.validate();
      auto model = sentinel::cli::load_model(model_path);
      auto batches = sentinel::cli::load_batches(inputs_path);
      if (!run_dtype.empty()) sentinel::cli::cast_floating(model, batches, run_dtype);
      sentinel::cli::move_to_device(model, batches, run_device);
      return sentinel::cli::run_batches(model, batches, options);
    }
    auto options = demo_flags.options();
    options.validate();
    if (demo_name == "fp8") return sentinel::cli::run_fp8_demo(options);
    std::cout << "sentinel demo: a T5-style encoder (TorchScript) whose gated-GELU feed-forward overflows float32\n"
              << "at batch " << sentinel::demo::kOverflowBatch << " as its inputs grow.\n";
    auto model = sentinel::demo::make_t5_encoder();
    auto batches = sentinel::demo::make_batches();
    sentinel::cli::move_to_device(model, batches, demo_device);
    return sentinel::cli::run_batches(model, batches, options);
  } catch (const sentinel::OptionError& e) {
    std::cerr << message(e) << "\n";
    return sentinel::cli::kUsageError;
  } catch (const sentinel::InputError& e) {
    std::cerr << message(e) << "\n";
    return sentinel::cli::kInputError;
  } catch (const std::exception& e) {
    std::cerr << "sentinel: internal error: " << e.what() << "\n";
    return sentinel::cli::kInternalError;
  }
}

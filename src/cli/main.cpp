// sentinel: run a TorchScript model under the watchdog, or the embedded demo.
//   sentinel                      # the demo
//   sentinel demo [fp8] [--report-dir D] [--recipes delayed,current,mxfp8,nvfp4,float8block]
//   sentinel run --model M.pt --inputs B.pt [--max-frames N] [--trace-batches 1,3]
//                [--abort-after N] [--report-dir D] [--warn] [--set NAME=VALUE ...]
//                [--config C.yaml] [--log-dir D] [--loggers file,jsonl,tensorboard]
//                [--log-tensor-name-pattern P] [--log-tensor-interval N] [--save-tensor] [--save-tensor-dir D]
//                [--recipes delayed,current,mxfp8,nvfp4,float8block] [--mx-scale-rule round_up|ocp_floor]
//                [--dtype bfloat16|float16|float32] [--device cpu|cuda|cuda:N]
//   sentinel options               # every option, as docs/options.md
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
#include "cli/option_flags.h"
#include "cli/ranks_command.h"
#include "cli/replay_command.h"
#include "cli/report_command.h"
#include "cli/run_command.h"
#include "options/option_table.h"

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Overflow Sentinel " SENTINEL_VERSION_STRING
               ": stops a LibTorch model at the first inf/nan and shows where it came from"};
  app.set_version_flag("--version", SENTINEL_VERSION_STRING);
  app.require_subcommand(0, 1);

  sentinel::cli::OptionFlags run_flags, demo_flags;
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

  app.add_subcommand("options", "print every option: its name, what it takes, its default (docs/options.md)");

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
    if (app.got_subcommand("options")) {
      std::cout << sentinel::options::options_markdown();
      return 0;
    }
    if (ranks->parsed()) return sentinel::cli::summarize_ranks(ranks_dir, std::cout, std::cerr);
    if (replay->parsed()) return sentinel::cli::replay_dump(replay_dir, std::cout);
    if (report->parsed()) return sentinel::cli::render_report(report_path, report_html, report_text, std::cout);
    if (diff->parsed()) return sentinel::cli::diff_traces(diff_a, diff_b, rtol, atol, diff_html, std::cout);
    if (run->parsed()) {
      auto options = run_flags.options();
      auto model = sentinel::cli::load_model(model_path);
      auto batches = sentinel::cli::load_batches(inputs_path);
      if (!run_dtype.empty()) sentinel::cli::cast_floating(model, batches, run_dtype);
      sentinel::cli::move_to_device(model, batches, run_device);
      return sentinel::cli::run_batches(model, batches, options);
    }
    auto options = demo_flags.options();
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

#include "cli/fp8_demo.h"

#include <sentinel/sentinel.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <iostream>
#include <sstream>

#include "cli/run_command.h"

namespace sentinel {
namespace cli {

namespace {

struct ProjectionImpl : torch::nn::Module {
  ProjectionImpl() {
    proj = register_module("proj", torch::nn::Linear(64, 64));
    out = register_module("out", torch::nn::Linear(64, 16));
  }
  torch::Tensor forward(torch::Tensor x) { return out(torch::gelu(proj(x))); }
  torch::nn::Linear proj{nullptr}, out{nullptr};
};
TORCH_MODULE(Projection);

}  // namespace

int run_fp8_demo(const Options& base) {
  std::ostream& out = base.output();
  out << "sentinel demo fp8: the input of a projection grows step by step (x1.0 for 4 steps, then x1.05, x1.1,\n"
         "x1.2, x1.35, x1.6, x2.0). Delayed scaling (E4M3, amax history 16, max) sets each step's scale from\n"
         "earlier amaxes, so it lags; the drift alarm (log2(delayed/current) > 0.25) fires before the\n"
         "overflow alarm (> 1% of elements).\n\n";
  torch::manual_seed(0);
  Projection model;
  std::vector<Report> alarms;
  auto options = base;
  options.fp8(Fp8Options()
                  .enabled(true)
                  .layers("proj")
                  .recipe(fp8::Recipe().amax_history_len(16))
                  .drift_alarm(0.25)
                  .overflow_alarm(0.01)
                  .alarm_action(Action::Callback)
                  .recipes(base.fp8().recipes())
                  .mx_scale_rule(base.fp8().mx_scale_rule()));
  options.callback([&](const Report& r) { alarms.push_back(r); });
  DebugUnderflowOverflow debug(model, options);
  torch::NoGradGuard no_grad;
  const double growth[] = {1.0, 1.0, 1.0, 1.0, 1.05, 1.1, 1.2, 1.35, 1.6, 2.0};
  double scale = 1.0;
  const auto base_input = torch::randn({256, 64});
  out << "step     amax  delayed scale  current scale   drift  overflow  underflow  sqnr dB  alarm\n";
  for (int step = 0; step < 10; ++step) {
    scale *= growth[step];
    const size_t alarms_before = alarms.size();
    try {
      debug.forward(base_input * scale);
    } catch (const AbortAfterBatch& e) {
      out << "stopped after batch " << e.batch() << " (--abort-after)\n";
      return alarms.empty() ? kClean : kNonFinite;
    }
    for (const auto& m : debug.fp8_metrics()) {
      if (m.module_path != "proj" || m.role != "activation" || m.recipe != "delayed") continue;
      out << fmt::format("{:4} {:8.3f} {:14.4f} {:14.4f} {:+7.2f} {:8.3f}% {:9.3f}% {:8.1f}  ", m.step, m.cur_amax,
                         m.delayed_scale, m.current_scale, m.drift_log2, m.overflow_pct, m.underflow_pct, m.sqnr_db);
    }
    if (alarms.size() > alarms_before) {
      for (const auto& a : alarms.back().fp8_alarms) {
        if (a.metrics.module_path == "proj" && a.metrics.role == "activation") out << a.reason;
      }
    }
    out << "\n";
  }
  if (options.fp8().recipes().size() > 1 || options.fp8().recipes().front() != fp8::ScalingRecipe::Delayed) {
    out << "\nThe recipes side by side at the last step (" << fp8::mx_scale_rule_name(options.fp8().mx_scale_rule())
        << " MXFP8 exponents):\n"
        << render_fp8_recipe_table(debug.fp8_metrics());
  }
  if (alarms.empty()) {
    out << "\nno FP8 alarm\n";
    return kClean;
  }
  out << "\nThe first alarm, as the watchdog reports it:\n" << render_text(alarms.front());
  return kNonFinite;
}

}  // namespace cli
}  // namespace sentinel

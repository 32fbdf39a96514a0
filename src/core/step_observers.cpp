#include "core/step_observers.h"

#include <sentinel/errors.h>

#include <algorithm>
#include <ostream>
#include <regex>

#include <fmt/format.h>

#include "report/report_files.h"

namespace sentinel::core {

StepObservers::StepObservers(const Options& opts)
    : opts_(opts),
      fp8_(collect::fp8_options_for(opts)),
      collector_(opts.stats_collections()),
      dumper_(opts.dumps(), opts.log_dir()) {}

void StepObservers::attach(const std::vector<std::string>& modules, int64_t rank, int64_t world_size) {
  collector_.check_layers(modules);
  if (fp8_.enabled()) {
    // A layer selection that selects nothing is a mistake (a typo, another model's names): said
    // now rather than discovered after a long run with no metrics.
    const std::regex layers(fp8_.options().layers(), std::regex::ECMAScript);
    if (std::none_of(modules.begin(), modules.end(), [&](const std::string& p) { return std::regex_match(p, layers); })) {
      throw OptionError(fmt::format("sentinel: fp8 layers '{}' match none of the model's {} modules",
                                    fp8_.options().layers(), modules.size()));
    }
  }
  if (!collector_.enabled() && opts_.custom_loggers().empty() && !dumper_.enabled()) return;
  std::vector<std::string> lines = collector_.describe(modules);
  if (dumper_.enabled()) {
    const DumpOptions& d = opts_.dumps();
    lines.push_back(fmt::format("save_tensor: layers '{}' freq {} start_step {} end_step {} into {} (max_bytes {})",
                                d.layers(), d.freq(), d.start_step(), d.end_step(), dumper_.dir(), d.max_bytes()));
  }
  loggers_ = std::make_unique<loggers::LoggerSet>(opts_, rank, world_size, lines);
}

std::optional<Report> StepObservers::close_step(const frames::PlaceTable& places, const std::string& files_dir) {
  std::optional<Report> alarm;
  std::vector<Fp8SlotMetrics> step_metrics;  // of this step only (last_fp8_metrics_ may be older)
  if (fp8_.enabled() && fp8_.step_open()) {
    std::vector<Fp8Alarm> alarms;
    last_fp8_metrics_ = step_metrics = fp8_.end_step(alarms);
    if (!files_dir.empty()) {
      const std::string error = report::append_fp8_metrics(files_dir, last_fp8_metrics_);
      if (!error.empty()) opts_.output() << "sentinel: " << error << "\n" << std::flush;
    }
    if (!alarms.empty()) {
      alarm.emplace();
      alarm->kind = "fp8_alarm";
      alarm->batch_number = alarms.front().metrics.step;
      alarm->fp8_alarms = std::move(alarms);
      alarm->fp8_metrics = last_fp8_metrics_;
    }
  }
  if (collector_.step_open()) {
    last_stats_ = collector_.end_step(step_metrics, places);
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queued_.insert(queued_.end(), last_stats_.begin(), last_stats_.end());
  }
  return alarm;
}

void StepObservers::log_stats() {
  std::lock_guard<std::mutex> one_at_a_time(logging_mutex_);
  std::vector<StatRecord> records;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    records.swap(queued_);
  }
  if (loggers_ && !records.empty()) loggers_->log(records, opts_.output());
}

void StepObservers::flush_loggers() {
  // Called as the watchdog goes, when no step is being logged: without the logging lock, so that
  // a logger that destroys the watchdog from inside log() does not wait on itself.
  if (loggers_) loggers_->flush(opts_.output());
}

}  // namespace sentinel::core

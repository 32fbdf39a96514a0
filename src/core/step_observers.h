#pragma once
// What watches each step beside detection, with its state: the FP8 monitor (slots, scalers, metrics,
// alarms), the statistics collections, the loggers they and the user's loggers write to, and the
// tensor dumps. The watchdog feeds them from its reads and closes the step; they never see a frame.
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "collect/stats_collector.h"
#include "dumps/tensor_dumps.h"
#include "fp8/fp8_monitor.h"
#include "frames/string_table.h"
#include "loggers/stats_loggers.h"

namespace sentinel::core {

class StepObservers {
 public:
  // `opts` outlives this. Throws OptionError for what the FP8 monitor or the collections cannot take.
  explicit StepObservers(const Options& opts);

  Fp8Monitor& fp8() { return fp8_; }
  collect::StatsCollector& collector() { return collector_; }
  dumps::TensorDumper& dumper() { return dumper_; }
  // Whether any of them reads GEMM operands (only then are an op's operands looked up).
  bool want_operands() const { return fp8_.enabled() || collector_.enabled() || dumper_.enabled(); }

  // Once the model's modules are known: the selections checked against them (one that selects
  // nothing is an OptionError), the loggers opened with the lines describing what is collected.
  void attach(const std::vector<std::string>& module_paths, int64_t rank, int64_t world_size);

  // Closes the open step (under the watchdog's lock): the FP8 metrics, appended to
  // `files_dir`/fp8_metrics.jsonl ("" for none), and an alarm report when a threshold is crossed;
  // the collections' records queued for the loggers.
  std::optional<Report> close_step(const frames::PlaceTable& places, const std::string& files_dir);
  // The queued records to the loggers, one call at a time. Without the watchdog's lock: a user's
  // logger may call the watchdog.
  void log_stats();
  // The loggers' last words, as the watchdog is destroyed.
  void flush_loggers();

  const std::vector<Fp8SlotMetrics>& last_fp8_metrics() const { return last_fp8_metrics_; }
  const std::vector<StatRecord>& last_stats() const { return last_stats_; }

 private:
  const Options& opts_;
  Fp8Monitor fp8_;
  std::vector<Fp8SlotMetrics> last_fp8_metrics_;  // of the last closed step
  collect::StatsCollector collector_;
  std::vector<StatRecord> last_stats_;            // of the last closed step
  dumps::TensorDumper dumper_;
  std::unique_ptr<loggers::LoggerSet> loggers_;
  std::mutex queue_mutex_;
  std::vector<StatRecord> queued_;                // closed steps' records not yet logged
  std::mutex logging_mutex_;                      // a logger is never called concurrently
};

}  // namespace sentinel::core

#pragma once
// Loggers of the statistics collections (Options::stats_collections): one record per layer,
// tensor, statistic and step. The built-in loggers ("file", "jsonl", "tensorboard") write under
// Options::log_dir; a logger of your own is given the same records:
//
//   struct Printer : sentinel::StatsLogger {
//     void log(const std::vector<sentinel::StatRecord>& records) override { ... }
//   };
//   sentinel::Options().add_logger(std::make_shared<Printer>());
#include <cstdint>
#include <string>
#include <vector>

namespace sentinel {

struct StatRecord {
  int64_t step = 0;
  std::string layer;   // module path
  std::string tensor;  // "activation", "weight" or "gradient"
  std::string stat;    // sentinel::stat_name: "min", "l2_norm", "underflows", ...
  double value = 0;
};

class StatsLogger {
 public:
  virtual ~StatsLogger() = default;
  // Every record of one step, when the step closes (batch end, or after the backward). Called on
  // the thread that closes the step, never concurrently with itself. An exception is reported
  // once and the logger is dropped: it never stops the model.
  virtual void log(const std::vector<StatRecord>& records) = 0;
  // When the watchdog is destroyed.
  virtual void flush() {}
};

}  // namespace sentinel

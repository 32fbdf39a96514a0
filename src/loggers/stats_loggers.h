#pragma once
// The loggers of the statistics collections: the built-in ones under Options::log_dir (the file
// layout of TransformerEngine's debug tools, JSON lines, TensorBoard) and the user's own.
#include <sentinel/loggers.h>
#include <sentinel/options.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace sentinel {
namespace loggers {

class LoggerSet {
 public:
  // Opens the loggers and writes the debug log (<log_dir>/debug_logs/), which names the config,
  // the collections and the layers each selects (`debug_lines`). Throws sentinel::OptionError for
  // an unknown logger name or a log_dir that cannot be written.
  LoggerSet(const Options& options, int64_t rank, int64_t world_size, const std::vector<std::string>& debug_lines);
  ~LoggerSet();
  LoggerSet(const LoggerSet&) = delete;
  LoggerSet& operator=(const LoggerSet&) = delete;

  bool empty() const { return loggers_.empty(); }
  // Never throws: a logger that fails is named once on `out` and dropped; the others go on.
  void log(const std::vector<StatRecord>& records, std::ostream& out);
  void flush(std::ostream& out);
  // Where the built-in loggers write (for the tests and the CLI's summary).
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  struct Entry {
    std::string name;
    std::shared_ptr<StatsLogger> logger;
  };
  std::vector<Entry> loggers_;
  std::vector<std::string> paths_;
};

// "file", "jsonl", "tensorboard": the built-in loggers' names.
bool is_builtin_logger(const std::string& name);

}  // namespace loggers
}  // namespace sentinel

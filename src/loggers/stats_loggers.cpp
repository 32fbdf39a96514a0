#include "loggers/stats_loggers.h"
#include "report/json_text.h"

#include <sentinel/errors.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <ostream>

#include "loggers/tensorboard/tensorboard_writer.h"

namespace sentinel {
namespace loggers {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string layer_name(const std::string& path) { return path.empty() ? "root" : path; }

// A text file written line by line; every write is checked, so a full disk is said, not lost.
class TextFile {
 public:
  explicit TextFile(const fs::path& path) : path_(path.string()) {
    file_ = std::fopen(path_.c_str(), "a");
    if (!file_) throw OptionError(fmt::format("sentinel: cannot open log file '{}': {}", path_, std::strerror(errno)));
  }
  ~TextFile() {
    if (file_) std::fclose(file_);
  }
  void write(const std::string& text) {
    if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
      throw std::runtime_error(fmt::format("cannot write to '{}': {}", path_, std::strerror(errno)));
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// <log_dir>/debug_statistics_logs/: one line per layer, tensor, statistic and step.
class FileLogger : public StatsLogger {
 public:
  explicit FileLogger(const fs::path& path) : file_(path) {}
  void log(const std::vector<StatRecord>& records) override {
    std::string text;
    for (const auto& r : records) {
      text += fmt::format("{}_{}_{} \t\t iteration={:06d} \t\t value={:.6e}\n", layer_name(r.layer), r.tensor, r.stat,
                          r.step, r.value);
    }
    file_.write(text);
  }
  const std::string& path() const { return file_.path(); }

 private:
  TextFile file_;
};

// JSON lines with every digit (a float64 prints exactly in 17 significant digits); a
// non-finite value is written as the string "nan", "inf" or "-inf".
class JsonLinesLogger : public StatsLogger {
 public:
  JsonLinesLogger(const fs::path& path, int64_t rank) : file_(path), rank_(rank) {}
  void log(const std::vector<StatRecord>& records) override {
    std::string text;
    for (const auto& r : records) {
      nlohmann::json j = {{"step", r.step}, {"layer", r.layer}, {"tensor", r.tensor}, {"stat", r.stat}, {"rank", rank_}};
      if (std::isfinite(r.value)) {
        j["value"] = r.value;
      } else {
        j["value"] = std::isnan(r.value) ? "nan" : (r.value > 0 ? "inf" : "-inf");
      }
      text += report::json_text(j) + "\n";
    }
    file_.write(text);
  }
  const std::string& path() const { return file_.path(); }

 private:
  TextFile file_;
  int64_t rank_;
};

// TensorBoard scalars tagged <layer>/<tensor>_<stat>, so that TensorBoard groups them by layer.
class TensorBoardLogger : public StatsLogger {
 public:
  explicit TensorBoardLogger(const fs::path& dir) : writer_(dir.string()) {}
  void log(const std::vector<StatRecord>& records) override {
    // One event per step: the records of a step share it.
    std::vector<std::pair<std::string, float>> values;
    int64_t step = records.empty() ? 0 : records.front().step;
    for (const auto& r : records) {
      if (r.step != step && !values.empty()) {
        writer_.add_scalars(values, step, now_seconds());
        values.clear();
      }
      step = r.step;
      values.emplace_back(fmt::format("{}/{}_{}", layer_name(r.layer), r.tensor, r.stat), static_cast<float>(r.value));
    }
    if (!values.empty()) writer_.add_scalars(values, step, now_seconds());
    writer_.flush();
  }
  void flush() override { writer_.flush(); }
  const std::string& path() const { return writer_.path(); }

 private:
  TensorBoardWriter writer_;
};

fs::path make_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw OptionError(fmt::format("sentinel: log directory '{}' cannot be created: {}", dir.string(),
                                  ec ? ec.message() : "not a directory"));
  }
  return dir;
}

}  // namespace

bool is_builtin_logger(const std::string& name) { return name == "file" || name == "jsonl" || name == "tensorboard"; }

LoggerSet::LoggerSet(const Options& options, int64_t rank, int64_t world_size,
                     const std::vector<std::string>& debug_lines) {
  for (const auto& name : options.loggers()) {
    if (!is_builtin_logger(name)) {
      throw OptionError(fmt::format("sentinel: unknown logger '{}' (expected file, jsonl or tensorboard)", name));
    }
  }
  if (!options.log_dir().empty()) {
    const fs::path root = options.log_dir();
    const std::string file_name = fmt::format("sentinel_rank-{}", rank);
    TextFile debug(make_dir(root / "debug_logs") / (file_name + ".log"));
    std::time_t t = std::time(nullptr);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    std::string text = fmt::format("{} sentinel debug log, rank {} of {}\n", when, rank, world_size);
    text += fmt::format("config: {}\n", options.config_path().empty() ? "(none: options set in code)" : options.config_path());
    text += fmt::format("loggers: {}\n", fmt::join(options.loggers(), ", "));
    for (const auto& line : debug_lines) text += line + "\n";
    for (const auto& note : options.config_notes()) text += "not applied: " + note + "\n";
    debug.write(text);
    paths_.push_back(debug.path());

    for (const auto& name : options.loggers()) {
      if (name == "file") {
        auto logger = std::make_shared<FileLogger>(make_dir(root / "debug_statistics_logs") / (file_name + ".log"));
        paths_.push_back(logger->path());
        loggers_.push_back({name, logger});
      } else if (name == "jsonl") {
        auto logger = std::make_shared<JsonLinesLogger>(make_dir(root / "debug_statistics_logs") / (file_name + ".jsonl"), rank);
        paths_.push_back(logger->path());
        loggers_.push_back({name, logger});
      } else if (name == "tensorboard") {
        fs::path dir = root / "tensorboard";
        if (world_size > 1) dir /= fmt::format("rank{}", rank);  // one TensorBoard run per rank
        try {
          auto logger = std::make_shared<TensorBoardLogger>(make_dir(dir));
          paths_.push_back(logger->path());
          loggers_.push_back({name, logger});
        } catch (const std::runtime_error& e) {
          throw OptionError(fmt::format("sentinel: tensorboard logger: {}", e.what()));
        }
      }
    }
  }
  for (const auto& logger : options.custom_loggers()) {
    if (logger) loggers_.push_back({"custom", logger});
  }
}

LoggerSet::~LoggerSet() = default;

void LoggerSet::log(const std::vector<StatRecord>& records, std::ostream& out) {
  if (records.empty()) return;
  for (auto it = loggers_.begin(); it != loggers_.end();) {
    try {
      it->logger->log(records);
      ++it;
    } catch (const std::exception& e) {
      out << fmt::format("sentinel: the {} logger failed and is dropped: {}\n", it->name, e.what()) << std::flush;
      it = loggers_.erase(it);
    } catch (...) {
      out << fmt::format("sentinel: the {} logger failed and is dropped\n", it->name) << std::flush;
      it = loggers_.erase(it);
    }
  }
}

void LoggerSet::flush(std::ostream& out) {
  for (auto& entry : loggers_) {
    try {
      entry.logger->flush();
    } catch (const std::exception& e) {
      out << fmt::format("sentinel: the {} logger could not flush: {}\n", entry.name, e.what()) << std::flush;
    } catch (...) {
      out << fmt::format("sentinel: the {} logger could not flush\n", entry.name) << std::flush;
    }
  }
}

}  // namespace loggers
}  // namespace sentinel

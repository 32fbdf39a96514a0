#include "report/report_files.h"

#include <sentinel/errors.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "report/html_report.h"
#include "report/json_read.h"

namespace sentinel {
namespace report {

namespace fs = std::filesystem;

void prepare_report_dir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw OptionError("sentinel: report_dir '" + dir + "' cannot be created: " + ec.message());
  if (!fs::is_directory(dir)) throw OptionError("sentinel: report_dir '" + dir + "' is not a directory");
  const fs::path probe = fs::path(dir) / ".sentinel_write_test";
  {
    std::ofstream f(probe);
    if (!f || !(f << "ok") || !f.flush()) {
      throw OptionError("sentinel: report_dir '" + dir + "' is not writable: " + std::strerror(errno));
    }
  }
  fs::remove(probe, ec);
}

std::string append_fp8_metrics(const std::string& dir, const std::vector<Fp8SlotMetrics>& metrics) {
  const fs::path path = fs::path(dir) / "fp8_metrics.jsonl";
  std::ofstream f(path, std::ios::app);
  for (const auto& m : metrics) f << fp8_metrics_json_line(m) << "\n";
  if (!f || !f.flush()) return "could not append to " + path.string() + ": " + std::strerror(errno);
  return "";
}

std::string write_report_files(const std::string& dir, const Report& report, const std::string& text) {
  // Many ranks write into rank<R>/ directories of their own: the names need no rank.
  const char* kind = report.kind == "fp8_alarm"        ? "sentinel_fp8_alarm_batch"
                     : report.kind == "peer_nonfinite" ? "sentinel_peer_batch"
                     : report.kind == "ranks_missing"  ? "sentinel_ranks_missing_batch"
                     : report.kind == "trace"          ? "sentinel_trace_batch"
                                                       : "sentinel_batch";
  const std::string stem = kind + std::to_string(report.batch_number);
  std::string errors;
  auto write = [&](const std::string& name, const std::string& content) {
    const fs::path path = fs::path(dir) / name;
    std::ofstream f(path);
    if (!f || !(f << content) || !f.flush()) {
      errors += (errors.empty() ? "" : "; ") + std::string("could not write ") + path.string() + ": " +
                std::strerror(errno);
    }
  };
  write(stem + ".txt", text);
  write(stem + ".json", render_json(report));
  // The page plots the FP8 slots over the steps logged so far in this directory.
  int64_t unreadable = 0;
  write(stem + ".html", render_html(report, fp8_history_in(dir, unreadable)));
  return errors;
}

}  // namespace report
}  // namespace sentinel

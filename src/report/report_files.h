#pragma once
#include <sentinel/report.h>

#include <string>
#include <vector>

namespace sentinel {
namespace report {

// Creates the directory and proves it writable; throws sentinel::OptionError naming it if not.
void prepare_report_dir(const std::string& dir);
// Appends one JSON line per slot to <dir>/fp8_metrics.jsonl; returns "" or what went wrong.
std::string append_fp8_metrics(const std::string& dir, const std::vector<Fp8SlotMetrics>& metrics);
// Writes <dir>/sentinel_batch<N>.txt, .json and .html (sentinel_fp8_alarm_batch<N>.* for FP8
// alarms, sentinel_peer_batch<N>.* and sentinel_ranks_missing_batch<N>.* for the ranks' reports,
// sentinel_trace_batch<N>.* for traced batches); returns "" or what went wrong (never throws: the
// report must not be lost because a file could not be written).
std::string write_report_files(const std::string& dir, const Report& report, const std::string& text);

}  // namespace report
}  // namespace sentinel

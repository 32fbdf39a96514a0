#pragma once
// Reports and traces read back from their JSON (reports/report.schema.json), so that a saved
// report can be rendered again and two traces compared.
#include <sentinel/report.h>

#include <string>
#include <vector>

namespace sentinel {
namespace report {

// Parses a report written by render_json. `source` names the text in errors ("out/x.json").
// Throws sentinel::InputError naming the source and the first key that is missing, of the wrong
// type or of an unknown value, or the schema version when it is newer than this build reads.
Report parse_report_json(const std::string& text, const std::string& source);
// Reads and parses a file; InputError when it cannot be read.
Report read_report_file(const std::string& path);

// The lines of an fp8_metrics.jsonl, in order. Lines that do not parse are skipped and counted
// in `skipped` (a log cut short by a crash keeps its earlier steps); at most `max_lines` are kept,
// the last ones.
std::vector<Fp8SlotMetrics> read_fp8_metrics_log(const std::string& path, size_t max_lines, int64_t& skipped);
// The FP8 history an HTML page plots: <dir>/fp8_metrics.jsonl (its last 200,000 lines), or none.
std::vector<Fp8SlotMetrics> fp8_history_in(const std::string& dir, int64_t& skipped);

}  // namespace report
}  // namespace sentinel

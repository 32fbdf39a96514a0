#include "cli/report_command.h"

#include <sentinel/errors.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>

#include "cli/run_command.h"
#include "report/compare_report.h"
#include "report/html_report.h"
#include "report/json_read.h"
#include "report/trace_diff.h"

namespace sentinel {
namespace cli {

namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  if (!f || !(f << content) || !f.flush()) throw InputError("sentinel: cannot write '" + path + "'");
}

// A compare's report (overflow_sentinel.compare, `"kind": "compare"`) is rendered as such; any
// other JSON is read as a watchdog's report.
bool render_compare(const std::string& path, const std::string& html_out, bool text, std::ostream& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  const std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!report::is_compare_json(content)) return false;
  const report::CompareReport compare = report::parse_compare_json(content, path);
  if (text || html_out.empty()) out << report::render_compare_text(compare);
  if (!html_out.empty()) {
    write_file(html_out, report::render_compare_html(compare));
    out << "wrote " << html_out << "\n";
  }
  return true;
}

}  // namespace

int render_report(const std::string& path, const std::string& html_out, bool text, std::ostream& out) {
  if (render_compare(path, html_out, text, out)) return kClean;
  const Report report = report::read_report_file(path);
  if (text || html_out.empty()) out << render_text(report);
  if (!html_out.empty()) {
    int64_t skipped = 0;
    const std::string dir = fs::path(path).parent_path().string();
    const auto history = report::fp8_history_in(dir.empty() ? "." : dir, skipped);
    if (skipped > 0) out << "sentinel: " << skipped << " lines of the FP8 metrics log did not parse; left out\n";
    write_file(html_out, report::render_html(report, history));
    out << "wrote " << html_out << "\n";
  }
  return kClean;
}

int diff_traces(const std::string& a, const std::string& b, double rtol, double atol, const std::string& html_out,
                std::ostream& out) {
  report::TraceDiff diff = report::diff_traces(report::read_report_file(a), report::read_report_file(b), rtol, atol);
  diff.name_a = a;
  diff.name_b = b;
  out << report::render_diff_text(diff);
  if (!html_out.empty()) {
    write_file(html_out, report::render_diff_html(diff));
    out << "wrote " << html_out << "\n";
  }
  switch (diff.verdict) {
    case report::DiffVerdict::Same: return kClean;
    case report::DiffVerdict::Diverged: return kDiverged;
    case report::DiffVerdict::NotComparable: return kNotComparable;
  }
  return kInternalError;
}

}  // namespace cli
}  // namespace sentinel

#pragma once
// `sentinel report` renders a saved report or trace again; `sentinel diff` finds where two traces
// of the same model part.
#include <iosfwd>
#include <string>

namespace sentinel {
namespace cli {

// Exit codes of `sentinel diff` beside run_command.h's: the traces agree (kClean), part
// (kDiverged), or cannot be compared (kNotComparable).
constexpr int kDiverged = 5;
constexpr int kNotComparable = 6;

// Prints the text (HF's layout) when `text` or when no HTML is asked for; writes the HTML page to
// `html_out` when given, with the FP8 history from the fp8_metrics.jsonl beside the report.
// Throws sentinel::InputError for an unreadable or malformed report.
int render_report(const std::string& path, const std::string& html_out, bool text, std::ostream& out);

int diff_traces(const std::string& a, const std::string& b, double rtol, double atol, const std::string& html_out,
                std::ostream& out);

}  // namespace cli
}  // namespace sentinel

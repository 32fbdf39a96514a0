#pragma once
// The report of overflow_sentinel.compare (Python: a port against its reference, module by module)
// read back from its JSON (`"kind": "compare"`) and rendered as text or an HTML page by
// `sentinel report`, with the two sides' modules aligned and the first divergence marked.
#include <cstdint>
#include <string>
#include <vector>

namespace sentinel {
namespace report {

// One boundary's numbers; NaN where the boundary has none (an integer input, no backward).
struct CompareBoundary {
  double error = 0, tolerance = 0, baseline = 0, cosine = 0, within = 0, max_abs = 0;
  std::vector<int64_t> worst_index;
  double worst_candidate = 0, worst_reference = 0;
  bool present = false;
};

struct CompareRow {
  std::string candidate;
  std::vector<std::string> reference;
  std::string matched_by;
  int64_t call = 0;
  CompareBoundary input, output;
  double backward_ratio = 0;  // the worst input or parameter gradient over its tolerance; NaN if none
  bool first = false;
};

struct CompareReport {
  std::string verdict;
  bool agree = true;
  std::string tolerance_format, metric;
  double multiple = 0, floor = 0;
  std::vector<CompareRow> rows;
  std::vector<std::string> only_candidate, only_reference, suggestions, preflight;
};

// True when `text` is a JSON object whose "kind" is "compare".
bool is_compare_json(const std::string& text);
// Throws sentinel::InputError naming `source` and the key that is missing or of the wrong type.
CompareReport parse_compare_json(const std::string& text, const std::string& source);
std::string render_compare_text(const CompareReport& report);
std::string render_compare_html(const CompareReport& report);

}  // namespace report
}  // namespace sentinel

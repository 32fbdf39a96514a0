#include "report/compare_report.h"

#include <sentinel/errors.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "report/svg_plot.h"

namespace sentinel {
namespace report {

namespace {

using Json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

[[noreturn]] void fail(const std::string& source, const std::string& path, const std::string& what) {
  throw InputError(fmt::format("sentinel: {}: {}: {}", source, path, what));
}

const Json& at(const Json& j, const std::string& key, const std::string& path, const std::string& source) {
  if (!j.is_object()) fail(source, path, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) fail(source, path.empty() ? key : path + "." + key, "missing");
  return *it;
}

// Numbers, null (none: NaN) and the strings "inf", "-inf", "nan" the writer uses for what JSON cannot hold.
double number(const Json& j, const std::string& path, const std::string& source) {
  if (j.is_number()) return j.get<double>();
  if (j.is_null()) return kNaN;
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return kNaN;
  }
  fail(source, path, "expected a number");
}

std::string text(const Json& j, const std::string& path, const std::string& source) {
  if (!j.is_string()) fail(source, path, "expected a string");
  return j.get<std::string>();
}

int64_t integer(const Json& j, const std::string& path, const std::string& source) {
  if (!j.is_number_integer()) fail(source, path, "expected an integer");
  return j.get<int64_t>();
}

bool boolean(const Json& j, const std::string& path, const std::string& source) {
  if (!j.is_boolean()) fail(source, path, "expected true or false");
  return j.get<bool>();
}

std::vector<std::string> strings(const Json& j, const std::string& path, const std::string& source) {
  if (!j.is_array()) fail(source, path, "expected an array");
  std::vector<std::string> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(text(j[i], fmt::format("{}[{}]", path, i), source));
  return out;
}

CompareBoundary boundary(const Json& parent, const std::string& key, const std::string& path,
                         const std::string& source) {
  CompareBoundary b;
  if (!parent.is_object() || !parent.contains(key)) return b;
  const Json& j = parent.at(key);
  const std::string p = path + "." + key;
  b.present = true;
  b.error = number(at(j, "error", p, source), p + ".error", source);
  b.tolerance = number(at(j, "tolerance", p, source), p + ".tolerance", source);
  auto optional = [&](const char* name) { return j.contains(name) ? number(j.at(name), p + "." + name, source) : kNaN; };
  b.baseline = optional("baseline");
  b.cosine = optional("cosine");
  b.within = optional("within");
  b.max_abs = optional("max_abs");
  if (j.contains("worst") && j.at("worst").is_object()) {
    const Json& w = j.at("worst");
    const Json& index = at(w, "index", p + ".worst", source);
    if (!index.is_array()) fail(source, p + ".worst.index", "expected an array");
    for (const Json& i : index) b.worst_index.push_back(integer(i, p + ".worst.index", source));
    b.worst_candidate = number(at(w, "candidate", p + ".worst", source), p + ".worst.candidate", source);
    b.worst_reference = number(at(w, "reference", p + ".worst", source), p + ".worst.reference", source);
  }
  return b;
}

std::string sci(double x) { return std::isnan(x) ? "-" : fmt::format("{:.3e}", x); }

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string label(const CompareRow& r) {
  const std::string ref = r.reference.size() == 1 ? r.reference[0] : "{" + joined(r.reference) + "}";
  return (r.candidate.empty() ? "(root)" : r.candidate) + " <-> " + (ref.empty() ? "(root)" : ref);
}

}  // namespace

bool is_compare_json(const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("kind") && j.at("kind") == "compare";
}

CompareReport parse_compare_json(const std::string& source_text, const std::string& source) {
  const Json j = Json::parse(source_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(source, "the document", "not JSON");
  CompareReport r;
  r.verdict = text(at(j, "verdict", "", source), "verdict", source);
  r.agree = boolean(at(j, "agree", "", source), "agree", source);
  const Json& tol = at(j, "tolerance", "", source);
  r.tolerance_format = text(at(tol, "format", "tolerance", source), "tolerance.format", source);
  r.metric = text(at(tol, "metric", "tolerance", source), "tolerance.metric", source);
  r.multiple = number(at(tol, "multiple", "tolerance", source), "tolerance.multiple", source);
  r.floor = number(at(tol, "floor", "tolerance", source), "tolerance.floor", source);
  const Json& rows = at(j, "rows", "", source);
  if (!rows.is_array()) fail(source, "rows", "expected an array");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string p = fmt::format("rows[{}]", i);
    const Json& row = rows[i];
    CompareRow out;
    out.candidate = text(at(row, "candidate", p, source), p + ".candidate", source);
    out.reference = strings(at(row, "reference", p, source), p + ".reference", source);
    out.matched_by = text(at(row, "matched_by", p, source), p + ".matched_by", source);
    out.call = integer(at(row, "call", p, source), p + ".call", source);
    out.first = boolean(at(row, "first", p, source), p + ".first", source);
    const Json& forward = at(row, "forward", p, source);
    out.input = boundary(forward, "in", p + ".forward", source);
    out.output = boundary(forward, "out", p + ".forward", source);
    out.backward_ratio = kNaN;
    const Json& backward = at(row, "backward", p, source);
    if (!backward.is_object()) fail(source, p + ".backward", "expected an object");
    for (auto it = backward.begin(); it != backward.end(); ++it) {
      if (it.key() != "gin" && it.key().rfind("p:", 0) != 0) continue;
      const CompareBoundary b = boundary(backward, it.key(), p + ".backward", source);
      const double ratio = b.tolerance > 0 ? b.error / b.tolerance : std::numeric_limits<double>::infinity();
      if (std::isnan(out.backward_ratio) || ratio > out.backward_ratio) out.backward_ratio = ratio;
    }
    r.rows.push_back(std::move(out));
  }
  r.only_candidate = strings(at(j, "only_candidate", "", source), "only_candidate", source);
  r.only_reference = strings(at(j, "only_reference", "", source), "only_reference", source);
  r.suggestions = strings(at(j, "suggestions", "", source), "suggestions", source);
  r.preflight = strings(at(j, "preflight", "", source), "preflight", source);
  return r;
}

std::string render_compare_text(const CompareReport& r) {
  std::string out = r.verdict + "\n\n";
  out += fmt::format("tolerance: {}, {:g} x the baseline's error, floor {:.1e} ({})\n\n", r.metric, r.multiple, r.floor,
                     r.tolerance_format);
  out += fmt::format("  {:60} {:>10} {:>10} {:>10} {:>9} {:>8}\n", "candidate <-> reference", "in err", "out err",
                     "tolerance", "cosine", "bwd/tol");
  for (const CompareRow& row : r.rows) {
    const bool over = (row.output.present && row.output.error > row.output.tolerance) || row.backward_ratio > 1;
    std::string name = label(row) + (row.call ? fmt::format(" #{}", row.call) : "");
    if (name.size() > 60) name.resize(60);
    out += fmt::format("{}{:60} {:>10} {:>10} {:>10} {:>9} {:>8}\n", row.first ? ">>" : over ? "! " : "  ", name,
                       sci(row.input.present ? row.input.error : kNaN), sci(row.output.present ? row.output.error : kNaN),
                       sci(row.output.present ? row.output.tolerance : kNaN),
                       row.output.present ? fmt::format("{:.6f}", row.output.cosine) : "-",
                       std::isnan(row.backward_ratio) ? "-" : fmt::format("{:.2f}", row.backward_ratio));
  }
  if (!r.only_candidate.empty()) out += "\ncandidate only: " + joined(r.only_candidate) + "\n";
  if (!r.only_reference.empty()) out += "reference only: " + joined(r.only_reference) + "\n";
  for (const auto& s : r.suggestions) out += "suggested mapping: " + s + "\n";
  for (const auto& f : r.preflight) out += "pre-flight: " + f + "\n";
  return out;
}

std::string render_compare_html(const CompareReport& r) {
  using svg::escape;
  std::string rows;
  for (const CompareRow& row : r.rows) {
    const bool over = (row.output.present && row.output.error > row.output.tolerance) || row.backward_ratio > 1;
    std::string index;
    for (int64_t i : row.output.worst_index) index += (index.empty() ? "" : ", ") + std::to_string(i);
    rows += fmt::format(
        "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>[{}] {} / {}</td><td>{}</td><td>{}</td></tr>\n",
        row.first ? "first" : over ? "over" : "within", escape(row.candidate.empty() ? "(root)" : row.candidate),
        escape(joined(row.reference).empty() ? "(root)" : joined(row.reference)),
        sci(row.input.present ? row.input.error : kNaN), sci(row.output.present ? row.output.error : kNaN),
        sci(row.output.present ? row.output.tolerance : kNaN), sci(row.output.present ? row.output.baseline : kNaN),
        sci(row.output.present ? row.output.max_abs : kNaN),
        row.output.present && !std::isnan(row.output.within) ? fmt::format("{:.4f}", row.output.within) : "-", index,
        sci(row.output.worst_candidate), sci(row.output.worst_reference),
        std::isnan(row.backward_ratio) ? "-" : fmt::format("{:.2f}", row.backward_ratio), escape(row.matched_by));
  }
  std::string sides;
  for (const auto& p : r.only_candidate) sides += "<li>candidate only: " + escape(p) + "</li>";
  for (const auto& p : r.only_reference) sides += "<li>reference only: " + escape(p) + "</li>";
  for (const auto& s : r.suggestions) sides += "<li>suggested: <code>" + escape(s) + "</code></li>";
  std::string findings;
  for (const auto& f : r.preflight) findings += "<li>" + escape(f) + "</li>";
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>Overflow Sentinel compare</title>\n"
         "<style>body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse;font-size:13px}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} td:first-child,td:nth-child(2),td:last-child"
         "{text-align:left} tr.first{background:#f8b4b4;font-weight:bold} tr.over{background:#fde2c4}"
         ".verdict{font-size:16px;font-weight:bold}</style></head><body>\n<h1>Compare: candidate against reference</h1>\n"
         "<p class=\"verdict\">" +
         escape(r.verdict) + "</p>\n<p>Tolerance: " + escape(r.metric) + fmt::format(", {:g} &times; ", r.multiple) +
         "the baseline's error (the reference run in the candidate's precision), at least " +
         fmt::format("{:.1e}", r.floor) + " (" + escape(r.tolerance_format) +
         "); errors against the reference run in float64.</p>\n"
         "<table><tr><th>candidate</th><th>reference</th><th>input error</th><th>output error</th><th>tolerance</th>"
         "<th>baseline</th><th>max abs</th><th>within</th><th>largest error at: candidate / reference</th>"
         "<th>backward / tol</th><th>matched by</th></tr>\n" +
         rows + "</table>\n<h2>One side only</h2><ul>" + (sides.empty() ? "<li>none</li>" : sides) +
         "</ul>\n<h2>Pre-flight</h2><ul>" + findings + "</ul>\n</body></html>\n";
}

}  // namespace report
}  // namespace sentinel

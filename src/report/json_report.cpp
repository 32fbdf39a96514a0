// The JSON report; its format is described by reports/report.schema.json.
#include <sentinel/report.h>
#include <sentinel/version.h>

#include <cmath>
#include <nlohmann/json.hpp>

namespace sentinel {

namespace {

// JSON has no inf/nan: such values are written as the strings "inf", "-inf", "nan".
nlohmann::json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::json entry_json(const Entry& e) {
  nlohmann::json j{{"label", e.label}, {"kind", to_string(e.kind)}};
  if (!e.dtype.empty()) j["dtype"] = e.dtype;
  if (e.kind == EntryKind::Skipped) j["skip_reason"] = e.skip_reason;
  if (e.kind == EntryKind::Tensor) {
    const auto& s = e.stats;
    j["stats"] = {{"count", s.count},     {"abs_min", number(s.count == s.nan ? NAN : s.abs_min)},
                  {"abs_max", number(s.count == s.nan ? NAN : s.abs_max)},
                  {"nan", s.nan},         {"pos_inf", s.pos_inf},
                  {"neg_inf", s.neg_inf}, {"zeros", s.zeros},
                  {"subnormal", s.subnormal}};
  }
  return j;
}

}  // namespace

std::string render_json(const Report& report) {
  nlohmann::json frames = nlohmann::json::array();
  for (const auto& f : report.frames) {
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& e : f.entries) entries.push_back(entry_json(e));
    frames.push_back({{"batch_number", f.batch_number},
                      {"op_index", f.op_index},
                      {"direction", to_string(f.direction)},
                      {"module_path", f.module_path},
                      {"module_class", f.module_class},
                      {"op", f.op},
                      {"forward_op", f.forward_op},
                      {"attribution", to_string(f.attribution)},
                      {"inputs_finite", f.inputs_finite},
                      {"outputs_finite", f.outputs_finite},
                      {"entries_omitted", f.entries_omitted},
                      {"entries", entries}});
  }
  nlohmann::json j{{"schema_version", SENTINEL_REPORT_SCHEMA_VERSION},
                   {"sentinel_version", SENTINEL_VERSION_STRING},
                   {"kind", "nonfinite"},
                   {"batch_number", report.batch_number},
                   {"rank", report.rank},
                   {"world_size", report.world_size},
                   {"produced_here", report.produced_here},
                   {"origin", report.origin},
                   {"trigger_frame", report.frames.empty() ? 0 : report.frames.size() - 1},
                   {"stack", report.stack},
                   {"torchscript_stack", report.torchscript_stack},
                   {"frames", frames}};
  return j.dump(2) + "\n";
}

}  // namespace sentinel

// The JSON report; its format is described by reports/report.schema.json.
#include <sentinel/report.h>
#include <sentinel/version.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "report/json_text.h"

namespace sentinel {

namespace {

// JSON has no inf/nan: such values are written as the strings "inf", "-inf", "nan".
nlohmann::json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::json entry_json(const Entry& e) {
  nlohmann::json j{{"label", e.label}, {"role", to_string(e.role)}, {"kind", to_string(e.kind)}};
  if (!e.dtype.empty()) j["dtype"] = e.dtype;
  if (e.kind == EntryKind::Skipped) j["skip_reason"] = e.skip_reason;
  if (e.has_headroom) {
    j["headroom"] = {{"fp16_overflow", e.headroom.fp16_overflow}, {"fp16_underflow", e.headroom.fp16_underflow},
                     {"bf16_overflow", e.headroom.bf16_overflow}, {"bf16_underflow", e.headroom.bf16_underflow}};
  }
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

nlohmann::json fp8_metrics_json(const Fp8SlotMetrics& m) {
  nlohmann::json j{{"step", m.step},
          {"module_path", m.module_path},
          {"role", m.role},
          {"recipe", m.recipe},
          {"format", m.format},
          {"uses", m.uses},
          {"cur_amax", number(m.cur_amax)},
          {"delayed_scale", number(m.delayed_scale)},
          {"current_scale", number(m.current_scale)},
          {"drift_log2", number(m.drift_log2)},
          {"count", m.count},
          {"overflow", m.overflow},
          {"underflow", m.underflow},
          {"overflow_pct", number(m.overflow_pct)},
          {"underflow_pct", number(m.underflow_pct)},
          {"mse", number(m.mse)},
          {"cosine", number(m.cosine)},
          {"sqnr_db", number(m.sqnr_db)}};
  if (m.recipe == "mxfp8" || m.recipe == "nvfp4" || m.recipe == "float8block") {
    nlohmann::json scales = nlohmann::json::array();
    for (const auto& [value, blocks] : m.block_scales) scales.push_back({number(value), blocks});
    j["blocks"] = m.blocks;
    j["blocks_zero"] = m.blocks_zero;
    j["blocks_saturated"] = m.blocks_saturated;
    j["blocks_at_min"] = m.blocks_at_min;
    j["blocks_nonfinite"] = m.blocks_nonfinite;
    j["lost"] = m.lost;
    j["block_scales"] = std::move(scales);
  }
  return j;
}


nlohmann::json frame_json(const Frame& f) {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : f.entries) entries.push_back(entry_json(e));
  nlohmann::json j{{"batch_number", f.batch_number},
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
                   {"entries", entries}};
  if (f.recomputed) j["recomputed"] = true;
  if (!f.error.empty()) j["error"] = f.error;
  return j;
}

nlohmann::json tolerated_json(const std::vector<ToleratedCount>& counts) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& c : counts) {
    rows.push_back({{"module_path", c.module_path},
                    {"module_class", c.module_class},
                    {"op", c.op},
                    {"allowed", c.allowed},
                    {"frames", c.frames},
                    {"nan", c.nan},
                    {"pos_inf", c.pos_inf},
                    {"neg_inf", c.neg_inf},
                    {"first_batch", c.first_batch},
                    {"last_batch", c.last_batch}});
  }
  return rows;
}

}  // namespace

std::string fp8_metrics_json_line(const Fp8SlotMetrics& m) { return report::json_text(fp8_metrics_json(m)); }

std::string render_json(const Report& report) {
  nlohmann::json frames = nlohmann::json::array();
  for (const auto& f : report.frames) frames.push_back(frame_json(f));
  nlohmann::json metrics = nlohmann::json::array();
  for (const auto& m : report.fp8_metrics) metrics.push_back(fp8_metrics_json(m));
  nlohmann::json alarms = nlohmann::json::array();
  for (const auto& a : report.fp8_alarms) alarms.push_back({{"reason", a.reason}, {"metrics", fp8_metrics_json(a.metrics)}});
  const RankAgreement& a = report.ranks;
  nlohmann::json first = nullptr;
  if (a.first) {
    first = {{"rank", a.first->rank},
             {"batch_number", a.first->batch_number},
             {"direction", to_string(a.first->direction)},
             {"op_index", a.first->op_index},
             {"frame", a.first->frame},
             {"origin", a.first->origin},
             {"role", to_string(a.first->role)},
             {"host", a.first->host},
             {"local_rank", a.first->local_rank}};
  }
  nlohmann::json ranks{{"exchanged", a.exchanged}, {"role", to_string(a.role)}, {"first", first},
                       {"tripped", a.tripped},     {"missing", a.missing},       {"problem", a.problem},
                       {"host", a.host},           {"local_rank", a.local_rank}};
  nlohmann::json j{{"schema_version", SENTINEL_REPORT_SCHEMA_VERSION},
                   {"sentinel_version", SENTINEL_VERSION_STRING},
                   {"kind", report.kind},
                   {"fp8_metrics", metrics},
                   {"fp8_alarms", alarms},
                   {"batch_number", report.batch_number},
                   {"rank", report.rank},
                   {"world_size", report.world_size},
                   {"ranks", ranks},
                   {"produced_here", report.produced_here},
                   {"origin", report.origin},
                   {"origin_frame", report.origin_frame ? frame_json(*report.origin_frame) : nlohmann::json(nullptr)},
                   {"escape", to_string(report.escape)},
                   {"tolerated", tolerated_json(report.tolerated)},
                   {"trigger_frame", report.frames.empty() ? 0 : report.frames.size() - 1},
                   {"stack", report.stack},
                   {"torchscript_stack", report.torchscript_stack},
                   {"python_stack", report.python_stack},
                   {"deferred", report.deferred},
                   {"frames", frames}};
  if (!report.dump_dir.empty()) j["dump_dir"] = report.dump_dir;
  if (!report.phase.empty()) j["phase"] = report.phase;
  return report::json_text(j, 2) + "\n";
}

}  // namespace sentinel

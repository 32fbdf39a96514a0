#include "report/html_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "report/svg_plot.h"

namespace sentinel {
namespace report {

namespace {

using svg::escape;

constexpr size_t kMaxSlotPlots = 24;     // FP8 slots drawn; the table lists them all
constexpr size_t kTitleLimit = 2000;     // points per series that carry a tooltip, as svg::Chart's default
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr int64_t HeadroomCounts::*kHeadroom[4] = {&HeadroomCounts::fp16_overflow, &HeadroomCounts::fp16_underflow,
                                                   &HeadroomCounts::bf16_overflow, &HeadroomCounts::bf16_underflow};
constexpr const char* kHeadroomNames[4] = {"fp16 overflow", "fp16 underflow", "bf16 overflow", "bf16 underflow"};

// Shown by the script (hidden without it): filters the frame rows of either page.
const char* const kFilterBox = "<input id=\"filter\" type=\"search\" placeholder=\"filter frames\" hidden>\n";

const char* const kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;color:#222;background:#fafafa;margin:16px 24px}h1{font-size:20px;margin:0 0 8px}
h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}h3{font-size:13px;margin:10px 0 4px}
pre,code,td.n,.num{font-family:ui-monospace,Menlo,Consolas,monospace}dt{color:#666}dd{margin:0}.note{color:#666}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0}
.banner{padding:6px 10px;margin:8px 0;border-left:4px solid #d62728;background:#fdecea}
.banner.ok{border-color:#2ca02c;background:#eaf7ea}table{border-collapse:collapse;font-size:12px;background:#fff}
th,td{padding:2px 6px;text-align:left;vertical-align:top;border-bottom:1px solid #eee}th{background:#f0f0f0}
td.n{text-align:right;white-space:nowrap}td.wrap{overflow-wrap:anywhere;max-width:28em}
tr.backward{background:#f8f2ff}tr.nonfinite>td:first-child,tr.diverged>td:first-child{border-left:4px solid #d62728}
tr.origin,tr.first-divergent{background:#fdecea}tr.hl{outline:2px solid #1f77b4}tr.alarm{background:#fff4e5}
table.ent{table-layout:fixed;width:56em;background:transparent}table.ent td,table.ent th{border:0;padding:0 4px}
.ent :is(td,th):first-child{width:10em;overflow-wrap:anywhere}.ent :is(td,th):nth-child(2){width:5em}
.ent :is(td,th):nth-child(n+3){width:3em}.ent :is(td,th):nth-child(-n+4):nth-child(n+3){width:5.2em}
.ent td:nth-child(n+3){text-align:right;font-family:monospace}.ent :is(td,th):nth-child(9){width:auto;text-align:left}
tr.bad td{color:#d62728;font-weight:600}td.skip{color:#888}#filter{margin:4px 0 8px;padding:3px 6px;width:24em}
.pt{cursor:pointer}.pt.bwd{stroke:#333;stroke-width:.7}.pt.hl{stroke:#000;stroke-width:2}.pt-diff.div{fill:#d62728}
svg{display:block;max-width:100%;height:auto}.slot{margin:0 0 12px}.slot svg{display:inline-block;margin-right:12px}
pre{background:#f4f4f4;padding:8px;overflow:auto;font-size:12px}ul.alarms li{background:#fff4e5;padding:2px 6px}
)";

// Readable without it; with it, points lead to their rows, and the tables can be filtered.
const char* const kScript = R"(
(() => {
const row = p => { const s = p.closest('svg'), prefix = s && s.dataset.target || 'frame-';
  const a = document.getElementById(prefix + p.dataset.frame); return a && a.closest('tr'); };
const go = () => {
  const f = document.getElementById('filter');
  if (f) { f.hidden = false; f.addEventListener('input', () => { const q = f.value.toLowerCase();
    document.querySelectorAll('tr.frame,tr.matched').forEach(r => {
      r.style.display = !q || r.textContent.toLowerCase().includes(q) ? '' : 'none'; }); }); }
  document.addEventListener('click', ev => { const p = ev.target.closest('[data-frame]'), r = p && row(p);
    if (!r) return; document.querySelectorAll('.hl').forEach(e => e.classList.remove('hl'));
    r.classList.add('hl'); p.classList.add('hl'); r.scrollIntoView({block: 'center'}); });
  // Big pages leave tooltips out of the file: they are made from the frame's row when needed.
  document.addEventListener('mouseover', ev => { const p = ev.target.closest('[data-frame]'), r = p && row(p);
    if (!r || p.querySelector('title')) return; const t = document.createElementNS(p.namespaceURI, 'title');
    t.textContent = [...r.cells].slice(0, 6).map(c => c.textContent).join(' '); p.appendChild(t); });
  document.body.dataset.rendered = '1'; };
if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', go); else go();
})();
)";

std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" + escape(title) +
         "</title>\n<style>" + kStyle + "</style></head>\n<body>\n" + body + "<script>" + kScript +
         "</script>\n</body></html>\n";
}

// printf's %8.2e without the padding; inf and nan read "inf" and "nan".
std::string sci(double v) { return fmt::format("{:.2e}", v); }

// The entry tables' columns are styled by position: thousands of frames stay small.
std::string count_cell(int64_t n) { return n > 0 ? fmt::format("<td>{}</td>", n) : "<td></td>"; }

std::string path_or_root(const std::string& path) { return path.empty() ? "<root>" : path; }

bool is_backward(const Frame& f) { return f.direction == Direction::Backward; }

// HF's backward layout: "grad of <forward op> <autograd node>".
std::string op_text(const Frame& f) {
  if (is_backward(f)) return "grad of " + (f.forward_op.empty() ? "" : f.forward_op + " ") + f.op;
  return f.recomputed ? f.op + " (recomputed)" : f.op;
}

std::string describe(size_t i, const Frame& f) {
  return fmt::format("#{} {} ({}) {}", i, path_or_root(f.module_path), f.module_class, op_text(f));
}

// What the plot shows of a frame: NaN where there is nothing to place.
struct FrameExtent {
  double abs_max = kNaN, min_nonzero = kNaN;
  bool any_finite = false;
  std::string nonfinite;  // "output: nan 3, inf 1; ..."
};

FrameExtent extent(const Frame& f) {
  FrameExtent x;
  for (const auto& e : f.entries) {
    const TensorStats& s = e.stats;
    if (e.kind != EntryKind::Tensor || s.count == 0) continue;
    if (!s.finite()) {
      x.nonfinite += fmt::format("{}{}: nan {}, inf {}", x.nonfinite.empty() ? "" : "; ", e.label, s.nan,
                                 s.pos_inf + s.neg_inf);
      continue;
    }
    x.any_finite = true;
    x.abs_max = std::isnan(x.abs_max) ? s.abs_max : std::max(x.abs_max, s.abs_max);
    // abs_min counts zeros: an entry holding a zero says nothing about its smallest non-zero value.
    if (s.abs_min > 0 && std::isfinite(s.abs_min)) x.min_nonzero = std::fmin(x.min_nonzero, s.abs_min);
  }
  return x;
}

std::string frames_plot(const Report& report, bool has_trigger) {
  svg::Chart chart(1100, 380, "plot frames-plot", "abs max and smallest non-zero abs per frame");
  chart.set_axes(has_trigger ? "frame (oldest \xe2\x86\x92 trigger)" : "frame (oldest \xe2\x86\x92 newest)",
                 "|x| (log10)", true);
  chart.set_link_prefix("frame-");
  svg::Series max_s{"abs max", "pt pt-absmax", "#1f77b4"}, min_s{"abs min (non-zero)", "pt pt-absmin", "#2ca02c"};
  svg::Series bad{"inf/nan", "pt pt-nonfinite", "#d62728", svg::Marker::Triangle, false};
  const bool titles = report.frames.size() <= kTitleLimit;
  std::vector<bool> backward;
  for (size_t i = 0; i < report.frames.size(); ++i) {
    const Frame& f = report.frames[i];
    const FrameExtent x = extent(f);
    const std::string label = titles ? describe(i, f) + ": " : std::string();
    backward.push_back(is_backward(f));
    auto point = [&](double y, const std::string& title, svg::Pin pin = svg::Pin::None) {
      svg::Point p(static_cast<double>(i), y, titles ? label + title : "");
      p.frame = static_cast<int64_t>(i);
      p.pin = pin;
      if (is_backward(f)) p.set_style(svg::Marker::Square, "bwd");
      return p;
    };
    // All zeros: nothing to place on a log axis, yet the frame was read; shown on the bottom edge.
    const svg::Pin max_pin = x.abs_max > 0 ? svg::Pin::None : svg::Pin::Bottom;
    if (x.any_finite) max_s.points.push_back(point(x.abs_max, "abs max " + sci(x.abs_max), max_pin));
    if (!std::isnan(x.min_nonzero)) min_s.points.push_back(point(x.min_nonzero, "abs min " + sci(x.min_nonzero)));
    if (!x.nonfinite.empty()) bad.points.push_back(point(kNaN, x.nonfinite, svg::Pin::Top));
  }
  chart.shade_runs(backward, "bwd-band", "#f1e8fb", "backward (square markers)");
  const char *fp16 = "#e67e22", *bf16 = "#8e44ad", *fp8 = "#16a085";
  // The fp16 and E4M3 limits are always in view: how far the data stays below them is the point.
  for (const svg::RefLine& r : {svg::RefLine{65504, "fp16 max 65504", fp16, true}, {448, "E4M3 max 448", fp8, true},
                                {57344, "E5M2 max 57344", fp8}, {0x1p-24, "fp16 min subnormal 5.96e-8", fp16},
                                {3.3895313892515355e38, "bf16 max 3.39e38", bf16},
                                {0x1p-126, "bf16 min normal 1.18e-38", bf16}}) {
    chart.add_ref_line(r);
  }
  if (has_trigger) chart.add_marker({static_cast<double>(report.frames.size() - 1), "origin", "origin-line"});
  chart.add_series(std::move(max_s));
  chart.add_series(std::move(min_s));
  if (!bad.points.empty()) chart.add_series(std::move(bad));
  return chart.render();
}

std::string entry_row(const Entry& e) {
  const std::string head =
      "<tr><td>" + escape(e.label) + "</td><td colspan=\"8\" class=\"skip\">";
  switch (e.kind) {
    case EntryKind::None: return head + "None</td></tr>";
    case EntryKind::NotATensor: return head + "not a tensor</td></tr>";
    case EntryKind::Skipped: return head + "skipped: " + escape(e.skip_reason) + "</td></tr>";
    case EntryKind::Tensor: break;
  }
  const TensorStats& s = e.stats;
  std::string headroom;
  for (int k = 0; e.has_headroom && k < 4; ++k) {
    const int64_t n = e.headroom.*kHeadroom[k];
    if (n > 0) headroom += fmt::format("{}{} {}", headroom.empty() ? "" : ", ", kHeadroomNames[k], n);
  }
  if (e.has_headroom && headroom.empty()) headroom = "ok";
  return fmt::format("<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{}{}{}{}<td>{}</td></tr>",
                     s.finite() ? "" : " class=\"bad\"", escape(e.label), escape(e.dtype), sci(s.hf_abs_min()),
                     sci(s.hf_abs_max()), count_cell(s.nan), count_cell(s.pos_inf + s.neg_inf), count_cell(s.zeros),
                     count_cell(s.subnormal), headroom);
}

std::string frame_table(const Report& report, bool has_trigger) {
  std::string out =
      std::string(kFilterBox) + "<table class=\"frames\"><thead><tr>"
      "<th>#</th><th>batch</th><th>dir</th><th>module</th><th>class</th><th>op</th><th><table class=\"ent\"><tr>"
      "<th>entry</th><th>dtype</th><th>abs min</th><th>abs max</th><th>nan</th><th>inf</th><th>zeros</th><th>subn</th>"
      "<th>headroom</th></tr></table></th></tr></thead><tbody>\n";
  for (size_t i = 0; i < report.frames.size(); ++i) {
    const Frame& f = report.frames[i];
    const bool trigger = has_trigger && i + 1 == report.frames.size();
    const bool nonfinite = std::any_of(f.entries.begin(), f.entries.end(),
                                       [](const Entry& e) { return e.kind == EntryKind::Tensor && !e.stats.finite(); });
    out += fmt::format("<tr class=\"frame{}{}{}\"{} data-index=\"{}\"><td><a id=\"frame-{}\" href=\"#frame-{}\">{}</a>"
                       "</td><td class=\"n\">{}</td><td>{}</td><td class=\"wrap\">{}</td><td>{}</td>"
                       "<td class=\"wrap\">{}</td><td><table class=\"ent\">",
                       is_backward(f) ? " backward" : "", nonfinite ? " nonfinite" : "", trigger ? " origin" : "",
                       trigger ? " id=\"origin\"" : "", i, i, i, i, f.batch_number, to_string(f.direction),
                       escape(path_or_root(f.module_path)), escape(f.module_class), escape(op_text(f)));
    for (const auto& e : f.entries) out += entry_row(e);
    if (f.entries_omitted > 0) {
      out += fmt::format("<tr><td colspan=\"9\" class=\"note\">{} more entries, checked, not shown</td></tr>",
                         f.entries_omitted);
    }
    if (!f.error.empty()) {
      out += fmt::format("<tr><td colspan=\"9\" class=\"note bad\">read failed: {} (the entries above were read)</td></tr>",
                         escape(f.error));
    }
    if (f.entries.empty() && f.entries_omitted == 0) out += "<tr><td class=\"note\">no entries</td></tr>";
    out += "</table></td></tr>\n";
  }
  return out + "</tbody></table>\n";
}

std::string headroom_section(const Report& report) {
  int64_t checked = 0, frames[4] = {0, 0, 0, 0}, first[4] = {-1, -1, -1, -1};
  for (size_t i = 0; i < report.frames.size(); ++i) {
    const auto& entries = report.frames[i].entries;
    checked += std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.has_headroom; });
    for (int k = 0; k < 4; ++k) {
      const bool hit = std::any_of(entries.begin(), entries.end(),
                                   [&](const Entry& e) { return e.has_headroom && e.headroom.*kHeadroom[k] > 0; });
      frames[k] += hit;
      if (hit && first[k] < 0) first[k] = static_cast<int64_t>(i);
    }
  }
  std::string out = "<h2 id=\"headroom\">Headroom</h2>\n";
  if (checked == 0) return out + "<p class=\"note\">Not checked (Options::headroom is off).</p>\n";
  out += fmt::format("<p>Could these frames run in fp16 or bf16? Frames checked: {}.</p>\n<table class=\"headroom\">"
                     "<tr><th>cast</th><th>frames</th><th>first frame</th></tr>\n", checked);
  for (int k = 0; k < 4; ++k) {
    const auto i = static_cast<size_t>(first[k]);
    const std::string link =
        first[k] < 0 ? "-" : fmt::format("<a href=\"#frame-{}\">{}</a>", i, escape(describe(i, report.frames[i])));
    out += fmt::format("<tr{}><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>\n",
                       frames[k] > 0 ? " class=\"bad\"" : "", kHeadroomNames[k], frames[k], link);
  }
  return out + "</table>\n";
}

std::string slot_name(const Fp8SlotMetrics& m) {
  return path_or_root(m.module_path) + " " + m.role + " (" + m.recipe + (m.format.empty() ? "" : ", " + m.format) + ")";
}

bool same_slot(const Fp8SlotMetrics& a, const Fp8SlotMetrics& b) {
  return a.module_path == b.module_path && a.role == b.role && a.recipe == b.recipe;
}

std::string fp8_slot_plots(const std::vector<Fp8SlotMetrics>& steps, const std::vector<Fp8Alarm>& alarms) {
  svg::Chart scales(540, 230, "plot fp8-amax", "amax and scales");
  svg::Chart pct(540, 230, "plot fp8-pct", "overflow and underflow %");
  scales.set_axes("step", "", true);
  pct.set_axes("step", "", false);
  pct.include_y(0);
  svg::Series amax{"amax", "pt pt-amax", "#1f77b4"}, dscale{"delayed scale", "pt pt-dscale", "#ff7f0e"},
      cscale{"current scale", "pt pt-cscale", "#2ca02c"}, ovf{"overflow %", "pt pt-ovf", "#d62728"},
      unf{"underflow %", "pt pt-unf", "#9467bd"};
  const Fp8SlotMetrics* worst = &steps.front();
  for (const auto& m : steps) {
    const auto x = static_cast<double>(m.step);
    for (auto [series, y, what] : {std::tuple{&amax, m.cur_amax, "amax"}, {&dscale, m.delayed_scale, "delayed scale"},
                                   {&cscale, m.current_scale, "current scale"}, {&ovf, m.overflow_pct, "overflow %"},
                                   {&unf, m.underflow_pct, "underflow %"}}) {
      series->points.emplace_back(x, y, fmt::format("step {}: {} {:.3e}", m.step, what, y));
    }
    if (std::abs(m.drift_log2) > std::abs(worst->drift_log2)) worst = &m;
    for (const auto& a : alarms) {
      if (a.metrics.step != m.step || !same_slot(a.metrics, m)) continue;
      scales.add_marker({x, "alarm", "alarm-line"});
      pct.add_marker({x, "alarm", "alarm-line"});
    }
  }
  const Fp8SlotMetrics& last = steps.back();
  const char* fp8 = "#16a085";
  const double format_max = last.format == "E4M3" ? 448 : last.format == "E5M2" ? 57344 : last.format == "E2M1" ? 6 : 0;
  if (format_max > 0) scales.add_ref_line({format_max, last.format + " max " + svg::compact_number(format_max), fp8});
  for (auto* s : {&amax, &dscale, &cscale}) scales.add_series(std::move(*s));
  pct.add_series(std::move(ovf));
  pct.add_series(std::move(unf));
  std::string note = fmt::format("drift log2 (delayed / current) at the last step {:+.2f}", last.drift_log2);
  if (worst->drift_log2 != 0) note += fmt::format("; largest {:+.2f} at step {}", worst->drift_log2, worst->step);
  return "<div class=\"slot\"><h3>" + escape(slot_name(last)) + "</h3>\n" + scales.render() + pct.render() +
         "<p class=\"note\">" + note + "</p></div>\n";
}

std::string fp8_section(const Report& report, const std::vector<Fp8SlotMetrics>& history) {
  if (history.empty() && report.fp8_metrics.empty() && report.fp8_alarms.empty()) return "";
  std::map<std::tuple<std::string, std::string, std::string>, size_t> index;
  std::vector<std::vector<Fp8SlotMetrics>> slots;  // in the order first seen
  for (const auto* source : {&history, &report.fp8_metrics}) {
    for (const auto& m : *source) {
      const auto it = index.try_emplace({m.module_path, m.role, m.recipe}, slots.size()).first;
      if (it->second == slots.size()) slots.emplace_back();
      auto& steps = slots[it->second];
      // One point per step: the report's own metrics repeat the log's last step.
      const auto at = std::lower_bound(steps.begin(), steps.end(), m.step,
                                       [](const Fp8SlotMetrics& a, int64_t step) { return a.step < step; });
      if (at != steps.end() && at->step == m.step) *at = m;
      else steps.insert(at, m);
    }
  }
  std::string out = "<h2 id=\"fp8\">FP8</h2>\n", alarms;
  for (const auto& a : report.fp8_alarms) {
    alarms += fmt::format("<li class=\"alarm\"><b>{}</b>: {} at step {}</li>\n", escape(a.reason),
                          escape(slot_name(a.metrics)), a.metrics.step);
  }
  if (!alarms.empty()) out += "<ul class=\"alarms\">\n" + alarms + "</ul>\n";
  for (size_t i = 0; i < slots.size() && i < kMaxSlotPlots; ++i) out += fp8_slot_plots(slots[i], report.fp8_alarms);
  if (slots.size() > kMaxSlotPlots) {
    out += fmt::format("<p class=\"note\">{} more slots not drawn; the table below lists them all.</p>\n",
                       slots.size() - kMaxSlotPlots);
  }
  if (slots.empty()) return out;
  out += "<h3>Last step of each slot</h3>\n<table class=\"fp8\"><tr><th>slot</th><th>step</th><th>amax</th>"
         "<th>delayed scale</th><th>current scale</th><th>drift</th><th>overflow %</th><th>underflow %</th>"
         "<th>mse</th><th>cosine</th><th>sqnr dB</th><th>blocks</th></tr>\n";
  for (const auto& s : slots) {
    const Fp8SlotMetrics& m = s.back();
    const bool alarmed = std::any_of(report.fp8_alarms.begin(), report.fp8_alarms.end(),
                                     [&](const Fp8Alarm& a) { return same_slot(a.metrics, m); });
    out += fmt::format(
        "<tr{}><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.3e}</td>"
        "<td class=\"n\">{:.3e}</td><td class=\"n\">{:+.2f}</td><td class=\"n\">{:.3f}</td><td class=\"n\">{:.3f}</td>"
        "<td class=\"n\">{}</td><td class=\"n\">{:.6f}</td><td class=\"n\">{:.1f}</td><td class=\"n\">{}</td></tr>\n",
        alarmed ? " class=\"alarm\"" : "", escape(slot_name(m)), m.step, sci(m.cur_amax), m.delayed_scale,
        m.current_scale, m.drift_log2, m.overflow_pct, m.underflow_pct, sci(m.mse), m.cosine, m.sqnr_db,
        m.blocks == 0 ? "" : fmt::format("{} (zero {}, saturated {}, at min {}, inf/nan {})", m.blocks, m.blocks_zero,
                                         m.blocks_saturated, m.blocks_at_min, m.blocks_nonfinite));
  }
  return out + "</table>\n";
}

std::string ranks_line(const Report& report) {
  const RankAgreement& a = report.ranks;
  std::string out =
      fmt::format("<dt>rank</dt><dd>{} of {} ({})</dd>", report.rank, report.world_size, to_string(a.role));
  if (a.first) {
    out += fmt::format("<dt>first to see inf/nan</dt><dd>rank {}, batch {}, {} op {}: {}</dd>", a.first->rank,
                       a.first->batch_number, to_string(a.first->direction), a.first->op_index, escape(a.first->frame));
  }
  if (!a.missing.empty()) out += fmt::format("<dt>did not answer</dt><dd>ranks {}</dd>", fmt::join(a.missing, ", "));
  if (!a.problem.empty()) out += "<dt>exchange</dt><dd>" + escape(a.problem) + "</dd>";
  return out;
}

std::string stack_section(const char* title, const char* id, const std::vector<std::string>& lines) {
  if (lines.empty()) return "";
  std::string out = fmt::format("<h2 id=\"{}\">{}</h2>\n<pre>", id, title);
  for (const auto& l : lines) out += escape(l) + "\n";
  return out + "</pre>\n";
}

const char* kind_title(const std::string& kind) {
  if (kind == "nonfinite") return "inf/nan detected";
  if (kind == "fp8_alarm") return "FP8 alarm";
  if (kind == "peer_nonfinite") return "another rank detected inf/nan";
  if (kind == "ranks_missing") return "ranks did not answer";
  return kind == "trace" ? "trace" : "report";
}

std::string diff_plot(const TraceDiff& diff) {
  svg::Chart chart(1100, 320, "plot diff-plot", "worst relative difference per matched frame");
  chart.set_axes("matched frame (order of A)", "relative (log10)", true);
  chart.set_link_prefix("m-");
  svg::Series s{"worst relative difference", "pt pt-diff", "#1f77b4"};
  std::vector<bool> backward;
  for (size_t i = 0; i < diff.matched.size(); ++i) {
    const MatchedFrame& m = diff.matched[i];
    backward.push_back(m.direction == Direction::Backward);
    svg::Point p(static_cast<double>(i), m.worst.relative);
    p.frame = static_cast<int64_t>(i);
    // No difference has no place on a log axis: such frames sit on the bottom edge.
    p.pin = !std::isfinite(p.y) ? svg::Pin::Top : p.y > 0 ? svg::Pin::None : svg::Pin::Bottom;
    if (m.diverged) p.set_style(svg::Marker::Diamond, "div");
    if (diff.matched.size() <= kTitleLimit) {
      p.title = fmt::format("#{} {}: {} {} relative {}", i, frame_label(m), m.worst.entry, m.worst.stat,
                            sci(m.worst.relative));
    }
    s.points.push_back(std::move(p));
  }
  chart.shade_runs(backward, "bwd-band", "#f1e8fb", "backward");
  if (diff.rtol > 0) chart.add_ref_line({diff.rtol, "rtol " + svg::compact_number(diff.rtol), "#e67e22", true});
  if (diff.first_divergent) {
    chart.add_marker({static_cast<double>(*diff.first_divergent), "first divergent", "first-divergent-line"});
  }
  chart.add_series(std::move(s));
  return chart.render();
}

std::string unmatched_table(const std::vector<UnmatchedFrame>& frames, const std::string& name, const char* cls) {
  std::string out = fmt::format("<h2 id=\"{}\">Only in {}</h2>\n", cls, escape(name));
  if (frames.empty()) return out + "<p class=\"note\">none</p>\n";
  out += "<table><tr><th>index</th><th>dir</th><th>module</th><th>op</th><th>occ</th></tr>\n";
  for (const auto& u : frames) {
    out += fmt::format("<tr class=\"{}\"><td class=\"n\">{}</td><td>{}</td><td class=\"wrap\">{}</td><td>{}</td>"
                       "<td class=\"n\">{}</td></tr>\n",
                       cls, u.index, to_string(u.direction), escape(path_or_root(u.module_path)), escape(u.op),
                       u.occurrence);
  }
  return out + "</table>\n";
}

}  // namespace

std::string render_html(const Report& report, const std::vector<Fp8SlotMetrics>& fp8_history) {
  const bool has_trigger = report.kind != "trace" && !report.frames.empty();
  std::string out = fmt::format("<h1>Overflow Sentinel: {}</h1>\n<dl class=\"meta\"><dt>kind</dt><dd>{}</dd>"
                                "<dt>batch</dt><dd>{}{}</dd><dt>frames</dt><dd>{}</dd>{}</dl>\n",
                                kind_title(report.kind), escape(report.kind), report.batch_number,
                                report.phase.empty() ? "" : " (" + escape(report.phase) + ")", report.frames.size(),
                                report.world_size > 1 ? ranks_line(report) : "");
  if (report.kind != "trace" && report.kind != "fp8_alarm" && !report.origin.empty()) {
    out += "<p class=\"banner\">" +
           (has_trigger ? "<a href=\"#origin\">" + escape(report.origin) + "</a>" : escape(report.origin));
    if (report.kind == "nonfinite" && has_trigger) {
      out += report.produced_here ? " The op made it: its inputs and parameters were finite."
                                  : " It arrived with the op's inputs or parameters.";
    }
    out += "</p>\n";
  }
  if (report.deferred) {
    out += "<p class=\"note\">Deferred: found when the device's statistics were read back, after the op had run, so "
           "there is no call stack. Options::device_sync_each_op(true) stops at the op itself.</p>\n";
  }
  if (!report.dump_dir.empty()) {
    out += "<p>The op's arguments and results are saved in <code>" + escape(report.dump_dir) +
           "</code>; <code>sentinel replay " + escape(report.dump_dir) + "</code> re-runs it.</p>\n";
  }
  // FP8 alarms come without frames: no empty plot for them.
  const std::string no_frames = "<p class=\"note empty\">No frames were recorded.</p>\n";
  if (!report.frames.empty() || report.kind != "fp8_alarm") {
    out += "<h2 id=\"plot\">Magnitudes</h2>\n" + (report.frames.empty() ? no_frames : frames_plot(report, has_trigger));
  }
  out += fp8_section(report, fp8_history);
  if (!report.frames.empty()) {
    out += "<h2 id=\"frames\">Frames</h2>\n" + frame_table(report, has_trigger) + headroom_section(report);
  }
  out += stack_section("Python call stack (innermost first)", "python-stack", report.python_stack);
  out += stack_section("TorchScript call stack (innermost first)", "torchscript-stack", report.torchscript_stack);
  out += stack_section("C++ call stack (innermost first)", "stack", report.stack);
  return page(fmt::format("Overflow Sentinel: {}, batch {}", kind_title(report.kind), report.batch_number), out);
}

std::string render_diff_html(const TraceDiff& diff) {
  std::string out = fmt::format(
      "<h1>Overflow Sentinel: trace diff</h1>\n<dl class=\"meta\"><dt>A</dt><dd>{} (batch {})</dd><dt>B</dt>"
      "<dd>{} (batch {})</dd><dt>tolerance</dt><dd class=\"num\">rtol {:g}, atol {:g}</dd><dt>matched</dt>"
      "<dd>{} frames; {} in A only, {} in B only</dd></dl>\n",
      escape(diff.name_a), diff.batch_a, escape(diff.name_b), diff.batch_b, diff.rtol, diff.atol, diff.matched.size(),
      diff.only_a.size(), diff.only_b.size());
  const bool has_first = diff.first_divergent && *diff.first_divergent < diff.matched.size();
  const size_t first = has_first ? *diff.first_divergent : diff.matched.size();
  if (diff.verdict == DiffVerdict::Same) {
    out += "<p class=\"banner ok verdict\">Same: every matched frame is within the tolerance.</p>\n";
  } else if (diff.verdict == DiffVerdict::NotComparable) {
    out += "<p class=\"banner verdict\">Not comparable: " + escape(diff.not_comparable) + "</p>\n";
  } else if (has_first) {
    const StatDifference& w = diff.matched[first].worst;
    out += fmt::format("<p class=\"banner verdict\">Diverged at frame <a href=\"#first-divergent\">{} {}</a>: {} {} is "
                       "{} in A, {} in B (relative {}, score {:.3g}).</p>\n",
                       first, escape(frame_label(diff.matched[first])), escape(w.entry), escape(w.stat), sci(w.a),
                       sci(w.b), sci(w.relative), w.score);
  } else {
    out += "<p class=\"banner verdict\">Diverged.</p>\n";
  }
  if (!diff.matched.empty()) {
    out += "<h2 id=\"plot\">Relative difference</h2>\n" + diff_plot(diff) +
           "<h2 id=\"matched\">Matched frames</h2>\n" + kFilterBox +
           "<table class=\"matched\"><thead><tr><th>#</th><th>A</th><th>B</th><th>dir</th><th>module</th>"
           "<th>class</th><th>op</th><th>occ</th><th>entry</th><th>stat</th><th>a</th><th>b</th><th>relative</th>"
           "<th>score</th><th>compared</th><th>unmatched entries</th></tr></thead><tbody>\n";
  }
  for (size_t i = 0; i < diff.matched.size(); ++i) {
    const MatchedFrame& m = diff.matched[i];
    const std::string unmatched = escape(fmt::format("{}", fmt::join(m.entries_unmatched, ", ")));
    out += fmt::format(
        "<tr class=\"matched{}{}{}\"{} data-index=\"{}\"><td><a id=\"m-{}\" href=\"#m-{}\">{}</a></td>"
        "<td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"wrap\">{}</td><td>{}</td><td>{}</td>"
        "<td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
        "<td class=\"n\">{}</td><td class=\"n\">{:.3g}</td><td class=\"n\">{}</td><td>{}</td></tr>\n",
        m.direction == Direction::Backward ? " backward" : "", m.diverged ? " diverged" : "",
        i == first ? " first-divergent" : "", i == first ? " id=\"first-divergent\"" : "", i, i, i, i, m.index_a,
        m.index_b, to_string(m.direction), escape(path_or_root(m.module_path)), escape(m.module_class), escape(m.op),
        m.occurrence, escape(m.worst.entry), escape(m.worst.stat), sci(m.worst.a), sci(m.worst.b),
        sci(m.worst.relative), m.worst.score, m.entries_compared, unmatched);
  }
  if (!diff.matched.empty()) out += "</tbody></table>\n";
  out += unmatched_table(diff.only_a, diff.name_a, "only-a") + unmatched_table(diff.only_b, diff.name_b, "only-b");
  return page("Overflow Sentinel: trace diff", out);
}

}  // namespace report
}  // namespace sentinel

#include "report/trace_diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace sentinel {
namespace report {

namespace {

using Key = std::tuple<Direction, std::string, std::string, int64_t>;

// Keys in trace order: the n-th time a (direction, module path, op) runs is its occurrence n.
std::vector<Key> keys_of(const Report& r) {
  std::map<std::tuple<Direction, std::string, std::string>, int64_t> seen;
  std::vector<Key> keys;
  for (const Frame& f : r.frames) {
    const int64_t n = seen[{f.direction, f.module_path, f.op}]++;
    keys.emplace_back(f.direction, f.module_path, f.op, n);
  }
  return keys;
}

const Entry* find_entry(const Frame& f, const std::string& label) {
  for (const Entry& e : f.entries) {
    if (e.label == label) return &e;
  }
  return nullptr;
}

// |a - b| against numpy's isclose tolerance around b, on the scale `scale` (|b| for abs_max;
// the tensor's abs_max for abs_min, whose value sits at the noise floor of the precision).
StatDifference compare(const std::string& entry, const std::string& stat, double a, double b, double scale_a,
                       double scale_b, double rtol, double atol) {
  StatDifference d{entry, stat, a, b, 0.0, 0.0};
  if (a == b || std::isnan(a) || std::isnan(b)) return d;
  if (std::isinf(a) || std::isinf(b)) {
    d.relative = 1.0;
    d.score = INFINITY;
    return d;
  }
  const double diff = std::fabs(a - b);
  const double scale = std::max(std::fabs(scale_a), std::fabs(scale_b));
  d.relative = scale > 0 ? diff / scale : 1.0;
  d.score = diff / (atol + rtol * std::fabs(scale_b));
  return d;
}

// The entries of two matched frames: each statistic's difference; the worst one is kept.
void compare_frames(const Frame& fa, const Frame& fb, double rtol, double atol, MatchedFrame& m) {
  auto consider = [&](const StatDifference& d) {
    if (d.score > m.worst.score || (d.score == m.worst.score && d.relative > m.worst.relative) ||
        m.worst.entry.empty()) {
      m.worst = d;
    }
  };
  for (const Entry& ea : fa.entries) {
    const Entry* eb = find_entry(fb, ea.label);
    if (!eb || eb->kind != ea.kind || (ea.kind == EntryKind::Tensor && ea.stats.count != eb->stats.count)) {
      m.entries_unmatched.push_back(ea.label);
      continue;
    }
    if (ea.kind != EntryKind::Tensor) continue;
    ++m.entries_compared;
    const TensorStats& a = ea.stats;
    const TensorStats& b = eb->stats;
    if ((a.nan > 0) != (b.nan > 0)) consider({ea.label, "nan", double(a.nan), double(b.nan), 1.0, INFINITY});
    const bool inf_a = a.pos_inf + a.neg_inf > 0, inf_b = b.pos_inf + b.neg_inf > 0;
    if (inf_a != inf_b) {
      consider({ea.label, "inf", double(a.pos_inf + a.neg_inf), double(b.pos_inf + b.neg_inf), 1.0, INFINITY});
    }
    if (a.count == a.nan || b.count == b.nan) continue;  // no non-NaN value to compare
    consider(compare(ea.label, "abs_max", a.abs_max, b.abs_max, a.abs_max, b.abs_max, rtol, atol));
    consider(compare(ea.label, "abs_min", a.abs_min, b.abs_min, a.abs_max, b.abs_max, rtol, atol));
  }
  for (const Entry& eb : fb.entries) {
    if (!find_entry(fa, eb.label)) m.entries_unmatched.push_back(eb.label);
  }
  m.diverged = m.worst.score > 1.0;
}

std::string trace_name(const Report& r) { return r.kind == "trace" ? "" : "a '" + r.kind + "' report"; }

std::string number(double v) { return fmt::format("{:.2e}", v); }

}  // namespace

std::string frame_label(const MatchedFrame& m) {
  const std::string where = (m.module_path.empty() ? "<root>" : m.module_path) +
                            (m.module_class.empty() ? "" : " (" + m.module_class + ")");
  return fmt::format("{}{} {} #{}", m.direction == Direction::Backward ? "grad of " : "", where, m.op, m.occurrence);
}

TraceDiff diff_traces(const Report& a, const Report& b, double rtol, double atol) {
  TraceDiff d;
  d.rtol = rtol;
  d.atol = atol;
  d.batch_a = a.batch_number;
  d.batch_b = b.batch_number;
  if (a.kind != "trace" || b.kind != "trace") {
    d.verdict = DiffVerdict::NotComparable;
    d.not_comparable = fmt::format("{} is {}, not a trace (sentinel run --trace-batches N --report-dir D writes "
                                   "D/sentinel_trace_batch<N>.json)",
                                   a.kind != "trace" ? "A" : "B", trace_name(a.kind != "trace" ? a : b));
    return d;
  }
  const std::vector<Key> ka = keys_of(a), kb = keys_of(b);
  std::map<Key, int64_t> index_b;
  for (size_t i = 0; i < kb.size(); ++i) index_b.emplace(kb[i], static_cast<int64_t>(i));
  std::vector<bool> used_b(kb.size(), false);
  for (size_t i = 0; i < ka.size(); ++i) {
    const auto& [direction, path, op, occurrence] = ka[i];
    auto it = index_b.find(ka[i]);
    if (it == index_b.end()) {
      d.only_a.push_back({static_cast<int64_t>(i), direction, path, op, occurrence});
      continue;
    }
    used_b[it->second] = true;
    MatchedFrame m;
    m.index_a = static_cast<int64_t>(i);
    m.index_b = it->second;
    m.direction = direction;
    m.module_path = path;
    m.module_class = a.frames[i].module_class;
    m.op = op;
    m.occurrence = occurrence;
    compare_frames(a.frames[i], b.frames[it->second], rtol, atol, m);
    if (m.diverged && !d.first_divergent) d.first_divergent = d.matched.size();
    d.matched.push_back(std::move(m));
  }
  for (size_t i = 0; i < kb.size(); ++i) {
    if (used_b[i]) continue;
    const auto& [direction, path, op, occurrence] = kb[i];
    d.only_b.push_back({static_cast<int64_t>(i), direction, path, op, occurrence});
  }
  if (d.matched.empty()) {
    d.verdict = DiffVerdict::NotComparable;
    d.not_comparable = fmt::format("no frame of A ({} frames) matches a frame of B ({} frames) by direction, module "
                                   "path, op and occurrence: are they traces of the same model?",
                                   a.frames.size(), b.frames.size());
  } else {
    d.verdict = d.first_divergent ? DiffVerdict::Diverged : DiffVerdict::Same;
  }
  return d;
}

std::string render_diff_text(const TraceDiff& d) {
  std::string out = fmt::format("sentinel diff: A {} (batch {}) against B {} (batch {}), rtol {:g}, atol {:g}\n",
                                d.name_a, d.batch_a, d.name_b, d.batch_b, d.rtol, d.atol);
  if (d.verdict == DiffVerdict::NotComparable) return out + "Not comparable: " + d.not_comparable + "\n";
  out += fmt::format("{} frames matched; {} only in A, {} only in B.\n", d.matched.size(), d.only_a.size(),
                     d.only_b.size());
  auto largest = std::max_element(d.matched.begin(), d.matched.end(), [](const MatchedFrame& x, const MatchedFrame& y) {
    return x.worst.relative < y.worst.relative;
  });
  auto worst_line = [](const MatchedFrame& m) {
    const StatDifference& w = m.worst;
    const std::string times =
        std::isinf(w.score) ? "one side not finite" : fmt::format("{:.1f}x the tolerance", w.score);
    return fmt::format("{} {}: A {} B {} (relative difference {}, {})", w.entry, w.stat, number(w.a), number(w.b),
                       number(w.relative), times);
  };
  size_t from = 0, to = 0;
  if (d.first_divergent) {
    const MatchedFrame& f = d.matched[*d.first_divergent];
    out += fmt::format("Diverged first at frame {} of A (frame {} of B): {}\n  {}\n", f.index_a, f.index_b,
                       frame_label(f), worst_line(f));
    from = *d.first_divergent >= 3 ? *d.first_divergent - 3 : 0;
    to = std::min(d.matched.size(), *d.first_divergent + 21);
    out += "How the difference grows (largest relative difference of each frame's statistics):\n";
  } else {
    out += fmt::format("Same within the tolerance. The largest relative difference is {} at {} (frame {} of A).\n",
                       number(largest->worst.relative), frame_label(*largest), largest->index_a);
  }
  if (to > from) out += fmt::format("  {:>6} {:>6}  {:>9}  {}\n", "A", "B", "relative", "frame");
  for (size_t i = from; i < to; ++i) {
    const MatchedFrame& m = d.matched[i];
    out += fmt::format("{} {:>6} {:>6}  {:>9}  {}{}\n", i == d.first_divergent ? ">" : " ", m.index_a, m.index_b,
                       number(m.worst.relative), frame_label(m), m.diverged ? "  beyond" : "");
  }
  if (d.first_divergent && to < d.matched.size()) {
    out += fmt::format("  ... {} more matched frames; the largest relative difference is {} at {} (frame {} of A)\n",
                       d.matched.size() - to, number(largest->worst.relative), frame_label(*largest),
                       largest->index_a);
  }
  auto list = [&](const char* which, const std::vector<UnmatchedFrame>& frames) {
    if (frames.empty()) return;
    out += fmt::format("Frames only in {}:\n", which);
    for (size_t i = 0; i < frames.size() && i < 20; ++i) {
      const UnmatchedFrame& u = frames[i];
      out += fmt::format("  {:>6}  {}{} {} #{}\n", u.index, u.direction == Direction::Backward ? "grad of " : "",
                         u.module_path.empty() ? "<root>" : u.module_path, u.op, u.occurrence);
    }
    if (frames.size() > 20) out += fmt::format("  ... {} more\n", frames.size() - 20);
  };
  list("A", d.only_a);
  list("B", d.only_b);
  return out;
}

}  // namespace report
}  // namespace sentinel

#include "report/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace sentinel {
namespace report {
namespace svg {

namespace {

constexpr double kCharWidth = 6.2;  // an estimate for 11px sans-serif text; labels need no exact fit
constexpr double kPinPad = 10;      // room inside the plot area for markers pinned to its edges
constexpr double kLabelGap = 11;    // the least vertical distance between reference-line labels

// One decimal is below a pixel's width: coordinates stay short. A coordinate that is not finite
// would make the browser drop the element, so it can never be written.
std::string num(double v) {
  if (!std::isfinite(v)) v = 0;
  std::string s = fmt::format("{:.1f}", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  if (s == "-0") s = "0";
  return s;
}

double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw * (1 - 1e-9)) return m * mag;
  }
  return 10 * mag;
}

struct Range {
  double lo = 0, hi = 1;
};

// Where data lands in the picture: the plot area in pixels and the axes' ranges (log10 positions
// on a log axis).
struct Layout {
  Range x, y;
  bool log_y = false;
  double left = 0, right = 0, top = 0, bottom = 0;

  bool placeable(double v) const { return std::isfinite(v) && (!log_y || v > 0); }
  double axis(double v) const { return log_y ? std::log10(v) : v; }
  double px(double v) const { return left + (v - x.lo) / (x.hi - x.lo) * (right - left); }
  double py_axis(double a) const {
    const double lo = bottom - kPinPad, hi = top + kPinPad;
    return lo - (a - y.lo) / (y.hi - y.lo) * (lo - hi);
  }
  double py(const Point& p) const {
    if (p.pin == Pin::Top) return top + 3;
    if (p.pin == Pin::Bottom) return bottom - 3;
    return py_axis(axis(p.y));
  }
};

std::string marker_element(Marker m, double x, double y, const std::string& attrs, const std::string& body) {
  std::string el;
  switch (m) {
    case Marker::Circle:
      el = fmt::format("<circle {}cx=\"{}\" cy=\"{}\" r=\"3\"", attrs, num(x), num(y));
      break;
    case Marker::Square:
      el = fmt::format("<rect {}x=\"{}\" y=\"{}\" width=\"6\" height=\"6\"", attrs, num(x - 3), num(y - 3));
      break;
    case Marker::Diamond:
      el = fmt::format("<path {}d=\"M{} {}l4 4-4 4-4-4z\"", attrs, num(x), num(y - 4));
      break;
    case Marker::Triangle:
      el = fmt::format("<path {}d=\"M{} {}l4.5 8h-9z\"", attrs, num(x), num(y - 4));
      break;
  }
  return body.empty() ? el + "/>" : el + ">" + body + "</" + el.substr(1, el.find(' ') - 1) + ">";
}

// The y range from the data's extent (axis positions): whole decades on a log axis, 1-2-5 steps
// on a linear one, never empty. Returns the y ticks.
std::vector<double> choose_y_range(Layout& l, double lo, double hi, int max_log_ticks) {
  if (!(hi >= lo)) {
    lo = l.log_y ? -1 : 0;
    hi = 1;
  }
  if (l.log_y) {
    l.y = {std::floor(lo), std::ceil(hi)};
    if (l.y.hi - l.y.lo < 1) l.y = {l.y.lo - 1, l.y.hi + 1};
    return log_ticks(l.y.lo, l.y.hi, max_log_ticks);
  }
  if (hi - lo <= 0) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double step = nice_step((hi - lo) / 6);
  l.y = {std::floor(lo / step) * step, std::ceil(hi / step) * step};
  return linear_ticks(l.y.lo, l.y.hi, 8);
}

std::string axes_markup(const Layout& l, const std::vector<double>& yticks, bool integer_x) {
  std::string out = "<g class=\"grid\" stroke=\"#eee\">";
  for (double t : yticks) out += fmt::format("<path d=\"M{} {}H{}\"/>", num(l.left), num(l.py_axis(t)), num(l.right));
  out += "</g>\n<g class=\"ticks\" font-size=\"10\" fill=\"#555\">";
  for (double t : yticks) {
    out += fmt::format("<text class=\"ytick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>", num(l.left - 4),
                       num(l.py_axis(t) + 3),
                       l.log_y ? fmt::format("1e{}", static_cast<int>(std::lround(t))) : compact_number(t));
  }
  for (double t : linear_ticks(l.x.lo, l.x.hi, std::max(2, static_cast<int>((l.right - l.left) / 60)), integer_x)) {
    out += fmt::format("<text class=\"xtick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", num(l.px(t)),
                       num(l.bottom + 13), compact_number(t));
  }
  return out + "</g>\n";
}

// Labels sit right of the plot area, pushed apart where lines nearly coincide (65504 and 57344).
std::string ref_lines_markup(const Layout& l, std::vector<const RefLine*> refs) {
  std::sort(refs.begin(), refs.end(), [](const RefLine* a, const RefLine* b) { return a->y > b->y; });
  std::string out;
  double last_label_y = -1e9;
  for (const auto* r : refs) {
    const double y = l.py_axis(l.axis(r->y));
    last_label_y = std::max(y + 3, last_label_y + kLabelGap);
    out += fmt::format("<g class=\"ref\"><path d=\"M{} {}H{}\" stroke=\"{}\" stroke-dasharray=\"5 3\"/>"
                       "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"{}\">{}</text></g>\n",
                       num(l.left), num(y), num(l.right), escape(r->color), num(l.right + 4), num(last_label_y),
                       escape(r->color), escape(r->label));
  }
  return out;
}

// A line through the placed points, then one element per point, pinned ones included.
std::string series_markup(const Layout& l, const Series& s, bool titles) {
  std::string out, pts;
  for (const auto& p : s.points) {
    if (s.line && p.pin == Pin::None && l.placeable(p.y)) pts += num(l.px(p.x)) + "," + num(l.py(p)) + " ";
  }
  if (!pts.empty()) {
    pts.pop_back();
    out += fmt::format("<polyline class=\"line\" fill=\"none\" stroke=\"{}\" stroke-width=\"1\" points=\"{}\"/>\n",
                       escape(s.color), pts);
  }
  out += fmt::format("<g fill=\"{}\">", escape(s.color));
  for (const auto& p : s.points) {
    if (p.pin == Pin::None && !l.placeable(p.y)) continue;
    const std::string css_class = p.css_class.empty() ? s.css_class : s.css_class + " " + p.css_class;
    std::string attrs = "class=\"" + escape(css_class) + "\" ";
    if (p.frame >= 0) attrs += fmt::format("data-frame=\"{}\" ", p.frame);
    const std::string body = titles && !p.title.empty() ? "<title>" + escape(p.title) + "</title>" : std::string();
    out += marker_element(p.own_marker ? p.marker : s.marker, l.px(p.x), l.py(p), attrs, body) + "\n";
  }
  return out + "</g>\n";
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string compact_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:g}", v);
}

std::vector<double> log_ticks(double lo_log10, double hi_log10, int max_ticks) {
  std::vector<double> ticks;
  const double lo = std::ceil(lo_log10 - 1e-9), hi = std::floor(hi_log10 + 1e-9);
  if (!(hi >= lo)) return ticks;
  double step = 1;
  for (double s : {1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 25.0, 50.0, 100.0}) {
    step = s;
    if ((hi - lo) / s + 1 <= std::max(max_ticks, 2)) break;
  }
  for (double t = std::ceil(lo / step) * step; t <= hi; t += step) ticks.push_back(t);
  return ticks;
}

std::vector<double> linear_ticks(double lo, double hi, int max_ticks, bool integers) {
  std::vector<double> ticks;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) {
    if (std::isfinite(lo)) ticks.push_back(lo);
    return ticks;
  }
  double step = nice_step((hi - lo) / std::max(max_ticks, 1));
  if (integers) step = std::max(1.0, std::round(step));
  // Multiples of the step, not a running sum, so that rounding errors do not pile up.
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; ++k) {
    ticks.push_back(k == 0 ? 0.0 : k * step);
  }
  return ticks;
}

void Chart::shade_runs(const std::vector<bool>& mask, const std::string& css_class, const std::string& color,
                       const std::string& legend) {
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i]) continue;
    const size_t start = i;
    while (i + 1 < mask.size() && mask[i + 1]) ++i;
    add_band({static_cast<double>(start), static_cast<double>(i), css_class, color});
  }
  if (std::find(mask.begin(), mask.end(), true) != mask.end()) set_band_legend(legend, color);
}

std::string Chart::render() const {
  Layout l;
  l.log_y = log_y_;
  double ymin = std::numeric_limits<double>::infinity(), ymax = -ymin;
  double xmin = ymin, xmax = ymax;
  auto take_y = [&](double y) {
    if (!l.placeable(y)) return;
    ymin = std::min(ymin, l.axis(y));
    ymax = std::max(ymax, l.axis(y));
  };
  auto take_x = [&](double x) {
    if (!std::isfinite(x)) return;
    xmin = std::min(xmin, x);
    xmax = std::max(xmax, x);
  };
  size_t point_count = 0;
  for (const auto& s : series_) {
    for (const auto& p : s.points) {
      take_x(p.x);
      if (p.pin == Pin::None) take_y(p.y);
      ++point_count;
    }
  }
  for (double y : include_y_) take_y(y);
  for (const auto& r : ref_lines_) {
    if (r.widen) take_y(r.y);
  }
  for (const auto& m : markers_) take_x(m.x);
  for (const auto& b : bands_) {
    take_x(b.x0);
    take_x(b.x1);
  }
  // About one labelled decade per 22 pixels of height.
  const std::vector<double> yticks = choose_y_range(l, ymin, ymax, std::max(3, (height_ - 80) / 22));
  if (!(xmax >= xmin)) xmin = xmax = 0;
  const double pad = integer_x_ || xmax == xmin ? 0.5 : 0;
  l.x = {xmin - pad, xmax + pad};

  // Reference lines that fall inside the chosen range (and those that widened it) are drawn.
  std::vector<const RefLine*> refs;
  for (const auto& r : ref_lines_) {
    if (l.placeable(r.y) && l.axis(r.y) >= l.y.lo - 1e-9 && l.axis(r.y) <= l.y.hi + 1e-9) refs.push_back(&r);
  }
  std::vector<std::pair<std::string, std::string>> legend;  // colour, text
  for (const auto& s : series_) {
    if (!s.name.empty()) legend.emplace_back(s.color, s.name);
  }
  if (!band_legend_.empty()) legend.emplace_back(band_legend_color_, band_legend_);

  double label_width = 0;
  for (const auto* r : refs) label_width = std::max(label_width, static_cast<double>(r->label.size()) * kCharWidth);
  l.left = y_label_.empty() ? 48 : 62;
  l.right = width_ - (refs.empty() ? 16 : std::min(label_width + 12, width_ * 0.3));
  l.top = (title_.empty() ? 8 : 24) + (legend.empty() ? 0 : 18);
  l.bottom = height_ - (x_label_.empty() ? 24 : 38);

  std::string out = fmt::format("<svg class=\"{}\" viewBox=\"0 0 {} {}\" width=\"{}\" height=\"{}\" role=\"img\"",
                                escape(css_class_), width_, height_, width_, height_);
  if (!link_prefix_.empty()) out += " data-target=\"" + escape(link_prefix_) + "\"";
  if (!title_.empty()) out += " aria-label=\"" + escape(title_) + "\"";
  out += fmt::format(">\n<rect class=\"area\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\" "
                     "stroke=\"#bbb\"/>\n", num(l.left), num(l.top), num(l.right - l.left), num(l.bottom - l.top));
  for (const auto& b : bands_) {
    const double band_pad = integer_x_ ? 0.5 : 0;
    const double x0 = std::max(l.left, l.px(std::min(b.x0, b.x1) - band_pad));
    const double x1 = std::min(l.right, l.px(std::max(b.x0, b.x1) + band_pad));
    out += fmt::format("<rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n",
                       escape(b.css_class), num(x0), num(l.top), num(std::max(x1 - x0, 1.0)), num(l.bottom - l.top),
                       escape(b.color));
  }
  out += axes_markup(l, yticks, integer_x_) + ref_lines_markup(l, refs);
  for (const auto& m : markers_) {
    const double x = l.px(m.x);
    const bool flip = x > l.left + (l.right - l.left) * 0.75;  // the label goes left of a line near the right edge
    out += fmt::format(
        "<g class=\"{}\"><path d=\"M{} {}V{}\" stroke=\"{}\" stroke-width=\"1.5\"/>"
        "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"{}\" text-anchor=\"{}\">{}</text></g>\n",
        escape(m.css_class.empty() ? "vmark" : m.css_class), num(x), num(l.top), num(l.bottom), escape(m.color),
        num(flip ? x - 3 : x + 3), num(l.top + 10), escape(m.color), flip ? "end" : "start", escape(m.label));
  }
  for (const auto& s : series_) out += series_markup(l, s, s.points.size() <= title_limit_);

  if (!title_.empty()) {
    out += fmt::format("<text class=\"title\" x=\"{}\" y=\"15\" font-size=\"12\" font-weight=\"bold\">{}</text>\n",
                       num(l.left), escape(title_));
  }
  double lx = l.left;
  for (const auto& [color, text] : legend) {
    out += fmt::format(
        "<g class=\"legend\"><rect x=\"{}\" y=\"{}\" width=\"10\" height=\"8\" fill=\"{}\" stroke=\"#999\"/>"
        "<text x=\"{}\" y=\"{}\" font-size=\"11\">{}</text></g>\n",
        num(lx), num(l.top - 15), escape(color), num(lx + 14), num(l.top - 8), escape(text));
    lx += 24 + static_cast<double>(text.size()) * kCharWidth;
  }
  if (!x_label_.empty()) {
    out += fmt::format("<text class=\"xlabel\" x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n",
                       num((l.left + l.right) / 2), num(height_ - 6), escape(x_label_));
  }
  if (!y_label_.empty()) {
    out += fmt::format("<text class=\"ylabel\" x=\"0\" y=\"0\" font-size=\"11\" text-anchor=\"middle\" "
                       "transform=\"translate(12 {}) rotate(-90)\">{}</text>\n",
                       num((l.top + l.bottom) / 2), escape(y_label_));
  }
  if (point_count == 0) {
    out += fmt::format("<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n",
                       num((l.left + l.right) / 2), num((l.top + l.bottom) / 2));
  }
  return out + "</svg>\n";
}

}  // namespace svg
}  // namespace report
}  // namespace sentinel

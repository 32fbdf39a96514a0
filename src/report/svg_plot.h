#pragma once
// A small chart builder that writes inline SVG, so that HTML reports carry their plots without
// scripts or network access and stay readable wherever the file is opened.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sentinel {
namespace report {
namespace svg {

// Text for HTML or SVG content and attribute values: & < > " ' escaped.
std::string escape(std::string_view text);

// A number as a tick or reference-line label: "1e-8", "1e0", "448", "0.25".
std::string compact_number(double v);

enum class Marker { Circle, Square, Diamond, Triangle };

// Points whose value cannot be placed on the axis (inf, nan, or zero on a log axis) can still be
// shown, pinned to an edge of the plot area, instead of vanishing.
enum class Pin { None, Top, Bottom };

struct Point {
  Point(double x_ = 0, double y_ = 0, std::string title_ = "") : x(x_), y(y_), title(std::move(title_)) {}
  // A point unlike the rest of its series (a backward frame, a divergent one).
  void set_style(Marker m, std::string extra_class) {
    marker = m;
    own_marker = true;
    css_class = std::move(extra_class);
  }

  double x, y;
  std::string title;      // the hover tooltip; empty: none
  std::string css_class;  // added to the series' classes ("bwd", "div")
  int64_t frame = -1;     // written as data-frame when >= 0, for the page's script
  Marker marker = Marker::Circle;
  bool own_marker = false;  // `marker` overrides the series' marker
  Pin pin = Pin::None;
};

struct Series {
  std::string name;       // legend text; empty: not in the legend
  std::string css_class;  // every point's class, e.g. "pt pt-absmax"
  std::string color = "#1f77b4";
  Marker marker = Marker::Circle;
  bool line = true;  // join the (unpinned) points in order
  std::vector<Point> points{};
};

struct RefLine {
  double y = 0;
  std::string label;
  std::string color = "#888";
  bool widen = false;  // the y range grows to include it; otherwise drawn only when it falls inside
};

struct VMarker {
  double x = 0;
  std::string label;
  std::string css_class;
  std::string color = "#d62728";
};

struct Band {
  double x0 = 0, x1 = 0;
  std::string css_class;
  std::string color = "#f3e6ff";
};

// Ticks for an axis spanning [lo, hi]: powers of ten on a log axis (values are log10 positions,
// every k-th decade when the span is wide), 1-2-5 steps on a linear one, whole numbers when
// `integers` is set.
std::vector<double> log_ticks(double lo_log10, double hi_log10, int max_ticks = 12);
std::vector<double> linear_ticks(double lo, double hi, int max_ticks = 10, bool integers = false);

class Chart {
 public:
  Chart(int width, int height, std::string css_class = "plot", std::string title = "")
      : width_(width), height_(height), title_(std::move(title)), css_class_(std::move(css_class)) {}

  void set_title(std::string title) { title_ = std::move(title); }
  void set_axes(std::string x_label, std::string y_label, bool log_y) {
    x_label_ = std::move(x_label);
    y_label_ = std::move(y_label);
    log_y_ = log_y;
  }
  void set_integer_x(bool integer_x) { integer_x_ = integer_x; }
  // The y range includes v: 0 on a percentage axis keeps tiny noise from filling the plot.
  void include_y(double v) { include_y_.push_back(v); }
  // The root element's class, and the prefix of the ids of the rows that points link to.
  void set_css_class(std::string css_class) { css_class_ = std::move(css_class); }
  void set_link_prefix(std::string prefix) { link_prefix_ = std::move(prefix); }
  // Beyond this many points in a series, points get no tooltip, to keep big pages small.
  void set_title_limit(size_t limit) { title_limit_ = limit; }
  void set_band_legend(std::string label, std::string color) {
    band_legend_ = std::move(label);
    band_legend_color_ = std::move(color);
  }

  void add_series(Series s) { series_.push_back(std::move(s)); }
  void add_ref_line(RefLine r) { ref_lines_.push_back(std::move(r)); }
  void add_marker(VMarker m) { markers_.push_back(std::move(m)); }
  void add_band(Band b) { bands_.push_back(std::move(b)); }
  // One band per run of consecutive x = 0, 1, ... where `mask` holds, with a legend entry if any.
  void shade_runs(const std::vector<bool>& mask, const std::string& css_class, const std::string& color,
                  const std::string& legend);

  std::string render() const;

 private:
  int width_, height_;
  std::string title_, css_class_, x_label_, y_label_, link_prefix_;
  bool log_y_ = false, integer_x_ = true;
  size_t title_limit_ = 2000;
  std::string band_legend_, band_legend_color_;
  std::vector<double> include_y_;
  std::vector<Series> series_;
  std::vector<RefLine> ref_lines_;
  std::vector<VMarker> markers_;
  std::vector<Band> bands_;
};

}  // namespace svg
}  // namespace report
}  // namespace sentinel

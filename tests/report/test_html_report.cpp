// The HTML pages: structure counted in the markup, every plotted number placed, text escaped,
// and the page as a browser renders it (headless Chromium), with a screenshot to look at.
#include <gtest/gtest.h>

#include <sentinel/report.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "report/html_report.h"
#include "report/svg_plot.h"

namespace {

using sentinel::Direction;
using sentinel::Entry;
using sentinel::Frame;
using sentinel::Report;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + needle.size())) ++n;
  return n;
}

Entry tensor(const std::string& label, double mn, double mx, int64_t nan = 0, int64_t inf = 0, int64_t zeros = 0) {
  Entry e;
  e.label = label;
  e.dtype = "float32";
  e.stats = {100, nan, inf, 0, zeros, 0, mn, mx};  // count, nan, +inf, -inf, zeros, subnormal, abs min, abs max
  return e;
}

Frame frame(const std::string& path, const std::string& op, std::vector<Entry> entries,
            Direction dir = Direction::Forward) {
  Frame f;
  f.batch_number = 7;
  f.module_path = path;
  f.module_class = "Linear";
  f.op = op;
  f.direction = dir;
  if (dir == Direction::Backward) f.forward_op = "aten::addmm";
  f.entries = std::move(entries);
  return f;
}

// Six frames: forward (one of its entries holding zeros), an all-zero one, one whose only minimum is
// a zero, two backward, and the trigger holding inf.
Report sample_report() {
  Report r;
  r.batch_number = 7;
  r.origin = "inf appeared in layers.1 (Linear) aten::addmm output";
  r.produced_here = true;
  const Entry zeros_in = tensor("input[0]", 0, 3, 0, 0, 7), out = tensor("output", 2e-4, 30);
  r.frames.push_back(frame("layers.0", "aten::addmm", {tensor("weight", 1e-3, 0.5), zeros_in, out}));
  r.frames.push_back(frame("layers.0.act", "aten::relu", {tensor("output", 0, 0, 0, 0, 100)}));
  r.frames.push_back(frame("layers.1", "aten::mul", {tensor("output", 0, 12, 0, 0, 5)}));
  r.frames.push_back(frame("layers.0", "AddmmBackward0", {tensor("grad_output", 1e-6, 2.0)}, Direction::Backward));
  r.frames.push_back(frame("layers.1", "MulBackward0", {tensor("grad_output", 3e-7, 40.0)}, Direction::Backward));
  r.frames.push_back(
      frame("layers.1", "aten::addmm", {tensor("input[0]", 1e-2, 1e3), tensor("output", 1e-2, kInf, 0, 4)}));
  r.stack = {"#0 model.cpp:12 forward()", "[... 5 library frames]"};
  return r;
}

// No coordinate may read nan or inf: the browser would drop the element or draw it at 0.
void expect_placed_coordinates(const std::string& html) {
  for (const char* attr : {" cx=\"", " cy=\"", " x=\"", " y=\"", " width=\"", " height=\"", " points=\"", " d=\""}) {
    const std::string a = attr;
    for (size_t pos = html.find(a); pos != std::string::npos; pos = html.find(a, pos + 1)) {
      const size_t start = pos + a.size(), end = html.find('"', start);
      const std::string value = html.substr(start, end - start);
      EXPECT_EQ(value.find("nan"), std::string::npos) << a << value;
      EXPECT_EQ(value.find("inf"), std::string::npos) << a << value;
    }
  }
}

TEST(HtmlReport, IsSelfContained) {
  const std::string html = sentinel::report::render_html(sample_report());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* ref : {"http://", "https://", "src=", "<link"}) EXPECT_EQ(html.find(ref), std::string::npos) << ref;
  EXPECT_EQ(count(html, "<style>"), 1u);
  EXPECT_EQ(count(html, "<script>"), 1u);
  EXPECT_NE(html.find("dataset.rendered"), std::string::npos);
  expect_placed_coordinates(html);
}

TEST(HtmlReport, EscapesEveryText) {
  Report r = sample_report();
  r.frames[2].module_path = "a<b>&\"c\"";
  r.frames[2].entries[0].label = "out<1>";
  r.origin = "inf in <module> & co";
  r.stack.push_back("std::vector<int> f(\"x\") & 'y'");
  r.torchscript_stack = {"model.py:3: return x<y"};
  const std::string html = sentinel::report::render_html(r);
  EXPECT_NE(html.find("a&lt;b&gt;&amp;&quot;c&quot;"), std::string::npos);
  EXPECT_EQ(html.find("a<b>"), std::string::npos);
  EXPECT_EQ(html.find("&\"c\""), std::string::npos);
  EXPECT_NE(html.find("out&lt;1&gt;"), std::string::npos);
  EXPECT_EQ(html.find("out<1>"), std::string::npos);
  EXPECT_NE(html.find("inf in &lt;module&gt; &amp; co"), std::string::npos);
  EXPECT_NE(html.find("std::vector&lt;int&gt; f(&quot;x&quot;) &amp; &#39;y&#39;"), std::string::npos);
  EXPECT_NE(html.find("return x&lt;y"), std::string::npos);
}

TEST(HtmlReport, OneRowPerFrameAndTheOriginIsTheLast) {
  const Report r = sample_report();
  const std::string html = sentinel::report::render_html(r);
  EXPECT_EQ(count(html, "<tr class=\"frame"), r.frames.size());
  EXPECT_EQ(count(html, "<tr class=\"frame backward"), 2u);
  EXPECT_EQ(count(html, "id=\"origin\""), 1u);
  const size_t row = html.rfind("<tr ", html.find("id=\"origin\""));
  EXPECT_EQ(html.substr(row, 80).find("<tr class=\"frame nonfinite origin\" id=\"origin\" data-index=\"5\""), 0u);
  EXPECT_EQ(count(html, "class=\"origin-line\""), 1u);
  // The backward layout: "grad of <forward op> <autograd node>".
  EXPECT_NE(html.find("grad of aten::addmm AddmmBackward0"), std::string::npos);
  EXPECT_NE(html.find("<td>1.00e-03</td><td>5.00e-01</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>1.00e-02</td><td>inf</td><td></td><td>4</td>"), std::string::npos);
  EXPECT_NE(html.find("id=\"stack\""), std::string::npos);
  EXPECT_EQ(html.find("id=\"torchscript-stack\""), std::string::npos);  // empty: no section

  Report trace = r;
  trace.kind = "trace";
  const std::string t = sentinel::report::render_html(trace);
  EXPECT_EQ(count(t, "<tr class=\"frame"), r.frames.size());
  EXPECT_EQ(t.find("id=\"origin\""), std::string::npos);
  EXPECT_EQ(t.find("origin-line"), std::string::npos);
  EXPECT_EQ(t.find(r.origin), std::string::npos);
}

TEST(HtmlReport, PlotHasOnePointPerPlaceableValue) {
  const std::string html = sentinel::report::render_html(sample_report());
  // Every frame has a finite tensor entry; the all-zero frame sits on the bottom edge.
  EXPECT_EQ(count(html, "class=\"pt pt-absmax"), 6u);
  // abs min counts zeros: frames 1 and 2 have no non-zero minimum.
  EXPECT_EQ(count(html, "class=\"pt pt-absmin"), 4u);
  EXPECT_EQ(html.find("class=\"pt pt-absmin\" data-frame=\"1\""), std::string::npos);
  EXPECT_EQ(html.find("class=\"pt pt-absmin\" data-frame=\"2\""), std::string::npos);
  EXPECT_NE(html.find("<title>#0 layers.0 (Linear) aten::addmm: abs min 2.00e-04</title>"), std::string::npos);
  EXPECT_EQ(count(html, "class=\"pt pt-absmax bwd\""), 2u);
  EXPECT_EQ(count(html, "class=\"pt pt-absmin bwd\""), 2u);
  EXPECT_NE(html.find("class=\"pt pt-absmax bwd\" data-frame=\"3\""), std::string::npos);
  EXPECT_EQ(count(html, "class=\"pt pt-nonfinite\" data-frame=\"5\""), 1u);
  EXPECT_EQ(count(html, "class=\"pt pt-nonfinite"), 1u);
  // The trigger's abs max comes from its finite entry only.
  EXPECT_NE(html.find("<title>#5 layers.1 (Linear) aten::addmm: abs max 1.00e+03</title>"), std::string::npos);
  EXPECT_NE(html.find("output: nan 0, inf 4"), std::string::npos);
  EXPECT_EQ(count(html, "class=\"bwd-band\""), 1u);  // frames 3 and 4 form one band
  expect_placed_coordinates(html);
}

TEST(HtmlReport, LimitLinesFollowTheData) {
  const std::string html = sentinel::report::render_html(sample_report());
  EXPECT_NE(html.find(">fp16 max 65504<"), std::string::npos);
  EXPECT_NE(html.find(">E4M3 max 448<"), std::string::npos);
  EXPECT_NE(html.find(">E5M2 max 57344<"), std::string::npos);
  EXPECT_NE(html.find(">1e-7<"), std::string::npos);    // the smallest value, 3e-7, is on the axis
  EXPECT_EQ(html.find("bf16 max"), std::string::npos);  // 1e38 is far outside the data
  EXPECT_EQ(html.find("fp16 min subnormal"), std::string::npos);

  Report wide;
  wide.frames.push_back(frame("tiny", "aten::mul", {tensor("output", 1e-45, 3e38)}));
  const std::string w = sentinel::report::render_html(wide);
  EXPECT_NE(w.find(">bf16 max 3.39e38<"), std::string::npos);
  EXPECT_NE(w.find(">fp16 min subnormal 5.96e-8<"), std::string::npos);
  EXPECT_NE(w.find(">bf16 min normal 1.18e-38<"), std::string::npos);
  EXPECT_LE(count(w, "class=\"ytick\""), 12u);  // 84 decades, thinned
  EXPECT_EQ(count(w, "class=\"pt pt-absmax"), 1u);
  EXPECT_EQ(count(w, "class=\"pt pt-absmin"), 1u);
  expect_placed_coordinates(w);
}

TEST(HtmlReport, EdgeCases) {
  Report empty;
  const std::string e = sentinel::report::render_html(empty);
  EXPECT_NE(e.find("No frames were recorded"), std::string::npos);
  EXPECT_EQ(e.find("class=\"pt"), std::string::npos);
  EXPECT_EQ(e.find("<tr class=\"frame"), std::string::npos);
  EXPECT_EQ(e.find("id=\"origin\""), std::string::npos);

  Report one;
  one.frames.push_back(frame("", "aten::add", {tensor("output", 2.0, 2.0)}));
  const std::string o = sentinel::report::render_html(one);
  EXPECT_EQ(count(o, "<tr class=\"frame"), 1u);
  EXPECT_EQ(count(o, "class=\"pt pt-absmax"), 1u);
  EXPECT_NE(o.find("&lt;root&gt;"), std::string::npos);
  EXPECT_NE(o.find(">fp16 max 65504<"), std::string::npos);  // far above the data, yet in view
  EXPECT_NE(o.find(">E4M3 max 448<"), std::string::npos);
  expect_placed_coordinates(o);

  // Non-finite statistics everywhere: nan abs_min, inf abs_max, an empty tensor, nothing finite.
  Report bad;
  bad.frames.push_back(frame("a", "aten::div", {tensor("output", kNaN, kNaN, 100)}));
  bad.frames.push_back(frame("b", "aten::exp", {tensor("output", kInf, kInf, 0, 100)}));
  Entry empty_tensor = tensor("input[0]", kInf, 0);
  empty_tensor.stats.count = 0;
  bad.frames.push_back(frame("c", "aten::sum", {empty_tensor}));
  const std::string b = sentinel::report::render_html(bad);
  EXPECT_EQ(count(b, "class=\"pt pt-nonfinite"), 2u);
  EXPECT_EQ(count(b, "class=\"pt pt-absmax"), 0u);
  EXPECT_NE(b.find("<tr class=\"bad\"><td>output</td><td>float32</td><td>nan</td><td>nan</td><td>100</td>"),
            std::string::npos);
  expect_placed_coordinates(b);

  Report equal;
  for (int i = 0; i < 4; ++i) equal.frames.push_back(frame("m", "aten::add", {tensor("output", 1.0, 1.0)}));
  const std::string q = sentinel::report::render_html(equal);
  EXPECT_EQ(count(q, "class=\"pt pt-absmax"), 4u);
  EXPECT_NE(q.find(">1e0<"), std::string::npos);
  expect_placed_coordinates(q);
}

TEST(HtmlReport, EntryDetails) {
  Report r = sample_report();
  Entry skipped = tensor("mask", 0, 0), none = tensor("bias", 0, 0);
  skipped.kind = sentinel::EntryKind::Skipped;
  skipped.skip_reason = "sparse";
  none.kind = sentinel::EntryKind::None;
  r.frames[0].entries.insert(r.frames[0].entries.end(), {skipped, none});
  r.frames[0].entries_omitted = 12;
  r.frames[0].entries[0].stats.subnormal = 9;
  r.deferred = true;
  r.dump_dir = "/tmp/dumps/op_5";
  r.world_size = 4;
  r.rank = 1;
  const std::string html = sentinel::report::render_html(r);
  EXPECT_NE(html.find("skipped: sparse"), std::string::npos);
  EXPECT_NE(html.find(">None<"), std::string::npos);
  EXPECT_NE(html.find("12 more entries, checked, not shown"), std::string::npos);
  // weight: no nan, inf or zeros; 9 subnormal values.
  EXPECT_NE(html.find("<td>1.00e-03</td><td>5.00e-01</td><td></td><td></td><td></td><td>9</td>"), std::string::npos);
  EXPECT_NE(html.find("Deferred"), std::string::npos);
  EXPECT_NE(html.find("sentinel replay /tmp/dumps/op_5"), std::string::npos);
  EXPECT_NE(html.find("<dd>1 of 4 (alone)</dd>"), std::string::npos);
  EXPECT_NE(html.find("The op made it"), std::string::npos);
}

TEST(HtmlReport, HeadroomSummaryLinksTheFirstFrames) {
  Report r = sample_report();
  for (auto& f : r.frames) {
    for (auto& e : f.entries) e.has_headroom = true;
  }
  r.frames[2].entries[0].headroom.fp16_underflow = 3;
  r.frames[5].entries[0].headroom.fp16_overflow = 2;
  r.frames[4].entries[0].headroom.fp16_underflow = 1;
  const std::string html = sentinel::report::render_html(r);
  EXPECT_NE(html.find("Frames checked: 6."), std::string::npos);
  EXPECT_NE(html.find("<td>fp16 overflow</td><td class=\"n\">1</td><td><a href=\"#frame-5\">"), std::string::npos);
  EXPECT_NE(html.find("<td>fp16 underflow</td><td class=\"n\">2</td><td><a href=\"#frame-2\">"), std::string::npos);
  EXPECT_NE(html.find("<td>bf16 overflow</td><td class=\"n\">0</td><td>-</td>"), std::string::npos);
  EXPECT_NE(html.find("fp16 overflow 2"), std::string::npos);
  EXPECT_EQ(count(html, "id=\"frame-5\""), 1u);  // the link target exists, beside id="origin"

  const std::string off = sentinel::report::render_html(sample_report());
  EXPECT_NE(off.find("Not checked"), std::string::npos);
}

sentinel::Fp8SlotMetrics slot_metrics(const std::string& path, int64_t step, double amax) {
  sentinel::Fp8SlotMetrics m;
  m.step = step;
  m.module_path = path;
  m.role = "activation";
  m.format = "E4M3";
  m.cur_amax = amax;
  m.current_scale = 448 / amax;
  m.delayed_scale = 448 / (amax * 0.5);
  m.drift_log2 = 1;
  m.overflow_pct = 0.5 * static_cast<double>(step);
  return m;
}

TEST(HtmlReport, Fp8HistoryGivesOnePlotPairPerSlot) {
  std::vector<sentinel::Fp8SlotMetrics> history;
  for (int64_t step = 1; step <= 3; ++step) {
    history.push_back(slot_metrics("fc1", step, 10.0 * step));
    history.push_back(slot_metrics("fc2", step, 0.5 * step));
  }
  Report r;
  r.kind = "fp8_alarm";
  r.batch_number = 3;
  r.fp8_metrics = {slot_metrics("fc1", 3, 30), slot_metrics("fc2", 3, 1.5)};  // repeats the log's last step
  r.fp8_alarms.push_back({slot_metrics("fc2", 3, 1.5), "overflow 1.50% > 0.10%"});
  const std::string html = sentinel::report::render_html(r, history);
  EXPECT_EQ(html.find("Magnitudes"), std::string::npos);  // an FP8 alarm has no frames to plot
  EXPECT_EQ(count(html, "<div class=\"slot\">"), 2u);
  EXPECT_EQ(count(html, "class=\"plot fp8-amax\""), 2u);
  EXPECT_EQ(count(html, "class=\"plot fp8-pct\""), 2u);
  const size_t second = html.find("<div class=\"slot\">", html.find("<div class=\"slot\">") + 1);
  for (const std::string& part : {html.substr(0, second), html.substr(second)}) {
    for (const char* s : {"class=\"pt pt-amax\"", "class=\"pt pt-dscale\"", "class=\"pt pt-cscale\"",
                          "class=\"pt pt-ovf\"", "class=\"pt pt-unf\""}) {
      EXPECT_EQ(count(part, s), 3u) << s;
    }
  }
  EXPECT_NE(html.find("<li class=\"alarm\"><b>overflow 1.50% &gt; 0.10%</b>: fc2 activation (delayed, E4M3)"),
            std::string::npos);
  EXPECT_EQ(count(html, "<tr class=\"alarm\"><td>fc2 activation"), 1u);
  EXPECT_EQ(count(html, "class=\"alarm-line\""), 2u);  // step 3 of fc2, on both of its plots
  EXPECT_NE(html.find(">E4M3 max 448<"), std::string::npos);
  EXPECT_NE(html.find("drift log2 (delayed / current) at the last step +1.00"), std::string::npos);
  expect_placed_coordinates(html);

  std::vector<sentinel::Fp8SlotMetrics> many;
  for (int i = 0; i < 30; ++i) many.push_back(slot_metrics("m" + std::to_string(i), 1, 1.0));
  const std::string capped = sentinel::report::render_html(Report{}, many);
  EXPECT_EQ(count(capped, "<div class=\"slot\">"), 24u);
  EXPECT_NE(capped.find("6 more slots not drawn"), std::string::npos);
  EXPECT_EQ(count(capped, "<tr><td>m"), 30u);
}

TEST(HtmlReport, ThousandsOfFramesStayUsable) {
  Report r;
  for (int i = 0; i < 5000; ++i) {
    r.frames.push_back(frame("layers." + std::to_string(i % 48), "aten::addmm",
                             {tensor("input[0]", 1e-3, 1.0 + i), tensor("output", 1e-4, 2.0 + i)},
                             i >= 2500 ? Direction::Backward : Direction::Forward));
  }
  const std::string html = sentinel::report::render_html(r);
  EXPECT_LT(html.size(), 5u << 20);
  EXPECT_EQ(count(html, "<tr class=\"frame"), 5000u);
  EXPECT_EQ(count(html, "class=\"pt pt-absmax"), 5000u);
  EXPECT_EQ(count(html, "class=\"pt pt-absmin"), 5000u);
  EXPECT_EQ(count(html, "<title>"), 1u);  // the page's own; points get theirs from the script
  EXPECT_LE(count(html, "class=\"xtick\""), 20u);
  expect_placed_coordinates(html);
}

sentinel::report::TraceDiff sample_diff() {
  sentinel::report::TraceDiff d;
  d.name_a = "a<1>.json";
  d.name_b = "b.json";
  d.rtol = 1e-3;
  d.atol = 1e-6;
  d.verdict = sentinel::report::DiffVerdict::Diverged;
  for (int i = 0; i < 5; ++i) {
    sentinel::report::MatchedFrame m;
    m.index_a = i;
    m.index_b = i + 1;
    m.module_path = "layers." + std::to_string(i);
    m.module_class = "Linear";
    m.op = "aten::addmm";
    m.direction = i == 4 ? Direction::Backward : Direction::Forward;
    const double relative[] = {0, 1e-4, 1e-2, 1, 0.5};
    m.worst = {"output", "abs_max", 1.0, 1.0 + relative[i], relative[i], relative[i] / 1e-3};
    m.diverged = i >= 2;
    d.matched.push_back(m);
  }
  d.first_divergent = 2;
  d.only_a.push_back({7, Direction::Forward, "head", "aten::softmax", 0});
  return d;
}

TEST(HtmlDiff, MarksTheFirstDivergentFrame) {
  const auto d = sample_diff();
  const std::string html = sentinel::report::render_diff_html(d);
  for (const char* ref : {"http://", "https://", "src=", "<link"}) EXPECT_EQ(html.find(ref), std::string::npos) << ref;
  EXPECT_NE(html.find("Diverged at frame <a href=\"#first-divergent\">2 layers.2 (Linear) aten::addmm #0</a>"),
            std::string::npos);
  EXPECT_EQ(count(html, "<tr class=\"matched"), 5u);
  EXPECT_EQ(count(html, "id=\"first-divergent\""), 1u);
  EXPECT_NE(html.find("<tr class=\"matched diverged first-divergent\" id=\"first-divergent\" data-index=\"2\""),
            std::string::npos);
  EXPECT_EQ(count(html, " diverged"), 3u);
  EXPECT_EQ(count(html, "class=\"pt pt-diff"), 5u);
  EXPECT_EQ(count(html, "class=\"pt pt-diff div\""), 3u);
  EXPECT_NE(html.find("class=\"pt pt-diff\" data-frame=\"0\""), std::string::npos);  // relative 0: on the edge
  EXPECT_NE(html.find(">rtol 0.001<"), std::string::npos);
  EXPECT_EQ(count(html, "class=\"first-divergent-line\""), 1u);
  EXPECT_NE(html.find("a&lt;1&gt;.json"), std::string::npos);
  EXPECT_EQ(count(html, "<tr class=\"only-a\">"), 1u);
  EXPECT_EQ(count(html, "<tr class=\"only-b\">"), 0u);
  expect_placed_coordinates(html);

  sentinel::report::TraceDiff nc;
  nc.verdict = sentinel::report::DiffVerdict::NotComparable;
  nc.not_comparable = "kind <fp8_alarm> is not a trace";
  const std::string n = sentinel::report::render_diff_html(nc);
  EXPECT_NE(n.find("Not comparable: kind &lt;fp8_alarm&gt; is not a trace"), std::string::npos);
  EXPECT_EQ(n.find("class=\"pt"), std::string::npos);

  auto same = sample_diff();
  same.verdict = sentinel::report::DiffVerdict::Same;
  same.first_divergent.reset();
  for (auto& m : same.matched) m.diverged = false;
  const std::string s = sentinel::report::render_diff_html(same);
  EXPECT_NE(s.find("Same: every matched frame"), std::string::npos);
  EXPECT_EQ(s.find("id=\"first-divergent\""), std::string::npos);
}

TEST(SvgPlot, TicksAndEscaping) {
  namespace svg = sentinel::report::svg;
  EXPECT_EQ(svg::escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
  EXPECT_EQ(svg::log_ticks(-3, 2), (std::vector<double>{-3, -2, -1, 0, 1, 2}));
  const auto wide = svg::log_ticks(-45, 39);
  EXPECT_LE(wide.size(), 12u);
  EXPECT_GE(wide.size(), 4u);
  const auto unit = svg::linear_ticks(0, 1, 5);
  ASSERT_EQ(unit.size(), 6u);
  for (size_t i = 0; i < unit.size(); ++i) EXPECT_NEAR(unit[i], 0.2 * static_cast<double>(i), 1e-12);
  EXPECT_EQ(svg::linear_ticks(-0.5, 3.5, 10, true), (std::vector<double>{0, 1, 2, 3}));
  svg::Chart chart(300, 200);
  chart.set_axes("", "", true);
  svg::Series s{"s", "pt pt-s"};
  for (double y : {kNaN, kInf, -1.0, 0.0, 5.0}) s.points.emplace_back(1, y);
  chart.add_series(s);
  chart.add_marker({kNaN, "nowhere", "vmark"});
  const std::string out = chart.render();
  EXPECT_EQ(count(out, "class=\"pt pt-s\""), 1u);  // only 5 can be placed on a log axis
  expect_placed_coordinates(out);
}

// --- The page as Chromium renders it -------------------------------------------------------

std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  pclose(pipe);
  return out;
}

std::string chromium_path() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

TEST(HtmlBrowser, RendersInHeadlessChromium) {
  const std::string chromium = chromium_path();
  ASSERT_FALSE(chromium.empty()) << "chromium is missing: the project's setup installs it (apt-get install chromium)";
  char tmpl[] = "/tmp/sentinel_html_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const char* artifacts = std::getenv("SENTINEL_ARTIFACT_DIR");
  const std::string out_dir = artifacts && *artifacts ? artifacts : dir;
  std::filesystem::create_directories(out_dir);

  Report r = sample_report();
  r.frames[0].entries[0].has_headroom = true;
  std::vector<sentinel::Fp8SlotMetrics> history;
  for (int64_t step = 1; step <= 5; ++step) history.push_back(slot_metrics("layers.1", step, 3.0 * step));
  struct Page {
    std::string name, html;
  };
  const std::vector<Page> pages = {{"html_report", sentinel::report::render_html(r, history)},
                                   {"html_diff", sentinel::report::render_diff_html(sample_diff())}};
  for (const auto& page : pages) {
    const std::string path = dir + "/" + page.name + ".html";
    std::ofstream(path) << page.html;
    const std::string profile = dir + "/profile-" + page.name;
    const std::string flags = " --headless --no-sandbox --disable-gpu --user-data-dir=" + profile;
    const std::string dom = run("timeout 60 " + chromium + flags + " --virtual-time-budget=2000 --dump-dom file://" +
                                path + " 2>/dev/null");
    ASSERT_NE(dom.find("data-rendered=\"1\""), std::string::npos) << page.name << ": the script did not run\n"
                                                                  << dom.substr(0, 400);
    EXPECT_EQ(dom.find("id=\"filter\" type=\"search\" placeholder=\"filter frames\" hidden"), std::string::npos);
    if (page.name == "html_report") {
      EXPECT_NE(dom.find("id=\"origin\""), std::string::npos);
      EXPECT_EQ(count(dom, "<tr class=\"frame"), r.frames.size());
      EXPECT_EQ(count(dom, "class=\"pt pt-absmax"), r.frames.size());
      EXPECT_EQ(count(dom, "class=\"pt pt-amax\""), 5u);
    } else {
      EXPECT_EQ(count(dom, "<tr class=\"matched"), 5u);
      EXPECT_EQ(count(dom, "class=\"pt pt-diff"), 5u);
      EXPECT_NE(dom.find("id=\"first-divergent\""), std::string::npos);
    }
    const std::string png = out_dir + "/" + page.name + ".png";
    std::remove(png.c_str());
    run("timeout 60 " + chromium + flags + "-shot --screenshot=" + png + " --window-size=1400,2000 file://" + path +
        " >/dev/null 2>&1");
    std::ifstream in(png, std::ios::binary);
    ASSERT_TRUE(in.good()) << "no screenshot at " << png;
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_GT(bytes.size(), 1000u);
    EXPECT_EQ(bytes.substr(1, 3), "PNG");
    std::printf("screenshot: %s\n", png.c_str());
    std::filesystem::remove_all(profile);
    std::filesystem::remove_all(profile + "-shot");
  }
}

}  // namespace

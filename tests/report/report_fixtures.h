#pragma once
// Reports built by hand for the tests of the report readers and renderers: every kind of entry,
// both directions, non-finite statistics, FP8 metrics of a block recipe, the ranks' agreement.
#include <sentinel/report.h>

#include <cmath>
#include <string>

namespace report_test {

inline sentinel::Entry tensor_entry(const std::string& label, double abs_min, double abs_max, int64_t count = 64) {
  sentinel::Entry e;
  e.label = label;
  e.dtype = "float32";
  e.stats.count = count;
  e.stats.abs_min = abs_min;
  e.stats.abs_max = abs_max;
  e.is_output = label.rfind("output", 0) == 0;
  return e;
}

inline sentinel::Frame frame(const std::string& path, const std::string& cls, const std::string& op,
                             sentinel::Direction d = sentinel::Direction::Forward) {
  sentinel::Frame f;
  f.module_path = path;
  f.module_class = cls;
  f.op = op;
  f.direction = d;
  return f;
}

// A trace of one batch: fc1 (Linear) -> tanh -> add -> sub -> fc2 (Linear); `scale` multiplies
// every abs_max from frame `from` on (1: unchanged).
inline sentinel::Report trace(double scale = 1.0, size_t from = 0) {
  sentinel::Report r;
  r.kind = "trace";
  r.batch_number = 0;
  const char* ops[][3] = {{"fc1", "Linear", "aten::linear"}, {"", "Cancellation", "aten::tanh"},
                          {"", "Cancellation", "aten::add"},   {"", "Cancellation", "aten::sub"},
                          {"fc2", "Linear", "aten::linear"}};
  for (size_t i = 0; i < 5; ++i) {
    sentinel::Frame f = frame(ops[i][0], ops[i][1], ops[i][2]);
    f.op_index = static_cast<int64_t>(i);
    const double s = i >= from ? scale : 1.0;
    f.entries.push_back(tensor_entry("input[0]", 1e-3 * (i + 1), 1.0 + i));
    f.entries.push_back(tensor_entry("output", 2e-3 * (i + 1), (2.0 + i) * s));
    r.frames.push_back(f);
  }
  return r;
}

// A report using every field the JSON holds.
inline sentinel::Report full_report() {
  using namespace sentinel;
  Report r;
  r.kind = "nonfinite";
  r.batch_number = 3;
  r.produced_here = true;
  r.origin = "origin: aten::mul in encoder.ff (Dense) made inf from finite inputs";
  r.rank = 1;
  r.world_size = 2;
  r.stack = {"main at x.cpp:3", "[... 12 library frames]"};
  r.torchscript_stack = {"model.py:10: y = x * w"};
  r.deferred = true;
  r.dump_dir = "out/sentinel_batch3_dump";
  r.phase = "evaluation";
  Frame f = frame("encoder.ff", "Dense", "aten::mul");
  f.batch_number = 3;
  f.op_index = 17;
  f.attribution = Attribution::ModuleHierarchy;
  f.outputs_finite = false;
  f.entries_omitted = 2;
  Entry w = tensor_entry("weight", 0.0, 3.5e38);
  w.stats.zeros = 4;
  w.stats.subnormal = 1;
  w.has_headroom = true;
  w.headroom = {5, 6, 7, 8};
  f.entries.push_back(w);
  Entry none;
  none.label = "input[1]";
  none.kind = EntryKind::None;
  f.entries.push_back(none);
  Entry nat;
  nat.label = "input[2]";
  nat.kind = EntryKind::NotATensor;
  f.entries.push_back(nat);
  Entry skipped;
  skipped.label = "input[3]";
  skipped.kind = EntryKind::Skipped;
  skipped.skip_reason = "sparse";
  f.entries.push_back(skipped);
  Entry out = tensor_entry("output", 1e-30, INFINITY);
  out.stats.pos_inf = 2;
  out.stats.neg_inf = 1;
  out.stats.nan = 3;
  f.entries.push_back(out);
  Frame g = frame("encoder.ff", "Dense", "MulBackward0", Direction::Backward);
  g.forward_op = "aten::mul";
  g.batch_number = 2;
  g.attribution = Attribution::Parameter;
  Entry all_nan = tensor_entry("grad_output[0]", NAN, NAN, 4);
  all_nan.stats.nan = 4;
  g.entries.push_back(all_nan);
  r.frames = {g, f};
  Fp8SlotMetrics m;
  m.step = 3;
  m.module_path = "encoder.ff";
  m.role = "activation";
  m.recipe = "mxfp8";
  m.format = "E4M3";
  m.uses = 2;
  m.cur_amax = 12.5;
  m.drift_log2 = -0.25;
  m.count = 640;
  m.overflow = 1;
  m.underflow = 9;
  m.overflow_pct = 100.0 / 640;
  m.underflow_pct = 900.0 / 640;
  m.mse = 1.25e-5;
  m.cosine = 0.999987654321;
  m.sqnr_db = 38.125;
  m.blocks = 20;
  m.blocks_zero = 1;
  m.blocks_saturated = 2;
  m.blocks_at_min = 3;
  m.blocks_nonfinite = 4;
  m.lost = 5;
  m.block_scales = {{0.015625, 12}, {0.03125, 8}};
  Fp8SlotMetrics d = m;
  d.recipe = "delayed";
  d.blocks = 0;
  d.block_scales.clear();
  d.blocks_zero = d.blocks_saturated = d.blocks_at_min = d.blocks_nonfinite = d.lost = 0;
  d.delayed_scale = 35.84;
  d.current_scale = INFINITY;
  r.fp8_metrics = {d, m};
  r.fp8_alarms = {Fp8Alarm{d, "overflow 0.156% > 0.100%"}};
  r.ranks.exchanged = true;
  r.ranks.role = RankRole::Received;
  r.ranks.tripped = {0, 1};
  r.ranks.missing = {3};
  r.ranks.problem = "rank 3 did not answer";
  r.ranks.host = "node-b";
  r.ranks.local_rank = 1;
  RankEvent e;
  e.rank = 0;
  e.batch_number = 3;
  e.direction = Direction::Forward;
  e.op_index = 16;
  e.frame = "encoder.ff (Dense) aten::mul";
  e.origin = "origin: ...";
  e.role = RankRole::Made;
  e.host = "node-a";
  e.local_rank = 0;
  r.ranks.first = e;
  return r;
}

}  // namespace report_test

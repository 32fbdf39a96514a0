#pragma once
// Runs a scenario watched plainly and through a deferring device (src/device/), and checks that
// everything the user can see agrees: report, frames, entries, FP8 metrics, headroom summary.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "device/stats_device.h"
#include "support/expect_stats.h"

namespace sentinel_test {

namespace device = sentinel::device;

// Watchdogs made while one is alive read every CPU tensor through `factory`.
struct DeviceFactoryScope {
  explicit DeviceFactoryScope(device::DeviceFactory factory) { device::set_device_factory_for_testing(factory); }
  ~DeviceFactoryScope() { device::set_device_factory_for_testing(nullptr); }
};

// What one run left behind.
struct Outcome {
  std::optional<sentinel::Report> report;
  std::vector<sentinel::Frame> saved;
  std::string output;
  sentinel::HeadroomSummary headroom;
  std::vector<sentinel::Fp8SlotMetrics> fp8;
  sentinel::DeviceCounters counters;
  int trips = 0;  // NonFiniteErrors caught
};

using Scenario = std::function<void(sentinel::Watchdog&, Outcome&)>;

inline Outcome run(sentinel::Watchdog& watch, const Scenario& scenario, std::ostringstream& out) {
  Outcome o;
  try {
    scenario(watch, o);
  } catch (const sentinel::NonFiniteError&) {
    ++o.trips;
  }
  o.report = watch.last_report();
  o.saved = watch.saved_frames();
  o.output = out.str();
  o.headroom = watch.headroom();
  o.fp8 = watch.fp8_metrics();
  o.counters = watch.device_counters();
  return o;
}

inline void expect_same_entry(const sentinel::Entry& got, const sentinel::Entry& want) {
  SCOPED_TRACE(want.label);
  EXPECT_EQ(got.label, want.label);
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.skip_reason, want.skip_reason);
  EXPECT_EQ(got.is_output, want.is_output);
  EXPECT_EQ(got.has_headroom, want.has_headroom);
  EXPECT_EQ(got.headroom.fp16_overflow, want.headroom.fp16_overflow);
  EXPECT_EQ(got.headroom.fp16_underflow, want.headroom.fp16_underflow);
  EXPECT_EQ(got.headroom.bf16_overflow, want.headroom.bf16_overflow);
  EXPECT_EQ(got.headroom.bf16_underflow, want.headroom.bf16_underflow);
  expect_same_stats(got.stats, want.stats);
}

inline std::string frame_list(const std::vector<sentinel::Frame>& frames) {
  std::string out;
  for (const auto& f : frames) out += std::to_string(f.batch_number) + " " + f.module_path + " " + f.op + "\n";
  return out;
}

inline void expect_same_frames(const std::vector<sentinel::Frame>& got, const std::vector<sentinel::Frame>& want) {
  ASSERT_EQ(frame_list(got), frame_list(want));
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& g = got[i];
    const auto& w = want[i];
    SCOPED_TRACE(w.module_path + " " + w.op);
    EXPECT_EQ(g.batch_number, w.batch_number);
    EXPECT_EQ(g.op_index, w.op_index);
    EXPECT_EQ(g.direction, w.direction);
    EXPECT_EQ(g.module_path, w.module_path);
    EXPECT_EQ(g.module_class, w.module_class);
    EXPECT_EQ(g.op, w.op);
    EXPECT_EQ(g.forward_op, w.forward_op);
    EXPECT_EQ(g.attribution, w.attribution);
    EXPECT_EQ(g.entries_omitted, w.entries_omitted);
    EXPECT_EQ(g.inputs_finite, w.inputs_finite);
    EXPECT_EQ(g.outputs_finite, w.outputs_finite);
    ASSERT_EQ(g.entries.size(), w.entries.size());
    for (size_t k = 0; k < w.entries.size(); ++k) expect_same_entry(g.entries[k], w.entries[k]);
  }
}

inline void expect_same_fp8(const std::vector<sentinel::Fp8SlotMetrics>& got, const std::vector<sentinel::Fp8SlotMetrics>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].module_path + " " + want[i].role);
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].module_path, want[i].module_path);
    EXPECT_EQ(got[i].role, want[i].role);
    EXPECT_EQ(got[i].uses, want[i].uses);
    EXPECT_EQ(got[i].cur_amax, want[i].cur_amax);
    EXPECT_EQ(got[i].delayed_scale, want[i].delayed_scale);
    EXPECT_EQ(got[i].count, want[i].count);
    EXPECT_EQ(got[i].overflow, want[i].overflow);
    EXPECT_EQ(got[i].underflow, want[i].underflow);
    EXPECT_DOUBLE_EQ(got[i].mse, want[i].mse);
    EXPECT_EQ(got[i].recipe, want[i].recipe);
    EXPECT_EQ(got[i].format, want[i].format);
    EXPECT_EQ(got[i].blocks, want[i].blocks);
    EXPECT_EQ(got[i].blocks_zero, want[i].blocks_zero);
    EXPECT_EQ(got[i].blocks_saturated, want[i].blocks_saturated);
    EXPECT_EQ(got[i].blocks_at_min, want[i].blocks_at_min);
    EXPECT_EQ(got[i].blocks_nonfinite, want[i].blocks_nonfinite);
    EXPECT_EQ(got[i].block_scales, want[i].block_scales);
  }
}

// The same scenario watched plainly and through a deferring device; everything the user can
// see must agree. Returns the deferred run for checks of its own.
template <typename MakeWatch>
Outcome expect_same_as_plain(MakeWatch make_watch, sentinel::Options options, const Scenario& scenario,
                             device::DeviceFactory factory = device::make_cpu_deferred_device) {
  std::ostringstream plain_out, deferred_out;
  Outcome plain;
  {
    auto watch = make_watch(sentinel::Options(options).output(plain_out));
    plain = run(*watch, scenario, plain_out);
  }
  Outcome deferred;
  {
    DeviceFactoryScope scope(factory);
    auto watch = make_watch(sentinel::Options(options).output(deferred_out));
    deferred = run(*watch, scenario, deferred_out);
  }
  if (std::getenv("SENTINEL_TEST_DEBUG")) std::cerr << "PLAIN\n" << plain.output << "DEFERRED\n" << deferred.output;
  EXPECT_EQ(plain.counters.tensors_read_on_device, 0);
  EXPECT_GT(deferred.counters.tensors_read_on_device, 0) << "the device read nothing: the test proves nothing";
  EXPECT_EQ(deferred.trips, plain.trips);
  EXPECT_EQ(deferred.report.has_value(), plain.report.has_value());
  if (plain.report && deferred.report) {
    const auto& p = *plain.report;
    const auto& d = *deferred.report;
    EXPECT_EQ(d.batch_number, p.batch_number);
    EXPECT_EQ(d.origin, p.origin);
    EXPECT_EQ(d.produced_here, p.produced_here);
    EXPECT_FALSE(p.deferred);
    expect_same_frames(d.frames, p.frames);
  }
  // After a trip that stops the run, what each path still records before the error reaches the
  // caller differs by design (the deferred one knew of the trip later); the report is the same.
  if (plain.trips == 0) expect_same_frames(deferred.saved, plain.saved);
  expect_same_fp8(deferred.fp8, plain.fp8);
  EXPECT_EQ(deferred.headroom.frames_checked, plain.headroom.frames_checked);
  EXPECT_EQ(deferred.headroom.frames_fp16_overflow, plain.headroom.frames_fp16_overflow);
  EXPECT_EQ(deferred.headroom.frames_fp16_underflow, plain.headroom.frames_fp16_underflow);
  EXPECT_EQ(deferred.headroom.frames_bf16_overflow, plain.headroom.frames_bf16_overflow);
  EXPECT_EQ(deferred.headroom.frames_bf16_underflow, plain.headroom.frames_bf16_underflow);
  EXPECT_EQ(deferred.headroom.first_fp16_overflow.has_value(), plain.headroom.first_fp16_overflow.has_value());
  if (plain.headroom.first_fp16_overflow && deferred.headroom.first_fp16_overflow) {
    expect_same_frames({*deferred.headroom.first_fp16_overflow}, {*plain.headroom.first_fp16_overflow});
  }
  return deferred;
}

template <typename Model>
auto cpp_watch(Model model) {
  return [model](sentinel::Options o) { return std::make_unique<sentinel::Watchdog>(model.ptr(), std::move(o)); };
}

}  // namespace sentinel_test

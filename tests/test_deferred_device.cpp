// Deferred detection, run on the CPU: a device that holds each tensor's numbers back until a
// read-back (as the CUDA device does) must give the same frames, origin, batch and summaries as
// the plain CPU path, whatever the read-back period, ring size or per-op synchronisation.
// The same scenarios run on a GPU in tests/cuda/test_cuda_watch.cpp.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <functional>
#include <sstream>
#include <stdexcept>

#include "cli/demo_model.h"
#include "device/stats_device.h"
#include "support/expect_stats.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;
namespace device = sentinel::device;

// Watchdogs made while one is alive read every CPU tensor through `factory`.
struct DeviceFactoryScope {
  explicit DeviceFactoryScope(device::DeviceFactory factory) { device::set_device_factory_for_testing(factory); }
  ~DeviceFactoryScope() { device::set_device_factory_for_testing(nullptr); }
};

std::unique_ptr<device::StatsDevice> tiny_ring(int64_t) { return device::make_cpu_deferred_device(8); }

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

Outcome run(sentinel::Watchdog& watch, const Scenario& scenario, std::ostringstream& out) {
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

void expect_same_entry(const sentinel::Entry& got, const sentinel::Entry& want) {
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

std::string frame_list(const std::vector<sentinel::Frame>& frames) {
  std::string out;
  for (const auto& f : frames) out += std::to_string(f.batch_number) + " " + f.module_path + " " + f.op + "\n";
  return out;
}

void expect_same_frames(const std::vector<sentinel::Frame>& got, const std::vector<sentinel::Frame>& want) {
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

void expect_same_fp8(const std::vector<sentinel::Fp8SlotMetrics>& got, const std::vector<sentinel::Fp8SlotMetrics>& want) {
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

// Batches of TwoBlocks at growing scale: exp inside encoder.1 overflows at the third.
Scenario growing_batches(TwoBlocks model, int batches = 4) {
  return [model, batches](sentinel::Watchdog& watch, Outcome&) mutable {
    for (int b = 0; b < batches; ++b) {
      auto step = watch.batch();
      model->forward(small_input(2, 4, b == 2 ? 100.0 : 1.0));
      step.finish();
    }
  };
}

TEST(DeferredDevice, ForwardTripIsTheExactFirstFrameWithThePlainReport) {
  torch::manual_seed(0);
  TwoBlocks model;
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options(), growing_batches(model));
  ASSERT_TRUE(d.report);
  EXPECT_EQ(d.report->batch_number, 2);
  EXPECT_EQ(d.report->trigger().op, "aten::exp");
  EXPECT_TRUE(d.report->deferred);
  EXPECT_TRUE(d.report->stack.empty());
  EXPECT_NE(d.output.find("Found when the device's statistics were read back"), std::string::npos);
  // Clean batches 0 and 1 and the bad one: one host wait each.
  EXPECT_EQ(d.counters.readbacks, 3);
  EXPECT_GT(d.counters.frames_deferred, 0);
}

TEST(DeferredDevice, BackwardTripAtTheGradientNode) {
  torch::manual_seed(0);
  struct SqrtImpl : torch::nn::Module {
    SqrtImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
    torch::Tensor forward(torch::Tensor x) { return torch::sqrt(torch::relu(fc(x))).sum(); }
    torch::nn::Linear fc{nullptr};
  };
  auto model = std::make_shared<SqrtImpl>();
  auto make = [model](sentinel::Options o) { return std::make_unique<sentinel::Watchdog>(model, std::move(o)); };
  Scenario step = [model](sentinel::Watchdog& watch, Outcome&) {
    model->zero_grad();  // each run starts from the same gradients
    auto guard = watch.batch();
    auto loss = model->forward(small_input());
    watch.backward(loss);
    guard.finish();
  };
  auto d = expect_same_as_plain(make, sentinel::Options().max_frames_to_save(40), step);
  ASSERT_TRUE(d.report);
  EXPECT_EQ(d.report->trigger().direction, sentinel::Direction::Backward);
  EXPECT_EQ(d.report->trigger().op, "SqrtBackward0");
}

TEST(DeferredDevice, ParameterGradientsAreCheckedThroughTheDevice) {
  torch::manual_seed(0);
  Mlp model;
  Scenario step = [model](sentinel::Watchdog& watch, Outcome&) mutable {
    model->zero_grad();
    auto guard = watch.batch();
    auto loss = model->forward(small_input()).sum();
    loss.backward();
    // Written around the watchdog (no op it could see): only the gradient check can find it.
    model->fc1->bias.grad().data_ptr<float>()[1] = std::numeric_limits<float>::infinity();
    guard.finish();
  };
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options().max_frames_to_save(60), step);
  ASSERT_TRUE(d.report);
  EXPECT_NE(d.report->origin.find("bias.grad"), std::string::npos) << d.report->origin;
}

TEST(DeferredDevice, ReadBackEveryFewFramesOrAfterEachOpChangesOnlyWhenTheHostWaits) {
  torch::manual_seed(0);
  TwoBlocks model;
  auto every3 = expect_same_as_plain(cpp_watch(model), sentinel::Options().device_readback_frames(3), growing_batches(model));
  auto each_op = expect_same_as_plain(cpp_watch(model), sentinel::Options().device_sync_each_op(true), growing_batches(model));
  // Every op waits: one read-back per frame, and the trip is made at the op, with its stack.
  EXPECT_EQ(each_op.counters.readbacks, each_op.counters.frames_deferred);
  ASSERT_TRUE(each_op.report);
  EXPECT_FALSE(each_op.report->deferred);
  EXPECT_FALSE(each_op.report->stack.empty());
  EXPECT_LT(every3.counters.readbacks, each_op.counters.readbacks);
  EXPECT_GE(every3.counters.readbacks, (every3.counters.frames_deferred + 2) / 3);
}

TEST(DeferredDevice, ASmallRingForcesReadBacksAndLosesNothing) {
  torch::manual_seed(0);
  TwoBlocks model;
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options(), growing_batches(model), tiny_ring);
  EXPECT_GT(d.counters.readbacks, 3);
}

TEST(DeferredDevice, ShortRingOfSavedFramesHoldsTheSameLastFrames) {
  torch::manual_seed(0);
  TwoBlocks model;
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options().max_frames_to_save(2), growing_batches(model));
  ASSERT_TRUE(d.report);
  EXPECT_EQ(d.report->frames.size(), 2u);
}

TEST(DeferredDevice, WarnReportsEachBadBatchOnceAndTracedBatchesPrintTheSameFrames) {
  torch::manual_seed(0);
  TwoBlocks model;
  Scenario two_bad = [model](sentinel::Watchdog& watch, Outcome&) mutable {
    for (int b = 0; b < 5; ++b) {
      auto step = watch.batch();
      model->forward(small_input(2, 4, b == 1 || b == 3 ? 100.0 : 1.0));
      step.finish();
    }
  };
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options().action(sentinel::Action::Warn).trace_batch_nums({0, 4}),
                                two_bad);
  // The traced frames and both reports, as text, in the same order.
  std::ostringstream plain_out;
  {
    sentinel::Watchdog plain(model.ptr(), sentinel::Options().action(sentinel::Action::Warn).trace_batch_nums({0, 4}).output(plain_out));
    Outcome ignored;
    two_bad(plain, ignored);
  }
  // The deferred run's note and the plain run's stack (where its op ran) differ by design.
  auto without_stacks = [](const std::string& text) {
    std::istringstream in(text);
    std::string out, line;
    bool in_stack = false;
    while (std::getline(in, line)) {
      if (line.rfind("C++ call stack at detection", 0) == 0) {
        in_stack = true;
        continue;
      }
      if (in_stack && line.rfind("  ", 0) == 0) continue;
      in_stack = false;
      if (line.rfind("Found when the device's statistics", 0) == 0 || line.rfind("Options::device_sync_each_op", 0) == 0) continue;
      out += line + "\n";
    }
    return out;
  };
  EXPECT_EQ(without_stacks(d.output), without_stacks(plain_out.str()));
  EXPECT_EQ(d.trips, 0);
}

TEST(DeferredDevice, HeadroomCountsComeBackFromTheDevice) {
  torch::manual_seed(0);
  Mlp model;
  Scenario batches = [model](sentinel::Watchdog& watch, Outcome&) mutable {
    for (double scale : {1.0, 1e6, 1e-9}) {
      auto step = watch.batch();
      model->forward(small_input(3, 4, scale));
      step.finish();
    }
  };
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options().headroom(true).max_frames_to_save(50), batches);
  EXPECT_GT(d.headroom.frames_fp16_overflow, 0);
  EXPECT_GT(d.headroom.frames_fp16_underflow, 0);
}

TEST(DeferredDevice, Fp8ProbeResultsComeBackFromTheDevice) {
  torch::manual_seed(0);
  Mlp model;
  Scenario steps = [model](sentinel::Watchdog& watch, Outcome&) mutable {
    for (int s = 0; s < 4; ++s) {
      model->zero_grad();
      auto step = watch.batch();
      auto loss = model->forward(small_input(4, 4, std::pow(8.0, s))).pow(2).sum();
      watch.backward(loss);
      step.finish();
    }
  };
  const auto fp8 = sentinel::Fp8Options().enabled(true).drift_alarm(1e9).overflow_alarm(1.0);
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options().fp8(fp8).max_frames_to_save(50), steps);
  ASSERT_FALSE(d.fp8.empty());
  int64_t overflow = 0;
  for (const auto& m : d.fp8) overflow += m.overflow;
  EXPECT_GT(overflow, 0) << "growing inputs outrun the delayed scale";
}

TEST(DeferredDevice, AnInfInAnEntryBeyondTheFrameLimitIsStillFound) {
  struct CatImpl : torch::nn::Module {
    torch::Tensor forward(torch::Tensor x) {
      std::vector<torch::Tensor> rows;
      for (int64_t i = 0; i < x.size(0); ++i) rows.push_back(x.select(0, i));  // views: not frames
      return torch::cat(rows).sum();
    }
  };
  auto model = std::make_shared<CatImpl>();
  auto make = [model](sentinel::Options o) { return std::make_unique<sentinel::Watchdog>(model, std::move(o)); };
  Scenario one = [model](sentinel::Watchdog& watch, Outcome&) {
    auto x = small_input(40, 4);
    x[37][2] = std::numeric_limits<float>::infinity();  // in an input the frame has no room to show
    auto step = watch.batch();
    model->forward(x);
    step.finish();
  };
  auto d = expect_same_as_plain(make, sentinel::Options(), one);
  ASSERT_TRUE(d.report);
  EXPECT_EQ(d.report->trigger().op, "aten::cat");
  EXPECT_GT(d.report->trigger().entries_omitted, 0);
  EXPECT_FALSE(d.report->trigger().inputs_finite);
}

TEST(DeferredDevice, TorchScriptDemoTripsInTheSameBatchAndFrame) {
  auto model = sentinel::demo::make_t5_encoder();
  const auto batches = sentinel::demo::make_batches();
  auto make = [&model](sentinel::Options o) { return std::make_unique<sentinel::Watchdog>(model, std::move(o)); };
  Scenario all = [&model, &batches](sentinel::Watchdog& watch, Outcome&) {
    for (const auto& inputs : batches) {
      auto step = watch.batch();
      model.forward(inputs);
      step.finish();
    }
  };
  auto d = expect_same_as_plain(make, sentinel::Options(), all);
  ASSERT_TRUE(d.report);
  EXPECT_EQ(d.report->batch_number, sentinel::demo::kOverflowBatch);
}

TEST(DeferredDevice, WatchingThroughTheDeviceNeverChangesResults) {
  torch::manual_seed(0);
  TwoBlocks model;
  const auto x = small_input(3, 4, 2.0);
  const auto unwatched = model->forward(x);
  DeviceFactoryScope scope(device::make_cpu_deferred_device);
  sentinel::Watchdog watch(model.ptr());
  auto step = watch.batch();
  const auto watched = model->forward(x);
  step.finish();
  EXPECT_TRUE(torch::equal(watched, unwatched));
  EXPECT_GT(watch.device_counters().tensors_read_on_device, 0);
}

// A device whose read-back fails, as a CUDA device does after a device-side assert in the model:
// every CUDA call fails from then on.
class UnreadableDevice final : public device::StatsDevice {
 public:
  explicit UnreadableDevice(int64_t capacity) : inner_(device::make_cpu_deferred_device(capacity)) {}
  bool owns(const at::Tensor& t) const override { return inner_->owns(t); }
  sentinel::stats::Readability readability(const at::Tensor& t) const override { return inner_->readability(t); }
  void enqueue(const at::Tensor& t, int64_t slot, const device::Request& r) override { inner_->enqueue(t, slot, r); }
  void read_back(int64_t, int64_t) override { throw std::runtime_error("CUDA error: device-side assert triggered"); }
  device::SlotResult result(int64_t slot) const override { return inner_->result(slot); }
  int64_t capacity() const override { return inner_->capacity(); }
  int64_t synchronisations() const override { return inner_->synchronisations(); }

 private:
  std::unique_ptr<device::StatsDevice> inner_;
};

std::unique_ptr<device::StatsDevice> unreadable_device(int64_t capacity) {
  return std::make_unique<UnreadableDevice>(capacity);
}

// The user's own exception unwinding a batch whose numbers cannot be read back reaches the user
// (a second exception thrown over it would end the program); the failure is said once, and later
// batches are watched without the device and still trip.
TEST(DeferredDevice, AReadBackThatFailsIsSaidAndNeitherEndsTheProgramNorHidesTheUsersError) {
  torch::manual_seed(0);
  TwoBlocks model;
  const auto x = small_input(2, 4, 1.0);
  const auto unwatched = model->forward(x);
  DeviceFactoryScope scope(unreadable_device);
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  try {
    auto step = watch.batch();
    model->forward(x);
    throw std::invalid_argument("the user's own error");
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "the user's own error");
  }
  EXPECT_NE(out.str().find("reading the numbers back from the device failed (CUDA error: device-side assert "
                           "triggered): the "),
            std::string::npos)
      << out.str();
  {
    auto step = watch.batch();
    EXPECT_TRUE(torch::equal(model->forward(x), unwatched));
    EXPECT_NO_THROW(step.finish());
  }
  EXPECT_THROW(
      {
        auto step = watch.batch();
        model->forward(small_input(2, 4, 100.0));  // exp overflows: read on the CPU now
        step.finish();
      },
      sentinel::NonFiniteError);
  size_t said = 0;
  for (size_t at = 0; (at = out.str().find("reading the numbers back", at)) != std::string::npos; ++at) ++said;
  EXPECT_EQ(said, 1u);
}

TEST(DeferredDevice, ReadBackOptionIsValidated) {
  EXPECT_THROW(sentinel::Options().device_readback_frames(0).validate(), sentinel::OptionError);
  try {
    sentinel::Options().device_readback_frames(-5).validate();
    FAIL();
  } catch (const sentinel::OptionError& e) {
    EXPECT_NE(std::string(e.what()).find("device_readback_frames"), std::string::npos) << e.what();
  }
}

}  // namespace

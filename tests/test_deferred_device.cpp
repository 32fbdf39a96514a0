// Deferred detection, run on the CPU: a device that holds each tensor's numbers back until a
// read-back (as the CUDA device does) must give the same frames, origin, batch and summaries as
// the plain CPU path, whatever the read-back period, ring size or per-op synchronisation.
// The same scenarios run on a GPU in tests/cuda/test_cuda_watch.cpp.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <cmath>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "cli/demo_model.h"
#include "device/stats_device.h"
#include "support/deferred_compare.h"
#include "support/find_entry.h"
#include "support/recipe_device_compare.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;
namespace device = sentinel::device;

std::unique_ptr<device::StatsDevice> tiny_ring(int64_t) { return device::make_cpu_deferred_device(8); }

// Batches of TwoBlocks at growing scale: exp inside encoder.1 overflows at the third.
Scenario growing_batches(TwoBlocks model, int batches = 4) {
  return [model, batches](sentinel::Watchdog& watch, Outcome&) mutable {
    for (int b = 0; b < batches; ++b) {
      auto step = watch.batch();
      // What the model returns is the batch's: an inf tolerated inside encoder.1 leaves it there.
      watch.batch_returned(model->forward(small_input(2, 4, b == 2 ? 100.0 : 1.0)));
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
  // exp's inf, tolerated inside encoder.1, leaves it as the batch's result.
  EXPECT_EQ(d.report->trigger().op, "return");
  ASSERT_TRUE(d.report->origin_frame);
  EXPECT_EQ(d.report->origin_frame->op, "aten::exp");
  EXPECT_EQ(d.report->escape, sentinel::Escape::Returned);
  // Found where the loop hands the result over (the waiting frames read back first): the stack
  // is that call's.
  EXPECT_FALSE(d.report->deferred);
  EXPECT_FALSE(d.report->stack.empty());
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
  // Found at a read-back, after the node had run: said so, with no stack of its own.
  EXPECT_TRUE(d.report->deferred);
  EXPECT_NE(d.output.find("Found when the device's statistics were read back"), std::string::npos);
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

// Every recipe (current, MXFP8 under the OCP rule, NVFP4, Float8Block with FP32 scales) read in
// the device pass gives the plain CPU replay's metrics, gradients included.
TEST(DeferredDevice, RecipeMetricsComeBackFromTheDeviceAsOnTheCpu) {
  using sentinel::fp8::ScalingRecipe;
  torch::manual_seed(0);
  Mlp model;
  Scenario steps = [model](sentinel::Watchdog& watch, Outcome&) mutable {
    for (int s = 0; s < 3; ++s) {
      model->zero_grad();
      auto step = watch.batch();
      auto loss = model->forward(small_input(4, 4, std::pow(16.0, s))).pow(2).sum();
      watch.backward(loss);
      step.finish();
    }
  };
  const auto fp8 = sentinel::Fp8Options()
                       .enabled(true)
                       .drift_alarm(1e9)
                       .overflow_alarm(1.0)
                       .recipes({ScalingRecipe::Delayed, ScalingRecipe::Current, ScalingRecipe::MXFP8,
                                 ScalingRecipe::NVFP4, ScalingRecipe::Float8Block})
                       .mx_scale_rule(sentinel::fp8::MxScaleRule::OcpFloor)
                       .block_scaling_pow2_scales(false);
  auto d = expect_same_as_plain(cpp_watch(model), sentinel::Options().fp8(fp8).max_frames_to_save(50), steps);
  std::set<std::string> recipes;
  int64_t blocks = 0;
  for (const auto& m : d.fp8) {
    recipes.insert(m.recipe + " " + m.role);
    blocks += m.blocks;
  }
  EXPECT_EQ(recipes.size(), 15u) << "five recipes of activations, weights and gradients";
  EXPECT_GT(blocks, 0);
  EXPECT_EQ(d.output.find("not replayed"), std::string::npos) << d.output;
}

// The recipes as the device runs them, slot by slot, against the CPU replay: here, where the CPU
// device runs the same code, what this checks is the plumbing (each job honoured, its result back
// in its slot and order after the read-back); the values' own oracle is BlockRecipes' float64
// reference. The CUDA device's test shares the harness, and there the values are checked too.
TEST(DeferredDevice, EachRecipeJobOnTheDeviceEqualsTheCpuReplay) {
  auto dev = device::make_cpu_deferred_device(16);
  ASSERT_TRUE(dev->replays_recipes());
  EXPECT_EQ(expect_device_recipes_match_cpu(*dev, [](const torch::Tensor& t) { return t; }), kRecipePairsChecked);
}

// Beyond the frame's entry limit, a value read at once that holds an inf/nan takes the place of a
// finite one; one read through the device shares its role's slot with the other omitted entries,
// which tells that an inf/nan is among them but not which. Both find it in the same frame.
TEST(DeferredDevice, AnInfInAnEntryBeyondTheFrameLimitIsStillFound) {
  struct CatImpl : torch::nn::Module {
    torch::Tensor forward(torch::Tensor x) {
      std::vector<torch::Tensor> rows;
      for (int64_t i = 0; i < x.size(0); ++i) rows.push_back(x.select(0, i));  // views: not frames
      return torch::cat(rows).sum();
    }
  };
  auto model = std::make_shared<CatImpl>();
  Scenario one = [model](sentinel::Watchdog& watch, Outcome&) {
    auto x = small_input(40, 4);
    x[37][2] = std::numeric_limits<float>::infinity();  // in an input past the frame's room
    auto step = watch.batch();
    model->forward(x);
    step.finish();
  };
  std::ostringstream plain_out, deferred_out;
  Outcome plain, deferred;
  {
    sentinel::Watchdog watch(model, sentinel::Options().output(plain_out));
    plain = run(watch, one, plain_out);
  }
  {
    DeviceFactoryScope scope(device::make_cpu_deferred_device);
    sentinel::Watchdog watch(model, sentinel::Options().output(deferred_out));
    deferred = run(watch, one, deferred_out);
  }
  EXPECT_GT(deferred.counters.tensors_read_on_device, 0) << "the device read nothing: the test proves nothing";
  for (const Outcome* o : {&plain, &deferred}) {
    ASSERT_TRUE(o->report);
    EXPECT_EQ(o->trips, 1);
    EXPECT_EQ(o->report->trigger().op, "aten::cat");
    EXPECT_GT(o->report->trigger().entries_omitted, 0);
    EXPECT_FALSE(o->report->trigger().inputs_finite);
  }
  const sentinel::Entry* shown = find_entry(plain.report->trigger(), "input[0][37]");
  ASSERT_NE(shown, nullptr) << plain.output;
  EXPECT_EQ(shown->stats.pos_inf, 1);
  EXPECT_NE(plain.report->origin.find("input[0][37]"), std::string::npos) << plain.report->origin;
  EXPECT_EQ(find_entry(deferred.report->trigger(), "input[0][37]"), nullptr);
  EXPECT_NE(deferred.report->origin.find("not shown"), std::string::npos) << deferred.report->origin;
}

// One op's list of tensors is read together (the device holds its launches until the list is
// read): a foreach op that writes twenty tensors in place, one of them overflowing, more than a
// frame shows, so that some share their role's slot. Every entry, shown or not, is judged as on
// the CPU path, headroom counts included.
TEST(DeferredDevice, AListWrittenInPlaceIsReadTogetherAndTripsAsOnTheCpu) {
  auto model = torch::nn::Linear(4, 4);
  auto make_list = [] {
    std::vector<torch::Tensor> list;
    for (int i = 0; i < 20; ++i) list.push_back(torch::full({3, 5}, 1.0f + static_cast<float>(i)));
    return list;
  };
  for (int overflowing : {2, 18}) {  // shown, and past the frame's room
    Scenario one = [&](sentinel::Watchdog& watch, Outcome&) {
      auto list = make_list();  // made before the batch: no op of it made them
      list[overflowing][1][2] = 3e38f;
      auto step = watch.batch();
      model->forward(torch::ones({2, 4}));
      torch::_foreach_mul_(list, 2.0);  // 6e38 overflows float32: inf in that tensor alone
      step.finish();
    };
    std::ostringstream plain_out, deferred_out;
    Outcome plain, deferred;
    {
      sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(plain_out).headroom(true));
      plain = run(watch, one, plain_out);
    }
    {
      DeviceFactoryScope scope(device::make_cpu_deferred_device);
      sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(deferred_out).headroom(true));
      deferred = run(watch, one, deferred_out);
    }
    SCOPED_TRACE("overflowing tensor " + std::to_string(overflowing));
    EXPECT_GE(deferred.counters.tensors_read_on_device, 20) << "the device read nothing: the test proves nothing";
    for (const Outcome* o : {&plain, &deferred}) {
      ASSERT_TRUE(o->report) << o->output;
      EXPECT_EQ(o->report->trigger().op, "aten::_foreach_mul_");
      EXPECT_FALSE(o->report->trigger().outputs_finite);
    }
    const auto& want = plain.report->trigger().entries;
    const auto& got = deferred.report->trigger().entries;
    ASSERT_EQ(got.size(), want.size());
    if (overflowing < 16) {
      for (size_t i = 0; i < want.size(); ++i) expect_same_entry(got[i], want[i]);
    } else {
      // Past the room: the CPU path shows it in a finite entry's place; the deferred frame could
      // not know which entry that was when it was made, and says the culprit is not shown.
      EXPECT_NE(find_entry(plain.report->trigger(), "self[18]"), nullptr);
      EXPECT_EQ(find_entry(deferred.report->trigger(), "self[18]"), nullptr);
      EXPECT_NE(deferred.report->origin.find("not shown"), std::string::npos) << deferred.report->origin;
      for (size_t i = 0; i + 1 < want.size(); ++i) expect_same_entry(got[i], want[i]);
    }
  }
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
        // exp in encoder.1 overflows (read on the CPU now); the model returns it.
        watch.batch_returned(model->forward(small_input(2, 4, 100.0)));
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

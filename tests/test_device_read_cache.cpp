// Device tensors whose memory an earlier read of the batch covered, unchanged since, take that
// read's slot or numbers instead of a new reduction (src/device/device_read_cache.h). Run on the
// CPU through the deferring device: what the user sees must be what the plain path shows, which
// reads every tensor it has not provably read before, and every shown read must be either a
// reduction started or one reused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <limits>
#include <string>
#include <vector>

#include "device/device_read_cache.h"
#include "support/deferred_compare.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;

// Between two ops, the linear's output is scaled in place: its later readers must see the
// scaled numbers, not the linear's. The input serves a GEMM, then an op that counts headroom.
struct RescaledImpl : torch::nn::Module {
  RescaledImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = fc1(x);  // x: a GEMM operand (read without headroom counts when probed) ...
    auto g = torch::relu(h) * torch::tanh(x).mean();  // ... and here with them
    h.mul_(1000.0);
    return fc2(g + h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Rescaled);

// Forward batches without autograd (no gradient frames): every read is in a saved frame.
// Each run starts from the same weight (the plain and the deferred run both change it).
Scenario forward_batches(Rescaled model, int batches, bool rescale_weight_between = false, double input_scale = 1.0) {
  const torch::Tensor initial = model->fc2->weight.detach().clone();
  return [=](sentinel::Watchdog& watch, Outcome&) mutable {
    torch::NoGradGuard no_grad;
    model->fc2->weight.copy_(initial);
    for (int b = 0; b < batches; ++b) {
      if (b > 0 && rescale_weight_between) model->fc2->weight.mul_(3.0);
      auto step = watch.batch();
      model->forward(small_input(2, 4, input_scale * (1.0 + b)));
      step.finish();
    }
  };
}

int64_t shown_reads(const std::vector<sentinel::Frame>& frames) {
  int64_t n = 0;
  for (const auto& f : frames) {
    EXPECT_EQ(f.entries_omitted, 0) << "omitted entries share slots: the count below would not hold";
    for (const auto& e : f.entries) n += e.kind == sentinel::EntryKind::Tensor && e.skip_reason.empty();
  }
  return n;
}

std::unique_ptr<sentinel::device::StatsDevice> small_ring(int64_t) {
  return sentinel::device::make_cpu_deferred_device(6);
}

struct ReadBackPeriod {
  const char* name;
  sentinel::Options options;
  sentinel::device::DeviceFactory factory;
};

TEST(DeviceReads, UnchangedMemoryIsReadOnceAndInPlaceWritesAreReadAgain) {
  const ReadBackPeriod periods[] = {
      {"at batch end", sentinel::Options(), sentinel::device::make_cpu_deferred_device},
      {"every 2 frames", sentinel::Options().device_readback_frames(2), sentinel::device::make_cpu_deferred_device},
      {"after each op", sentinel::Options().device_sync_each_op(true), sentinel::device::make_cpu_deferred_device},
      {"ring of 6 slots", sentinel::Options(), small_ring},
  };
  for (const auto& period : periods) {
    SCOPED_TRACE(period.name);
    torch::manual_seed(0);
    Rescaled model;
    const auto options = sentinel::Options(period.options).max_frames_to_save(1000);
    const Outcome d = expect_same_as_plain(cpp_watch(model), options, forward_batches(model, 3), period.factory);
    const auto& c = d.counters;
    EXPECT_GT(c.device_reads_reused, 0);
    EXPECT_EQ(c.tensors_read_on_device + c.device_reads_reused, shown_reads(d.saved));
  }
}

TEST(DeviceReads, KeptParameterReadsSeeAWeightChangedBetweenBatches) {
  torch::manual_seed(0);
  Rescaled model;
  const auto options = sentinel::Options().max_frames_to_save(1000).reuse_unchanged_parameter_reads(true);
  const Outcome d = expect_same_as_plain(cpp_watch(model), options, forward_batches(model, 3, true));
  EXPECT_GT(d.counters.device_reads_reused, 0);
}

TEST(DeviceReads, OperandsReadWithoutHeadroomAreReadAgainWhereHeadroomIsWanted) {
  torch::manual_seed(0);
  Rescaled model;
  // With the FP8 probe, a GEMM's operands are read for it alone, without headroom counts.
  const auto fp8 = sentinel::Fp8Options().enabled(true).drift_alarm(1e9).overflow_alarm(1.0);
  const auto options = sentinel::Options().max_frames_to_save(1000).headroom(true).fp8(fp8);
  // Inputs that float16 flushes to zero (below 2^-25): the tanh counts them, the GEMM does not.
  const Outcome d = expect_same_as_plain(cpp_watch(model), options, forward_batches(model, 2, false, 1e-8));
  int64_t underflows = 0;
  for (const auto& f : d.saved) {
    if (f.op != "aten::tanh") continue;
    for (const auto& e : f.entries) underflows += e.has_headroom && !e.is_output ? e.headroom.fp16_underflow : 0;
  }
  EXPECT_EQ(underflows, 2 * 8);  // both batches, all eight inputs
  EXPECT_EQ(d.counters.tensors_read_on_device + d.counters.device_reads_reused, shown_reads(d.saved));
}

// The cache alone: a read is found while in flight (its slot), then with its numbers once its
// slot is read back; a read whose slot a read-back did not cover, or that was in flight when the
// slots were dropped, is gone; a write through a view is a miss.
TEST(DeviceReads, AReadServesFromItsSlotThenWithItsNumbersAndOnlyWhileTheMemoryIsUnchanged) {
  auto dev = sentinel::device::make_cpu_deferred_device(16);
  sentinel::device::DeviceReadCache cache;
  auto a = torch::tensor({1.0f, -4.0f, 2.0f});
  auto b = torch::tensor({3.0f});
  dev->enqueue(a, 0, sentinel::device::Request{});
  cache.started(a, 0, /*headroom=*/false);
  cache.started(b, 7, /*headroom=*/false);
  const auto* in_flight = cache.find(a.view({3}), false);  // a view of the same memory
  ASSERT_NE(in_flight, nullptr);
  EXPECT_EQ(in_flight->slot, 0);
  EXPECT_EQ(cache.find(a, /*want_headroom=*/true), nullptr);
  dev->read_back(0, 1);
  cache.read_back(*dev, 0, 1);  // slot 7 was not read back: b's read is not to be trusted
  EXPECT_EQ(cache.find(b, false), nullptr);
  const auto* back = cache.find(a, false);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->slot, -1);
  EXPECT_EQ(back->stats.abs_max, a.abs().max().item<float>());
  a.view({3}).mul_(2.0f);  // a write through a view bumps the shared version
  EXPECT_EQ(cache.find(a, false), nullptr);
  cache.started(a, 1, false);
  cache.drop_in_flight();
  EXPECT_EQ(cache.find(a, false), nullptr);
  EXPECT_EQ(cache.hits(), 2);
}

// A gradient written after the backward with no op LibTorch sees (as a collective writes it) is
// read again by the check at batch end, though the backward read the same memory.
TEST(DeviceReads, TheGradientCheckAtBatchEndReadsAgainWhatTheBackwardRead) {
  torch::manual_seed(0);
  Rescaled model;
  Scenario step = [model](sentinel::Watchdog& watch, Outcome&) mutable {
    model->zero_grad();
    auto guard = watch.batch();
    model->forward(small_input()).sum().backward();
    model->fc2->weight.grad().data_ptr<float>()[0] = std::numeric_limits<float>::infinity();
    guard.finish();
  };
  const auto options = sentinel::Options().max_frames_to_save(1000);
  const Outcome d = expect_same_as_plain(cpp_watch(model), options, step);
  ASSERT_TRUE(d.report);
  EXPECT_NE(d.report->origin.find("parameter gradients of fc2 (Linear)"), std::string::npos) << d.report->origin;
  EXPECT_NE(d.report->origin.find("(in weight.grad)"), std::string::npos) << d.report->origin;
}

// Memory written where no version counter saw it (batch norm's running statistics, a fused
// optimizer's tensors): its reads, in flight or back, views included, serve no tensor any more;
// the others still do.
TEST(DeviceReads, ForgettingAStorageLeavesItsReadsUnusableAndTheOthersServing) {
  sentinel::device::DeviceReadCache cache;
  auto written = torch::ones({2, 4});
  auto other = torch::ones({3});
  cache.started(written, 0, false);
  cache.started(written[1], 1, false);
  cache.started(other, 2, false);
  std::vector<const c10::StorageImpl*> storages{written.storage().unsafeGetStorageImpl()};
  cache.forget_storages(storages);
  EXPECT_EQ(cache.find(written, false), nullptr);
  EXPECT_EQ(cache.find(written[1], false), nullptr);
  EXPECT_NE(cache.find(other, false), nullptr);
  cache.started(written, 3, false);  // read again: serves again
  EXPECT_NE(cache.find(written, false), nullptr);
}

// Batch norm, training, updates running_var in place without counting a version: the deferring
// device shows what the plain path shows (running_var read again after the op, a later read of it
// in the batch seeing the new numbers), and a running_var that overflows while the batch's output
// stays finite stops both at that op.
TEST(DeviceReads, BatchNormsRunningStatisticsWrittenUnseenAreReadAgainAsThePlainPathReadsThem) {
  torch::nn::Sequential model(torch::nn::Linear(1, 1), torch::nn::BatchNorm1d(1));
  auto norm = model[1]->as<torch::nn::BatchNorm1d>();
  Scenario steps = [model, norm](sentinel::Watchdog& watch, Outcome&) mutable {
    {
      torch::NoGradGuard no_grad;
      model[0]->as<torch::nn::Linear>()->weight.fill_(1.0);
      model[0]->as<torch::nn::Linear>()->bias.zero_();
      norm->reset_running_stats();
    }
    model->train();
    const auto x = torch::tensor({{1.0f}, {-3.0f}});
    for (int b = 0; b < 4; ++b) {
      auto guard = watch.batch();
      model->forward(b == 2 ? x * 5e19 : x);
      auto later = norm->running_var.mul(2.0);  // reads the updated statistics
      guard.finish();
    }
  };
  const Outcome d = expect_same_as_plain(cpp_watch(model), sentinel::Options().max_frames_to_save(100), steps);
  ASSERT_TRUE(d.report);
  EXPECT_EQ(d.report->batch_number, 2);
  ASSERT_FALSE(d.report->frames.empty());
  EXPECT_EQ(d.report->frames.back().op, "aten::batch_norm");
  EXPECT_NE(d.report->origin.find("running_var"), std::string::npos) << d.report->origin;
}

}  // namespace

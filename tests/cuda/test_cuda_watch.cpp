// The watchdog on CUDA tensors: the same reports as on the CPU (frames, origin, batch), the
// device's numbers against the CPU pass on the same values, one host wait per batch, per-op
// synchronisation, and a CUDA-graph-captured step. Built where LibTorch has CUDA; every test
// skips without a GPU. The same scenarios run on the CPU in tests/test_deferred_device.cpp.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "cuda/device_stats.h"
#include "stats/tensor_stats.h"
#include "support/expect_stats.h"
#include "support/find_entry.h"
#include "support/recipe_device_compare.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;

// The CUDA runtime's own reason (no driver, no device visible) goes into the skip message.
#define SKIP_WITHOUT_GPU()                                                      \
  if (std::string why; !sentinel::cuda::device_available(&why))                 \
    GTEST_SKIP() << "no CUDA device: " << why;                                  \
  else if (!torch::cuda::is_available())                                        \
  GTEST_SKIP() << "LibTorch sees no CUDA device"

torch::Device gpu() { return torch::Device(torch::kCUDA, 0); }

// What both runs must agree on: everything but the numbers that GPU arithmetic may round
// differently (exp, GEMMs); those are compared by class (finite, inf, nan) and roughly.
void expect_same_report(const sentinel::Report& got, const sentinel::Report& want) {
  EXPECT_EQ(got.batch_number, want.batch_number);
  EXPECT_EQ(got.origin, want.origin);
  EXPECT_EQ(got.produced_here, want.produced_here);
  ASSERT_EQ(got.frames.size(), want.frames.size());
  for (size_t i = 0; i < want.frames.size(); ++i) {
    const auto& g = got.frames[i];
    const auto& w = want.frames[i];
    SCOPED_TRACE(w.module_path + " " + w.op);
    EXPECT_EQ(g.batch_number, w.batch_number);
    EXPECT_EQ(g.op_index, w.op_index);
    EXPECT_EQ(g.direction, w.direction);
    EXPECT_EQ(g.module_path, w.module_path);
    EXPECT_EQ(g.module_class, w.module_class);
    EXPECT_EQ(g.op, w.op);
    EXPECT_EQ(g.forward_op, w.forward_op);
    EXPECT_EQ(g.inputs_finite, w.inputs_finite);
    EXPECT_EQ(g.outputs_finite, w.outputs_finite);
    ASSERT_EQ(g.entries.size(), w.entries.size());
    for (size_t k = 0; k < w.entries.size(); ++k) {
      const auto& ge = g.entries[k];
      const auto& we = w.entries[k];
      SCOPED_TRACE(we.label);
      EXPECT_EQ(ge.label, we.label);
      EXPECT_EQ(ge.kind, we.kind);
      EXPECT_EQ(ge.stats.count, we.stats.count);
      EXPECT_EQ(ge.stats.nan > 0, we.stats.nan > 0);
      EXPECT_EQ(ge.stats.pos_inf + ge.stats.neg_inf > 0, we.stats.pos_inf + we.stats.neg_inf > 0);
      if (std::isfinite(we.stats.abs_max)) {
        EXPECT_NEAR(ge.stats.abs_max, we.stats.abs_max, 1e-3 * (1 + we.stats.abs_max));
      }
    }
  }
}

template <typename Model, typename Step>
sentinel::Report trip_on(Model model, torch::Device where, Step step, sentinel::Options o = sentinel::Options()) {
  // Module::to moves parameters, not their gradients: a run on another device starts from none.
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->to(where);
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), o.output(out));
  auto report = expect_nonfinite([&] { step(watch, model, where); });
  EXPECT_GT(watch.device_counters().tensors_read_on_device, where.is_cuda() ? 0 : -1);
  return report;
}

// exp inside encoder.1 overflows at the third batch; the inf, tolerated inside encoder.1, leaves
// it as the batch's result (as in tests/test_deferred_device.cpp).
auto growing_batches = [](sentinel::Watchdog& watch, TwoBlocks& model, torch::Device where) {
  for (int b = 0; b < 4; ++b) {
    auto step = watch.batch();
    watch.batch_returned(model->forward(small_input(2, 4, b == 2 ? 100.0 : 1.0).to(where)));
    step.finish();
  }
};

TEST(CudaWatch, ForwardTripGivesTheCpuReport) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  TwoBlocks model;
  auto on_cpu = trip_on(model, torch::kCPU, growing_batches);
  auto on_gpu = trip_on(model, gpu(), growing_batches);
  expect_same_report(on_gpu, on_cpu);
  EXPECT_EQ(on_gpu.batch_number, 2);
  EXPECT_EQ(on_gpu.trigger().op, "return");
  ASSERT_TRUE(on_gpu.origin_frame);
  EXPECT_EQ(on_gpu.origin_frame->op, "aten::exp");
  EXPECT_EQ(on_gpu.escape, sentinel::Escape::Returned);
  // Found where the loop hands the result over, the waiting frames read back first: not deferred.
  EXPECT_FALSE(on_gpu.deferred);
}

TEST(CudaWatch, PerOpSyncStopsAtTheOpWithItsStack) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  TwoBlocks model;
  auto on_cpu = trip_on(model, torch::kCPU, growing_batches);
  auto on_gpu = trip_on(model, gpu(), growing_batches, sentinel::Options().device_sync_each_op(true));
  expect_same_report(on_gpu, on_cpu);
  EXPECT_FALSE(on_gpu.deferred);
  EXPECT_FALSE(on_gpu.stack.empty());
}

struct SqrtNetImpl : torch::nn::Module {
  SqrtNetImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) { return torch::sqrt(torch::relu(fc(x))).sum(); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SqrtNet);

TEST(CudaWatch, BackwardTripGivesTheCpuReport) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  SqrtNet model;
  auto step = [](sentinel::Watchdog& watch, SqrtNet& m, torch::Device where) {
    auto guard = watch.batch();
    watch.backward(m->forward(small_input().to(where)));
    guard.finish();
  };
  auto on_cpu = trip_on(model, torch::kCPU, step, sentinel::Options().max_frames_to_save(40));
  auto on_gpu = trip_on(model, gpu(), step, sentinel::Options().max_frames_to_save(40));
  expect_same_report(on_gpu, on_cpu);
  EXPECT_EQ(on_gpu.trigger().op, "SqrtBackward0");
}

TEST(CudaWatch, OneHostWaitPerBatchInDeferredMode) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu());
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  for (int b = 0; b < 5; ++b) {
    auto step = watch.batch();
    auto loss = model->forward(small_input(8, 4).to(gpu())).pow(2).sum();
    watch.backward(loss);
    step.finish();
  }
  const auto c = watch.device_counters();
  EXPECT_GT(c.tensors_read_on_device + c.device_reads_reused, 5 * 10);
  EXPECT_GT(c.device_reads_reused, 0);  // outputs read again as the next op's inputs
  EXPECT_EQ(c.readbacks, 5);
  EXPECT_FALSE(watch.last_report().has_value());
}

// The CPU's numbers for x. The CPU pass reads float32, float16 and bfloat16; a float8 tensor is
// widened by torch's own cast (exact: every float8 value is a float) and its subnormals counted
// against the float8 format's smallest normal, 2^-6 (E4M3) or 2^-14 (E5M2).
sentinel::TensorStats cpu_reference(const torch::Tensor& x) {
  sentinel::TensorStats want;
  const bool fp8 = x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kHalf &&
                   x.scalar_type() != torch::kBFloat16;
  const auto wide = fp8 ? x.to(torch::kFloat) : x;
  sentinel::stats::compute(wide, want);
  if (fp8) {
#if __has_include(<c10/util/Float8_e4m3fn.h>)
    const bool e5m2 = x.scalar_type() == torch::kFloat8_e5m2;
#else
    const bool e5m2 = false;
#endif
    const double smallest_normal = std::ldexp(1.0, e5m2 ? -14 : -6);
    const auto a = wide.abs();
    want.subnormal = ((a < smallest_normal) & (a > 0)).sum().item<int64_t>();
  }
  return want;
}

// The device's numbers for every dtype it reads, against the CPU pass on the same values.
TEST(CudaWatch, EntriesMatchTheCpuPassInEveryDtype) {
  SKIP_WITHOUT_GPU();
  std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kHalf, torch::kBFloat16};
#if __has_include(<c10/util/Float8_e4m3fn.h>)
  dtypes.push_back(torch::kFloat8_e4m3fn);
  dtypes.push_back(torch::kFloat8_e5m2);
#endif
  struct CloneImpl : torch::nn::Module {
    torch::Tensor forward(torch::Tensor x) { return x.clone(); }
  };
  for (auto dtype : dtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(1);
    auto values = torch::randn({1000, 37}) * torch::pow(10.0, torch::randint(-30, 30, {1000, 37}).to(torch::kFloat));
    values[3][5] = std::numeric_limits<float>::infinity();
    values[7][1] = std::numeric_limits<float>::quiet_NaN();
    values[9][9] = 0.0;
    auto x = values.to(dtype);  // the cast rounds; both passes read the same rounded values
    auto model = std::make_shared<CloneImpl>();
    std::ostringstream out;
    sentinel::Watchdog watch(model, sentinel::Options().output(out).action(sentinel::Action::Warn).headroom(true));
    auto step = watch.batch();
    model->forward(x.to(gpu()));
    step.finish();
    const auto frames = watch.saved_frames();
    ASSERT_FALSE(frames.empty());
    const auto& entries = frames.back().entries;
    ASSERT_EQ(entries.size(), 2u);
    expect_same_stats(entries[1].stats, cpu_reference(x));
    if (dtype == torch::kFloat || dtype == torch::kHalf || dtype == torch::kBFloat16) {
      sentinel::HeadroomCounts h;
      sentinel::stats::compute_headroom(x, h);
      EXPECT_EQ(entries[1].headroom.fp16_overflow, h.fp16_overflow);
      EXPECT_EQ(entries[1].headroom.fp16_underflow, h.fp16_underflow);
      EXPECT_EQ(entries[1].headroom.bf16_overflow, h.bf16_overflow);
      EXPECT_EQ(entries[1].headroom.bf16_underflow, h.bf16_underflow);
    }
  }
}

// A foreach op's list of twenty CUDA tensors, written in place and read together (one launch),
// one of them overflowing, shown in the frame or past its room: the trip and every entry shown as
// on the CPU.
TEST(CudaWatch, AListWrittenInPlaceIsReadTogetherAndTripsAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  auto model = torch::nn::Linear(4, 4);
  for (int overflowing : {2, 18}) {
    SCOPED_TRACE("overflowing tensor " + std::to_string(overflowing));
    auto trip = [&](torch::Device where) {
      std::vector<torch::Tensor> list;
      for (int i = 0; i < 20; ++i) list.push_back(torch::full({3, 5}, 1.0f + static_cast<float>(i)));
      list[overflowing][1][2] = 3e38f;
      for (auto& t : list) t = t.to(where);
      model->to(where);
      std::ostringstream out;
      sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).headroom(true));
      return expect_nonfinite([&] {
        auto step = watch.batch();
        model->forward(torch::ones({2, 4}, where));
        torch::_foreach_mul_(list, 2.0);
        step.finish();
      });
    };
    const auto on_gpu = trip(gpu()), on_cpu = trip(torch::kCPU);
    EXPECT_EQ(on_gpu.trigger().op, "aten::_foreach_mul_");
    EXPECT_FALSE(on_gpu.trigger().outputs_finite);
    if (overflowing < 16) {
      expect_same_report(on_gpu, on_cpu);
      continue;
    }
    // Past the room: the CPU shows it in a finite entry's place; the deferred frame could not
    // know which entry that was when it was made, and says the culprit is not shown (as the CPU
    // deferring device does in tests/test_deferred_device.cpp).
    EXPECT_NE(find_entry(on_cpu.trigger(), "self[18]"), nullptr);
    EXPECT_EQ(find_entry(on_gpu.trigger(), "self[18]"), nullptr);
    EXPECT_NE(on_gpu.origin.find("not shown"), std::string::npos) << on_gpu.origin;
    const auto& got = on_gpu.trigger().entries;
    const auto& want = on_cpu.trigger().entries;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i + 1 < want.size(); ++i) {
      EXPECT_EQ(got[i].label, want[i].label);
      EXPECT_EQ(got[i].stats.count, want[i].stats.count);
      EXPECT_TRUE(got[i].stats.finite());
    }
  }
}

TEST(CudaWatch, GappedViewsAndIntegerTensorsAreLabelledNotRead) {
  SKIP_WITHOUT_GPU();
  struct AddImpl : torch::nn::Module {
    torch::Tensor forward(torch::Tensor x, torch::Tensor i) { return x + i; }
  };
  auto model = std::make_shared<AddImpl>();
  std::ostringstream out;
  sentinel::Watchdog watch(model, sentinel::Options().output(out));
  auto step = watch.batch();
  auto x = torch::ones({8, 8}, torch::device(gpu())).slice(1, 0, 8, 2);  // every other column
  model->forward(x, torch::ones({8, 4}, torch::device(gpu()).dtype(torch::kLong)));
  step.finish();
  const auto frames = watch.saved_frames();
  ASSERT_FALSE(frames.empty());
  const auto& e = frames.back().entries;
  ASSERT_GE(e.size(), 2u);
  EXPECT_EQ(e[0].skip_reason, "strided view on device");
  EXPECT_EQ(e[1].skip_reason, "dtype not read on device");
  EXPECT_GE(watch.device_counters().tensors_skipped_on_device, 2);
}

// Capture of a watched step: nothing may wait or allocate inside it. Entries made during the
// capture are labelled; replaying works, and the next ordinary batch is watched again.
TEST(CudaWatch, AGraphCapturedStepRunsAndIsLabelled) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu());
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(100));
  auto x = small_input(8, 4).to(gpu());
  torch::NoGradGuard inference;
  at::cuda::CUDAGraph graph;
  torch::Tensor y;
  auto side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    {  // warm-up on the capture stream, as CUDA graphs require
      auto step = watch.batch();
      model->forward(x);
      step.finish();
    }
    auto step = watch.batch();
    graph.capture_begin();
    y = model->forward(x);
    graph.capture_end();
    step.finish();
  }
  graph.replay();
  torch::cuda::synchronize();
  EXPECT_TRUE(torch::allclose(y, model->forward(x)));
  bool labelled = false;
  for (const auto& f : watch.saved_frames()) {
    for (const auto& e : f.entries) labelled = labelled || e.skip_reason == "captured in cuda graph";
  }
  EXPECT_TRUE(labelled);
  // Watched again afterwards: an inf in the next batch is found.
  const auto report = expect_nonfinite([&] {
    auto step = watch.batch();
    model->forward(x * std::numeric_limits<float>::infinity());
    step.finish();
  });
  EXPECT_EQ(report.trigger().op, "aten::mul");
}

TEST(CudaWatch, WatchingNeverChangesResults) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(0);
  TwoBlocks model;
  model->to(gpu());
  auto x = small_input(16, 4, 3.0).to(gpu());
  const auto unwatched = model->forward(x);
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  auto step = watch.batch();
  const auto watched = model->forward(x);
  step.finish();
  EXPECT_TRUE(torch::equal(watched, unwatched));
}

// TorchScript fuses gelu(wi_0(x)) * wi_1(x) into one kernel on a GPU from the third call on;
// watched, it does not, and the inf made by the mul in batch 3 is found at the mul. With fusion
// kept, the fused group shows as one frame (so this GPU does fuse: the first half is no accident).
TEST(CudaWatch, TorchScriptsFusedChainKeepsItsOpsWhenWatched) {
  SKIP_WITHOUT_GPU();
  auto load = [&](bool keep, std::ostream& out, std::vector<sentinel::Frame>& frames) {
    auto model = torch::jit::load(data_path("t5_ff_scripted.pt"));
    model.eval();
    model.to(gpu());
    std::ifstream in(data_path("t5_ff_inputs.pt"), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::optional<sentinel::Report> report;
    torch::NoGradGuard no_grad;
    sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(
        model, sentinel::Options().output(out).keep_torchscript_fusion(keep).max_frames_to_save(40).callback(
                   [&](const sentinel::Report& r) {
                     if (!report) report = r;
                   }));
    // Held by name: a range-for over pickle_load(...).toListRef() would walk a list that died
    // with the temporary before the first batch.
    const c10::IValue batches = torch::jit::pickle_load(bytes);
    for (const auto& b : batches.toListRef()) {
      debug.forward({b.toTensor().to(gpu())});
      if (report) break;
    }
    debug.check();
    frames = report ? report->frames : debug.saved_frames();
    return report;
  };
  std::ostringstream out;
  std::vector<sentinel::Frame> frames;
  const auto watched = load(false, out, frames);
  ASSERT_TRUE(watched.has_value()) << out.str();
  EXPECT_EQ(watched->batch_number, 3);
  // The place rule: the report stops where the inf leaves ff and names the op that made it.
  ASSERT_TRUE(watched->origin_frame) << watched->origin;
  EXPECT_EQ(watched->origin_frame->op, "aten::mul") << watched->origin;
  EXPECT_EQ(watched->origin_frame->module_path, "ff");
  EXPECT_TRUE(watched->origin_frame->inputs_finite);
  EXPECT_FALSE(watched->origin_frame->outputs_finite);

  const auto kept = load(true, out, frames);
  const bool fused = std::any_of(frames.begin(), frames.end(),
                                 [](const sentinel::Frame& f) { return f.op.rfind("fused_", 0) == 0; });
  EXPECT_TRUE(fused) << "this GPU's TorchScript did not fuse the chain; the test above proves nothing here";
  if (kept) {
    EXPECT_NE(kept->origin.find("fused TorchScript group"), std::string::npos) << kept->origin;
  }
}

// Every recipe in the CUDA device pass against the CPU replay of the same values: counts, block
// tallies and scale histograms bit for bit, the error sums within the documented bound, on
// adversarial tensors of every dtype it reads, transposed views and a batch of matrices.
TEST(CudaWatch, RecipesOnTheDeviceEqualTheCpuReplay) {
  SKIP_WITHOUT_GPU();
  auto dev = sentinel::device::make_cuda_device(16);
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->replays_recipes());
  EXPECT_EQ(expect_device_recipes_match_cpu(*dev, [](const torch::Tensor& t) { return t.to(gpu()); },
                                            sentinel::recipes::kDeviceSumsRelativeBound),
            kRecipePairsChecked);
}

}  // namespace

// Forward of a 6-layer transformer encoder on the CPU, three ways in one run:
//   Unwatched  - the model alone;
//   Watched    - under sentinel::DebugUnderflowOverflow: every outermost op, its inputs, outputs
//                and weights, one fused pass per tensor;
//   HfStyle    - HF's DebugUnderflowOverflow as it computes (hf_style.h).
// The same model scripted, and a convolutional network: bench_models.cpp.
// Ratios: see bench/run_benchmarks.sh and docs/benchmarks.md.
#include <benchmark/benchmark.h>
#include <sentinel/sentinel.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>

#include "device/stats_device.h"
#include "no_work_device.h"
#include "fp8/fp8_probe.h"
#include "stats/simd_level.h"
#include "ranks/rank_session.h"
#include "stats/tensor_stats.h"
#include "hf_style.h"
#include "page_faults.h"
#include "reads_beside_counter.h"
#include "stats_pass_cases.h"
#include "transformer_model.h"

namespace {

using bench::kBatch, bench::kFeedForward, bench::kHeads, bench::kLayers, bench::kModel, bench::kSeq;

struct Fixture {
  Fixture() : model(kLayers, kModel, kHeads, kFeedForward) {
    torch::manual_seed(0);
    model->eval();
    x = torch::randn({kBatch, kSeq, kModel});
  }
  bench::Encoder model;
  torch::Tensor x;
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_Unwatched(benchmark::State& state) {
  auto& f = fixture();
  torch::NoGradGuard no_grad;
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(f.model->forward(f.x));
}

// `beside`: Options::read_inputs_beside_ops, on by default; off in `WatchedReadsInline`, which
// measures what reading inputs on the second core saves.
void watched_forward(benchmark::State& state, bool beside) {
  auto& f = fixture();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(f.model, sentinel::Options().output(out).read_inputs_beside_ops(beside));
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(debug.forward(f.x));
  state.counters["frames_kept"] = static_cast<double>(debug.saved_frames().size());
  bench::count_reads_beside(state, debug.device_counters());
}
void BM_Watched(benchmark::State& state) { watched_forward(state, true); }
void BM_WatchedReadsInline(benchmark::State& state) { watched_forward(state, false); }

void BM_HfStyle(benchmark::State& state) {
  auto& f = fixture();
  torch::NoGradGuard no_grad;
  bench::with_hf_hooks(f.model, [&] {
    bench::PageFaults faults(state);
    for (auto _ : state) benchmark::DoNotOptimize(f.model->forward(f.x));
  });
}

// A training step (forward, backward, SGD step) of the same model, three ways. HF's tool sees
// no backward pass, so its baseline hooks the forward only; the sentinel also watches every
// autograd node and checks each parameter's gradient.
struct TrainFixture {
  TrainFixture() : model(kLayers, kModel, kHeads, kFeedForward), optimizer(model->parameters(), 1e-4) {
    torch::manual_seed(0);
    x = torch::randn({kBatch, kSeq, kModel});
  }
  bench::Encoder model;
  torch::optim::SGD optimizer;
  torch::Tensor x;
  void step() {
    optimizer.zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer.step();
  }
};

TrainFixture& train_fixture() {
  static TrainFixture f;
  return f;
}

void BM_TrainStepUnwatched(benchmark::State& state) {
  auto& f = train_fixture();
  bench::PageFaults faults(state);
  for (auto _ : state) f.step();
}

void train_step_watched(benchmark::State& state, bool beside) {
  auto& f = train_fixture();
  std::ostringstream out;
  sentinel::Watchdog watch(f.model.ptr(), sentinel::Options().output(out).read_inputs_beside_ops(beside));
  bench::PageFaults faults(state);
  for (auto _ : state) {
    auto batch = watch.batch();
    f.step();
    batch.finish();
  }
  bench::count_reads_beside(state, watch.device_counters());
}
void BM_TrainStepWatched(benchmark::State& state) { train_step_watched(state, true); }
void BM_TrainStepWatchedReadsInline(benchmark::State& state) { train_step_watched(state, false); }

// Every layer's GEMM tensors (activation, weight, gradient) with the whole statistics menu, on
// every step, logged to JSON lines: what a collection costs at its most demanding setting.
void BM_TrainStepCollected(benchmark::State& state) {
  auto& f = train_fixture();
  std::ostringstream out;
  const std::string dir = "/tmp/sentinel_bench_logs";
  using sentinel::Stat;
  auto options = sentinel::Options().output(out).log_dir(dir).loggers({"jsonl"}).stats_collections(
      {sentinel::StatsCollection().stats({Stat::Min, Stat::Max, Stat::Mean, Stat::Std, Stat::L1Norm, Stat::L2Norm,
                                          Stat::CurAmax, Stat::DynamicRange})});
  {
    sentinel::Watchdog watch(f.model.ptr(), options);
    bench::PageFaults faults(state);
    for (auto _ : state) {
      auto batch = watch.batch();
      f.step();
      batch.finish();
    }
  }
  std::filesystem::remove_all(dir);
}

void BM_TrainStepHfStyle(benchmark::State& state) {
  auto& f = train_fixture();
  bench::with_hf_hooks(f.model, [&] {
    bench::PageFaults faults(state);
    for (auto _ : state) f.step();
  });
}

// What many ranks add to a step: one exchange per batch between 2 ranks, each a client of a c10d
// TCPStore on localhost (as under torchrun), the other rank answering from a thread. Its time is
// compared with BM_TrainStepWatched's in the same run.
void BM_RankExchange2(benchmark::State& state) {
  static auto server = [] {
    c10d::TCPStoreOptions o;
    o.port = 0;  // any free port
    o.isServer = true;
    o.waitWorkers = false;
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  }();
  auto client = [] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(server->getPort());
    o.waitWorkers = false;
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  };
  // One client per rank for the whole run: each repetition's pair of ranks meets under keys of
  // its own (the n-th watchdog of each rank on a store meets the n-th of the other).
  static auto c0 = client(), c1 = client();
  const int64_t rounds = state.max_iterations;
  sentinel::ranks::RankSession rank0(sentinel::RankOptions().rank(0).world_size(2).channel(sentinel::store_channel(c0)));
  sentinel::ranks::RankSession rank1(sentinel::RankOptions().rank(1).world_size(2).channel(sentinel::store_channel(c1)));
  std::thread other([&] {
    for (int64_t round = 0; round < rounds; ++round) rank1.exchange(round, sentinel::ranks::Phase::BatchEnd);
  });
  int64_t round = 0;
  for (auto _ : state) {
    auto agreed = rank0.exchange(round++, sentinel::ranks::Phase::BatchEnd);
    if (!agreed || !agreed->missing.empty()) state.SkipWithError("rank 1 did not answer");
  }
  other.join();
}

// What watching costs per op, apart from reading: 256 ops on a 16-element tensor, whose reads are
// negligible, so (watched - unwatched) / 256 is the time the hooks take per op.
struct TinyOpsImpl : torch::nn::Module {
  static constexpr int kOps = 256;
  torch::Tensor forward(torch::Tensor x) {
    for (int i = 0; i < kOps; ++i) x = torch::add(x, 1.0);
    return x;
  }
};
TORCH_MODULE(TinyOps);

void BM_TinyOpsUnwatched(benchmark::State& state) {
  TinyOps model;
  const auto x = torch::zeros({16});
  torch::NoGradGuard no_grad;
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(model->forward(x));
}

void BM_TinyOpsWatched(benchmark::State& state) {
  TinyOps model;
  const auto x = torch::zeros({16});
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(debug.forward(x));
}

// TinyOps with every tensor handed to a device instead: the host's per-op cost of watching GPU
// tensors, apart from the kernel launches. Counters: reductions started and reads reused per op.
void BM_TinyOpsWatchedThroughDevice(benchmark::State& state) {
  TinyOps model;
  const auto x = torch::zeros({16});
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::device::set_device_factory_for_testing(bench::no_work_device);
  {
    sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
    bench::PageFaults faults(state);
    for (auto _ : state) benchmark::DoNotOptimize(debug.forward(x));
    const auto c = debug.device_counters();
    const double ops = static_cast<double>(state.iterations()) * TinyOps::Impl::kOps;
    state.counters["reductions_per_op"] = static_cast<double>(c.tensors_read_on_device) / ops;
    state.counters["reused_per_op"] = static_cast<double>(c.device_reads_reused) / ops;
  }
  sentinel::device::set_device_factory_for_testing(nullptr);
}

// The statistics pass alone (stats_pass_cases.h), and fused with the FP8 probe or the menu.
using bench_cases::at_level;
using bench_cases::BM_AtSum;
using bench_cases::BM_StatsPass;
using bench_cases::probe_tensor;

// Half of the values zero, as after a ReLU: the float pass then counts zeros in every chunk.
void BM_StatsPassHalfZeros(benchmark::State& state) {
  static const at::Tensor t = probe_tensor().clamp_min(0);
  sentinel::TensorStats s;
  for (auto _ : state) {
    sentinel::stats::compute(t, s);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * t.nbytes());
}

// One head of a packed q/k/v projection, as attention reads it (the transformer's shapes): rows of
// 64 floats, 768 apart. The pass against at::sum of the same view.
const at::Tensor& head_view() {
  static const at::Tensor qkv = torch::randn({4, 128, 3 * 4 * 64});
  static const at::Tensor head = qkv.view({4, 128, 3, 4, 64}).select(2, 1).transpose(1, 2);
  return head;
}
void BM_StatsPassHeadView(benchmark::State& state) {
  sentinel::TensorStats s;
  for (auto _ : state) {
    sentinel::stats::compute(head_view(), s);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * head_view().nbytes());
}
void BM_AtSumHeadView(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(at::sum(head_view()));
  state.SetBytesProcessed(state.iterations() * head_view().nbytes());
}

// The statistics and the whole menu (min, max, mean, std, norms, dynamic range) in one read.
void BM_StatsPassWithMenu(benchmark::State& state) {
  sentinel::TensorStats s;
  for (auto _ : state) {
    sentinel::stats::MomentsAccumulator m;
    sentinel::stats::compute_with_moments(probe_tensor(), s, m);
    benchmark::DoNotOptimize(m);
  }
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

void BM_StatsPassWithFp8Probe(benchmark::State& state) {
  sentinel::TensorStats s;
  sentinel::stats::Fp8ProbeResult p;
  for (auto _ : state) {
    sentinel::stats::compute_with_fp8_probe(probe_tensor(), 448.0f / 12.0f, sentinel::fp8::Format::E4M3, s, p);
    benchmark::DoNotOptimize(p);
  }
  state.SetBytesProcessed(state.iterations() * probe_tensor().nbytes());
}

// Interleaved registration, repeated: each repetition measures the three back to back, so slow
// drifts of the machine affect all three alike.
BENCHMARK(BM_Unwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Watched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WatchedReadsInline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_HfStyle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepUnwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepWatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepWatchedReadsInline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepHfStyle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepCollected)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RankExchange2)->Iterations(2000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TinyOpsUnwatched)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TinyOpsWatched)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TinyOpsWatchedThroughDevice)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StatsPass)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AtSum)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StatsPassHalfZeros)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StatsPassHeadView)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AtSumHeadView)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StatsPassWithFp8Probe)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StatsPassWithMenu)->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPass, 1>)->Name("BM_StatsPass_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPassWithFp8Probe, 1>)->Name("BM_StatsPassWithFp8Probe_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPassWithMenu, 1>)->Name("BM_StatsPassWithMenu_v3")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPass, 0>)->Name("BM_StatsPass_baseline")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPassWithMenu, 0>)->Name("BM_StatsPassWithMenu_baseline")->Unit(benchmark::kMillisecond);
BENCHMARK(at_level<BM_StatsPassWithFp8Probe, 0>)->Name("BM_StatsPassWithFp8Probe_baseline")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

// The models users run besides the C++ transformer of bench_watchdog.cpp, in the same program so
// that every ratio is measured in one run:
//   Scripted* - that transformer scripted by torch.jit.script (make_bench_models.py), run through
//               DebugUnderflowOverflow<torch::jit::Module> as the CLI runs it. No HF-style case:
//               HF's tool hooks Python modules, and a scripted module has no forward hooks.
//   Conv*     - a ResNet-style network (conv_model.h) with in-place ReLU and residual adds.
// Each forward and training step unwatched, watched with default options, and (Conv) HF-style;
// *ReadsInline: watched with every read on the op's own thread (no second thread).
#include <benchmark/benchmark.h>
#include <sentinel/sentinel.h>
#include <torch/script.h>

#include <optional>
#include <sstream>

#include "conv_model.h"
#include "hf_style.h"
#include "page_faults.h"
#include "scripted_model.h"
#include "reads_beside_counter.h"

namespace {

using bench::load_scripted;
using bench::scripted_input;
using bench::ScriptedStep;

void BM_ScriptedUnwatched(benchmark::State& state) {
  auto model = load_scripted(state);
  if (!model) return;
  model->eval();
  torch::NoGradGuard no_grad;
  const std::vector<c10::IValue> inputs{scripted_input()};
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(model->forward(inputs));
}

void scripted_watched(benchmark::State& state, bool beside) {
  auto model = load_scripted(state);
  if (!model) return;
  model->eval();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(*model,
                                                             sentinel::Options().output(out).read_inputs_beside_ops(beside));
  const std::vector<c10::IValue> inputs{scripted_input()};
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(debug.forward(inputs));
  bench::count_reads_beside(state, debug.device_counters());
}
void BM_ScriptedWatched(benchmark::State& state) { scripted_watched(state, true); }
void BM_ScriptedWatchedReadsInline(benchmark::State& state) { scripted_watched(state, false); }

void BM_ScriptedTrainStepUnwatched(benchmark::State& state) {
  auto model = load_scripted(state);
  if (!model) return;
  ScriptedStep s(*model);  // the same module: its modes are set by each case
  bench::PageFaults faults(state);
  for (auto _ : state) s.step();
}

void BM_ScriptedTrainStepWatched(benchmark::State& state) {
  auto model = load_scripted(state);
  if (!model) return;
  ScriptedStep s(*model);  // the same module: its modes are set by each case
  std::ostringstream out;
  sentinel::Watchdog watch(s.model, sentinel::Options().output(out));
  bench::PageFaults faults(state);
  for (auto _ : state) {
    auto batch = watch.batch();
    s.step();
    batch.finish();
  }
}

struct ConvFixture {
  ConvFixture() {
    torch::manual_seed(0);
    x = torch::randn({8, 3, 64, 64});
  }
  bench::ResNet model;
  torch::Tensor x;
};

ConvFixture& conv_fixture(bool training) {
  static ConvFixture eval, train;
  ConvFixture& f = training ? train : eval;
  f.model->train(training);
  return f;
}

void BM_ConvUnwatched(benchmark::State& state) {
  auto& f = conv_fixture(false);
  torch::NoGradGuard no_grad;
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(f.model->forward(f.x));
}

// `beside`: Options::read_inputs_beside_ops, on by default; off in *ReadsInline, every read on the op's thread.
void conv_watched(benchmark::State& state, bool beside) {
  auto& f = conv_fixture(false);
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(
      f.model, sentinel::Options().output(out).read_inputs_beside_ops(beside));
  bench::PageFaults faults(state);
  for (auto _ : state) benchmark::DoNotOptimize(debug.forward(f.x));
  bench::count_reads_beside(state, debug.device_counters());
}
void BM_ConvWatched(benchmark::State& state) { conv_watched(state, true); }
void BM_ConvWatchedReadsInline(benchmark::State& state) { conv_watched(state, false); }

void BM_ConvHfStyle(benchmark::State& state) {
  auto& f = conv_fixture(false);
  torch::NoGradGuard no_grad;
  bench::with_hf_hooks(f.model, [&] {
    bench::PageFaults faults(state);
    for (auto _ : state) benchmark::DoNotOptimize(f.model->forward(f.x));
  });
}

void conv_step(ConvFixture& f, torch::optim::SGD& sgd) {
  sgd.zero_grad();
  f.model->forward(f.x).pow(2).mean().backward();
  sgd.step();
}

void BM_ConvTrainStepUnwatched(benchmark::State& state) {
  auto& f = conv_fixture(true);
  torch::optim::SGD sgd(f.model->parameters(), 1e-4);
  bench::PageFaults faults(state);
  for (auto _ : state) conv_step(f, sgd);
}

void conv_train_step_watched(benchmark::State& state, bool beside) {
  auto& f = conv_fixture(true);
  torch::optim::SGD sgd(f.model->parameters(), 1e-4);
  std::ostringstream out;
  sentinel::Watchdog watch(
      f.model.ptr(), sentinel::Options().output(out).read_inputs_beside_ops(beside));
  bench::PageFaults faults(state);
  for (auto _ : state) {
    auto batch = watch.batch();
    conv_step(f, sgd);
    batch.finish();
  }
  bench::count_reads_beside(state, watch.device_counters());
}
void BM_ConvTrainStepWatched(benchmark::State& state) { conv_train_step_watched(state, true); }
void BM_ConvTrainStepWatchedReadsInline(benchmark::State& state) { conv_train_step_watched(state, false); }

void BM_ConvTrainStepHfStyle(benchmark::State& state) {
  auto& f = conv_fixture(true);
  torch::optim::SGD sgd(f.model->parameters(), 1e-4);
  bench::with_hf_hooks(f.model, [&] {
    bench::PageFaults faults(state);
    for (auto _ : state) conv_step(f, sgd);
  });
}

BENCHMARK(BM_ScriptedUnwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScriptedWatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScriptedWatchedReadsInline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScriptedTrainStepUnwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ScriptedTrainStepWatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvUnwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvWatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvWatchedReadsInline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvHfStyle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvTrainStepUnwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvTrainStepWatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvTrainStepWatchedReadsInline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConvTrainStepHfStyle)->Unit(benchmark::kMillisecond);

}  // namespace

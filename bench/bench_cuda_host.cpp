// Where the host's time goes in the GPU benchmark's GPT-2 step (bench_cuda's Gpt2Step cases):
//   EmptyCallback/B - the unwatched step under a RecordFunction callback that does nothing,
//                     every op's arguments and results boxed for it (B = 1, as the watchdog
//                     asks) or not (B = 0): LibTorch's own price for an event per op;
//   Phases/K        - one step of kind K (0 unwatched, 1 watched with a device that launches
//                     nothing, 2 watched), the host's wall time in each phase: forward (with
//                     zero_grad), backward, the batch's end (its read-back's wait), the optimizer
//                     step, and the wait for the GPU at the step's end. A phase that grows by
//                     what the GPU then waits for is where the host is the step's bound.
// First: it reads RecordFunction's header as LibTorch was built.
#include "empty_callback.h"

#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <exception>
#include <memory>
#include <sstream>

#include "gpt2_cuda_rig.h"
#include "no_work_device.h"
#include "phase_clock.h"

namespace {

void BM_Gpt2StepEmptyCallback(benchmark::State& state) {
  if (bench::skip_without_gpu(state)) return;
  try {
    bench::Gpt2Rig rig;
    const bench::EmptyCallback callback(state.range(0) != 0);
    bench::warm_up([&] { rig.step(); });
    const int64_t events_before = bench::EmptyCallback::events();
    bench::time_steps(state, [&] { rig.step(); });
    state.counters["events_per_step"] = bench::per_step(bench::EmptyCallback::events() - events_before, state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

enum PhaseKind { kUnwatched = 0, kHostOnly = 1, kWatched = 2 };

void BM_Gpt2StepPhases(benchmark::State& state) {
  if (bench::skip_without_gpu(state)) return;
  const auto kind = static_cast<PhaseKind>(state.range(0));
  try {
    bench::Gpt2Rig rig;
    if (kind == kHostOnly) sentinel::device::set_device_factory_for_testing(bench::no_work_cuda_device);
    std::ostringstream out;
    std::unique_ptr<sentinel::Watchdog> watch;
    if (kind != kUnwatched) watch = std::make_unique<sentinel::Watchdog>(rig.model.ptr(), sentinel::Options().output(out));
    bench::PhaseClock clock(state);
    auto step = [&](bool timed) {
      bench::phased_step(rig, watch.get(), timed ? &clock : nullptr);
      torch::cuda::synchronize();
      if (timed) clock.mark("gpu_wait");
    };
    for (int i = 0; i < bench::kWarmUpSteps; ++i) step(false);
    for (auto _ : state) step(true);
    clock.report();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  sentinel::device::set_device_factory_for_testing(nullptr);
}

}  // namespace

BENCHMARK(BM_Gpt2StepEmptyCallback)->Arg(0)->Arg(1)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepPhases)->Arg(0)->Arg(1)->Arg(2)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);

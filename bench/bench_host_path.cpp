// The host's part of watching the GPU benchmark's GPT-2 step, measured on the CPU: the same
// model structure and watched step as bench_cuda's Gpt2StepWatched (every op, module, backward
// node and optimizer op alike), shrunk to tiny widths so that the ops themselves cost little,
// with every tensor handed to a device that does no work (no_work_device.h). What the watched
// step adds over the unwatched one, per deferred frame, is what the watchdog costs the host per
// op on a GPU, launches excluded: the work that decides whether the host stays ahead of the GPU.
// First: it reads RecordFunction's header as LibTorch was built.
#include "empty_callback.h"

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <memory>
#include <sstream>

#include "bench/gpt2_model.h"
#include "no_work_device.h"
#include "phase_clock.h"

namespace {

// GPT-2's layer count and op structure at widths where an op costs a few microseconds.
bench::Gpt2Config tiny_widths() {
  bench::Gpt2Config c;
  c.vocab = 512;
  c.context = 64;
  c.d_model = 64;
  c.heads = 4;
  c.mlp = 256;
  return c;
}

struct TinyGpt2Rig {
  TinyGpt2Rig() : model((torch::manual_seed(0), tiny_widths())) {
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
    ids = torch::randint(model->config.vocab, {2, 32}, torch::kLong);
    targets = torch::randint(model->config.vocab, {2 * 32}, torch::kLong);
  }
  torch::Tensor loss() {
    auto logits = model->forward(ids);
    return torch::nn::functional::cross_entropy(logits.view({-1, model->config.vocab}), targets);
  }
  bench::Gpt2 model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  torch::Tensor ids, targets;
};

void BM_Gpt2HostUnwatched(benchmark::State& state) {
  TinyGpt2Rig rig;
  for (auto _ : state) {
    rig.optimizer->zero_grad();
    rig.loss().backward();
    rig.optimizer->step();
  }
}

// The unwatched step under a callback that does nothing (empty_callback.h), the arguments and
// results boxed for it (argument 1) or not (0).
void BM_Gpt2HostEmptyCallback(benchmark::State& state) {
  TinyGpt2Rig rig;
  const bench::EmptyCallback callback(state.range(0) != 0);
  for (auto _ : state) {
    rig.optimizer->zero_grad();
    rig.loss().backward();
    rig.optimizer->step();
  }
  state.counters["events_per_step"] =
      static_cast<double>(bench::EmptyCallback::events()) / static_cast<double>(state.iterations());
}

// Argument 1: the steps run inside a named scope (RECORD_USER_SCOPE), which keeps the thread's
// callback on between them, so that the optimizer's ops reach it as they all did before a
// finished step took it off: the price of that, within one run.
void BM_Gpt2HostThroughDevice(benchmark::State& state) {
  TinyGpt2Rig rig;
  sentinel::device::set_device_factory_for_testing(bench::no_work_device);
  {
    std::ostringstream out;
    sentinel::Watchdog watch(rig.model.ptr(), sentinel::Options().output(out));
    const auto before = watch.device_counters();
    auto run_steps = [&] {
      for (auto _ : state) {
        rig.optimizer->zero_grad();
        auto batch = watch.batch();
        watch.backward(rig.loss());
        batch.finish();
        rig.optimizer->step();
      }
    };
    if (state.range(0) != 0) {
      RECORD_USER_SCOPE("training_loop");
      run_steps();
    } else {
      run_steps();
    }
    const auto after = watch.device_counters();
    const double steps = static_cast<double>(state.iterations());
    state.counters["frames_per_step"] = static_cast<double>(after.frames_deferred - before.frames_deferred) / steps;
    state.counters["reductions_per_step"] =
        static_cast<double>(after.tensors_read_on_device - before.tensors_read_on_device) / steps;
  }
  sentinel::device::set_device_factory_for_testing(nullptr);
}

// One step of kind K (0 unwatched, 1 watched through the device that does no work), the host's
// time per phase in ms per step: forward (with zero_grad), backward, the batch's end, the
// optimizer. Which part of the step the watchdog's host work lands in.
void BM_Gpt2HostPhases(benchmark::State& state) {
  TinyGpt2Rig rig;
  const bool watched = state.range(0) != 0;
  sentinel::device::set_device_factory_for_testing(bench::no_work_device);
  {
    std::ostringstream out;
    std::unique_ptr<sentinel::Watchdog> watch;
    if (watched) watch = std::make_unique<sentinel::Watchdog>(rig.model.ptr(), sentinel::Options().output(out));
    bench::PhaseClock clock(state);
    for (auto _ : state) bench::phased_step(rig, watch.get(), &clock);
    clock.report();
  }
  sentinel::device::set_device_factory_for_testing(nullptr);
}

}  // namespace

BENCHMARK(BM_Gpt2HostUnwatched)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2HostEmptyCallback)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2HostThroughDevice)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2HostPhases)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

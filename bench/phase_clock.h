#pragma once
// The host's wall time of a benchmark's step split into named phases (bench_cuda_host.cpp's
// Gpt2StepPhases, bench_host_path.cpp's Gpt2HostPhases).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

namespace bench {

// Accumulates the host's wall time between marks into named phases, in ms per step.
class PhaseClock {
 public:
  explicit PhaseClock(benchmark::State& state) : state_(state) {}
  void start() { last_ = std::chrono::steady_clock::now(); }
  void mark(const char* phase) {
    const auto now = std::chrono::steady_clock::now();
    totals_[phase] += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }
  void report() {
    for (const auto& [phase, total] : totals_) {
      state_.counters[phase + "_ms"] = state_.iterations() > 0 ? total / static_cast<double>(state_.iterations()) : 0;
    }
  }

 private:
  benchmark::State& state_;
  std::map<std::string, double> totals_;
  std::chrono::steady_clock::time_point last_;
};

// One training step of `rig` (its `optimizer` and `loss()`), watched by `watch` when given, its
// phases marked on `clock` when given: forward (with zero_grad), backward, the batch's end (its
// read-back's wait), the optimizer step.
template <class Rig>
void phased_step(Rig& rig, sentinel::Watchdog* watch, PhaseClock* clock) {
  const auto mark = [&](const char* phase) {
    if (clock) clock->mark(phase);
  };
  if (clock) clock->start();
  rig.optimizer->zero_grad();
  std::unique_ptr<sentinel::BatchGuard> batch;
  if (watch) batch = std::make_unique<sentinel::BatchGuard>(watch->batch());
  auto loss = rig.loss();
  mark("forward");
  if (watch) {
    watch->backward(loss);
  } else {
    loss.backward();
  }
  mark("backward");
  if (batch) batch->finish();
  mark("batch_end");
  rig.optimizer->step();
  mark("optimizer");
}

}  // namespace bench

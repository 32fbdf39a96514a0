#pragma once
// The GPU benchmarks' GPT-2 training step (bench_cuda.cpp, bench_cuda_host.cpp): the model on
// the device in bf16 with LibTorch's AdamW, its watched forms, and the timing of whole steps.
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <cstdint>
#include <ctime>
#include <memory>

#include "gpt2_model.h"

namespace bench {

inline bool skip_without_gpu(benchmark::State& state) {
  if (torch::cuda::is_available()) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

// GPT-2 small at batch 8 x 512 tokens (half the 1024 context): activations, the float32 logits
// for the loss and their gradients take a few GiB, well within one H100; 512 keeps a step short
// enough that ten timed steps per case finish quickly.
inline constexpr int64_t kBatch = 8, kSeq = 512;
inline constexpr int kWarmUpSteps = 3;  // cuBLAS handles, the caching allocator's pools, AdamW's state

struct Gpt2Rig {
  Gpt2Rig() : model((torch::manual_seed(0), bench::Gpt2Config{})) {
    model->to(torch::kCUDA, torch::kBFloat16);
    // Made after the move so its state is created on the device, in bf16, at the first step.
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-4));
    const auto ids_options = torch::TensorOptions().dtype(torch::kLong).device(torch::kCUDA);
    ids = torch::randint(model->config.vocab, {kBatch, kSeq}, ids_options);
    targets = torch::randint(model->config.vocab, {kBatch * kSeq}, ids_options);
  }

  // Cross-entropy in float32, as mixed-precision loops compute it: bf16 logits over 50k classes
  // lose too much in log-softmax.
  torch::Tensor loss() {
    auto logits = model->forward(ids);
    return torch::nn::functional::cross_entropy(logits.view({-1, model->config.vocab}).to(torch::kFloat32),
                                                targets);
  }

  void step() {
    optimizer->zero_grad();
    loss().backward();
    optimizer->step();
  }

  bench::Gpt2 model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  torch::Tensor ids, targets;
};

// The process's CPU time (every thread: autograd runs CUDA nodes on a thread of its own), in ms.
inline double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

template <class Step>
void warm_up(Step&& step) {
  for (int i = 0; i < kWarmUpSteps; ++i) step();
  torch::cuda::synchronize();
}

// Runs `step` once per iteration, each waited for: the time is a whole step as the host sees it,
// including the watchdog's read-backs. Counter: the host's CPU time per step, which the GPU waits
// on when it exceeds the step's device time.
template <class Step>
void time_steps(benchmark::State& state, Step&& step) {
  const double cpu_before = process_cpu_ms();
  for (auto _ : state) {
    step();
    torch::cuda::synchronize();
  }
  if (state.iterations() > 0) {
    state.counters["cpu_ms_per_step"] = (process_cpu_ms() - cpu_before) / static_cast<double>(state.iterations());
  }
}

inline double per_step(int64_t total, const benchmark::State& state) {
  return state.iterations() > 0 ? static_cast<double>(total) / static_cast<double>(state.iterations()) : 0.0;
}

inline void watched_gpt2_step(Gpt2Rig& rig, sentinel::Watchdog& watch) {
  rig.optimizer->zero_grad();
  auto batch = watch.batch();
  auto loss = rig.loss();
  watch.backward(loss);  // gradients checked before the optimizer can spread a bad one
  batch.finish();
  rig.optimizer->step();
}

// The batch ended after the optimizer step: its one host wait comes at the step's end, where the
// loop waits anyway, not before the optimizer, whose launches then no longer overlap the
// backward's kernels (the GPU idles while the host issues them). The price: a report comes after
// the optimizer has written with a bad gradient.
inline void watched_gpt2_step_checked_at_end(Gpt2Rig& rig, sentinel::Watchdog& watch) {
  rig.optimizer->zero_grad();
  auto batch = watch.batch();
  auto loss = rig.loss();
  watch.backward(loss);
  rig.optimizer->step();
  batch.finish();
}

}  // namespace bench

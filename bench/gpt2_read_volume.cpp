// What the watched GPT-2 training step of bench_cuda asks of a device, counted on the CPU: the
// same model and watched step (float32 here), read through the deferring CPU device, which the
// watchdog cannot tell from a GPU. Per step: deferred frames, reductions started (one kernel
// launch each on a GPU), reads reused from an earlier read of unchanged memory, and the elements
// the reductions pass over. Every activation tensor grows linearly with the batch at a fixed
// sequence length and the parameters do not, so two batch sizes give the count at any other.
//
//   gpt2_read_volume [batch...]      (default: 1 2; sequence 512, GPT-2-small's shape)
#include <fmt/core.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench/counting_device.h"
#include "bench/gpt2_model.h"
#include "device/stats_device.h"

namespace {

namespace device = sentinel::device;

struct StepCounts {
  int64_t frames = 0, reads = 0, reused = 0, elements = 0;
};

// The second of two watched steps (the first makes the device ring), as bench_cuda runs it.
StepCounts watched_step_counts(int64_t batch, int64_t seq) {
  torch::manual_seed(0);
  bench::Gpt2 model{bench::Gpt2Config{}};
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  const auto ids = torch::randint(model->config.vocab, {batch, seq}, torch::kLong);
  const auto targets = torch::randint(model->config.vocab, {batch * seq}, torch::kLong);
  device::set_device_factory_for_testing(bench::counting_device<device::make_cpu_deferred_device>);
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  StepCounts counts;
  for (int step = 0; step < 2; ++step) {
    const auto before = watch.device_counters();
    const int64_t elements_before = bench::counted_reads.elements;
    optimizer.zero_grad();
    auto guard = watch.batch();
    auto logits = model->forward(ids);
    auto loss = torch::nn::functional::cross_entropy(logits.view({-1, model->config.vocab}).to(torch::kFloat32),
                                                     targets);
    watch.backward(loss);
    guard.finish();
    optimizer.step();
    const auto after = watch.device_counters();
    counts = StepCounts{after.frames_deferred - before.frames_deferred,
                        after.tensors_read_on_device - before.tensors_read_on_device,
                        after.device_reads_reused - before.device_reads_reused,
                        bench::counted_reads.elements - elements_before};
  }
  device::set_device_factory_for_testing(nullptr);
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int64_t kSeq = 512;
  std::vector<int64_t> batches;
  for (int i = 1; i < argc; ++i) batches.push_back(std::atoll(argv[i]));
  if (batches.empty()) batches = {1, 2};
  fmt::print("GPT-2-small watched training step, sequence {}, float32 on the CPU, per step:\n", kSeq);
  fmt::print("{:>6} {:>8} {:>13} {:>13} {:>16}\n", "batch", "frames", "reductions", "reads reused", "elements read");
  std::vector<StepCounts> all;
  for (int64_t b : batches) {
    if (b <= 0) {
      fmt::print(stderr, "gpt2_read_volume: a batch must be a positive number, got {}\n", b);
      return 2;
    }
    all.push_back(watched_step_counts(b, kSeq));
    const auto& c = all.back();
    fmt::print("{:>6} {:>8} {:>13} {:>13} {:>16}\n", b, c.frames, c.reads, c.reused, c.elements);
  }
  if (all.size() >= 2 && batches[1] != batches[0]) {
    // elements(b) = fixed + per_sequence * b, from the first two batch sizes.
    const double per_sequence =
        static_cast<double>(all[1].elements - all[0].elements) / static_cast<double>(batches[1] - batches[0]);
    const double fixed = static_cast<double>(all[0].elements) - per_sequence * static_cast<double>(batches[0]);
    fmt::print("elements read at batch 8: {:.4g} (fixed {:.4g}, {:.4g} per sequence)\n", fixed + 8 * per_sequence,
               fixed, per_sequence);
  }
  return 0;
}

// Data-parallel training on several processes, under the watchdog: every rank trains the same
// model on its own shard, and the gradients are averaged with ProcessGroupGloo's all-reduce.
// Start it as torchrun would (each process gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT; rank 0 serves the c10d store), or alone as one process:
//
//   export WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 SENTINEL_EXAMPLE_REPORT_DIR=reports
//   for r in 0 1 2; do RANK=$r LOCAL_RANK=$r ./example_ranks_data_parallel & done; wait
//   sentinel ranks reports
//
// One rank (SENTINEL_EXAMPLE_BAD_RANK, default 1) gets a batch whose loss overflows at step
// SENTINEL_EXAMPLE_BAD_STEP (default 2). It trips; at watch.backward() the ranks exchange, so every
// rank stops before the all-reduce could spread the inf, and every report names the rank that
// made it. Other knobs: SENTINEL_EXAMPLE_PLAIN_BACKWARD=1 (loss.backward(): the other ranks then
// receive the inf through the all-reduce and say so), SENTINEL_EXAMPLE_KILL_RANK=R (that rank dies
// in the middle of the bad step instead), SENTINEL_EXAMPLE_THROW_RANK=R (that rank's own code
// throws in the bad step: it exits with 2), SENTINEL_EXAMPLE_BAD_BACKWARD=1 (the bad rank's
// backward makes the inf/nan, not its forward), SENTINEL_EXAMPLE_FORWARD_ONLY_BATCH=1 (the batch is
// the forward alone, as DebugUnderflowOverflow::forward makes it; watch.backward() follows it),
// SENTINEL_EXAMPLE_TIMEOUT (seconds without a sign of life after which a rank is given up).
#include <sentinel/sentinel.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "gloo_group.h"

namespace {

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

struct RegressorImpl : torch::nn::Module {
  RegressorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Regressor);

c10::intrusive_ptr<c10d::ProcessGroup> make_group(int64_t rank, int64_t world) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env_or("MASTER_PORT", 29500));
  // Rank 0 serves the store, unless torchrun's agent already does (PyTorch 2.x).
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  so.isServer = rank == 0 && !(agent_store && std::string(agent_store) == "True");
  so.numWorkers = static_cast<size_t>(world);
  so.timeout = std::chrono::seconds(60);
  const char* addr = std::getenv("MASTER_ADDR");
  auto store = c10::make_intrusive<c10d::TCPStore>(addr ? addr : "127.0.0.1", so);
  return sentinel_examples::gloo_group(store, static_cast<int>(rank), static_cast<int>(world), std::chrono::seconds(60));
}

}  // namespace

int main() {
  const int64_t rank = env_or("RANK", 0), world = env_or("WORLD_SIZE", 1);
  const int64_t bad_rank = env_or("SENTINEL_EXAMPLE_BAD_RANK", world > 1 ? 1 : 0);
  const int64_t bad_step = env_or("SENTINEL_EXAMPLE_BAD_STEP", 2);
  const int64_t kill_rank = env_or("SENTINEL_EXAMPLE_KILL_RANK", -1);
  const int64_t throw_rank = env_or("SENTINEL_EXAMPLE_THROW_RANK", -1);
  const bool plain_backward = env_or("SENTINEL_EXAMPLE_PLAIN_BACKWARD", 0) != 0;
  const bool forward_only_batch = env_or("SENTINEL_EXAMPLE_FORWARD_ONLY_BATCH", 0) != 0;
  const bool bad_backward = env_or("SENTINEL_EXAMPLE_BAD_BACKWARD", 0) != 0;
  const char* report_dir = std::getenv("SENTINEL_EXAMPLE_REPORT_DIR");

  c10::intrusive_ptr<c10d::ProcessGroup> group;
  if (world > 1) group = make_group(rank, world);

  torch::manual_seed(0);  // the same initial weights on every rank
  Regressor model;
  torch::optim::SGD optimizer(model->parameters(), /*lr=*/0.01);
  // The watchdog finds its rank in the environment and talks through the store at MASTER_ADDR.
  sentinel::Watchdog watch(model.ptr(), sentinel::Options()
                                            .max_frames_to_save(6)
                                            .report_dir(report_dir ? report_dir : "")
                                            .ranks(sentinel::RankOptions().timeout_seconds(
                                                static_cast<double>(env_or("SENTINEL_EXAMPLE_TIMEOUT", 5)))));
  torch::manual_seed(100 + rank);  // each rank its own shard
  try {
    for (int64_t step = 0; step < 6; ++step) {
      std::optional<sentinel::BatchGuard> batch(watch.batch());
      optimizer.zero_grad();
      auto x = torch::randn({16, 8});
      const bool bad = rank == bad_rank && step == bad_step;
      if (bad && !bad_backward) x = x * 1e20;  // a corrupt shard: the loss overflows
      auto loss = torch::mse_loss(model->forward(x), x.sum(1, /*keepdim=*/true));
      // The gradient of sqrt at 0 is inf: a loss term whose value is 0 and whose backward is not.
      if (bad && bad_backward) loss = loss + (model->fc2->bias * 0).sqrt().sum();
      if (forward_only_batch) batch->finish();  // HF's way: the batch is the forward alone
      if (rank == kill_rank && step == bad_step) std::raise(SIGKILL);  // dies in the middle of the step
      if (rank == throw_rank && step == bad_step) throw std::runtime_error("the data loader failed");
      if (plain_backward) {
        loss.backward();
      } else {
        watch.backward(loss);  // checks the gradients and meets the other ranks, before the all-reduce
      }
      if (group) {
        for (auto& p : model->parameters()) {
          std::vector<torch::Tensor> grads{p.mutable_grad()};
          group->allreduce(grads)->wait();
          p.mutable_grad().div_(static_cast<double>(world));
        }
      }
      optimizer.step();
      if (batch) batch->finish();
      std::cout << "rank " << rank << " step " << step << " loss " << loss.item<float>() << "\n";
    }
  } catch (const sentinel::NonFiniteError& e) {
    const auto& r = e.report();
    std::cout << "\nrank " << rank << " stopped at batch " << r.batch_number << " ("
              << sentinel::to_string(r.ranks.role) << ")"
              << (r.ranks.first ? "; rank " + std::to_string(r.ranks.first->rank) + " saw inf/nan first" : std::string())
              << "\n";
    return 0;
  } catch (const sentinel::RanksMissingError& e) {
    std::cout << "\nrank " << rank << " stopped: " << e.report().origin << "\n";
    return 0;
  } catch (const std::exception& e) {  // the program's own error: the other ranks hear of it
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    return 2;
  }
  std::cerr << "rank " << rank << ": the training never stopped: the example expects it to\n";
  return 1;
}

// What a thread that no watchdog watches pays for its ops while a watchdog exists in the process:
// the same 100 small ops with no watchdog, beside a watchdog that another thread made, and beside
// one process-wide callback that asks for every op's arguments (how the watchdog used to listen:
// LibTorch then boxes the arguments of every op on every thread).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <ATen/record_function.h>
#include <sentinel/sentinel.h>

#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>

namespace {

constexpr int kOps = 100;

void small_ops(const torch::Tensor& a) {
  torch::Tensor x = a;
  for (int i = 0; i < kOps / 2; ++i) x = x.add(1.0).mul(0.5);
  benchmark::DoNotOptimize(x);
}

// A watchdog made, and kept, on a thread of its own (a training thread the user watches).
class WatchdogOnAnotherThread {
 public:
  WatchdogOnAnotherThread() {
    thread_ = std::thread([this] {
      auto model = std::make_shared<torch::nn::LinearImpl>(4, 4);
      std::ostringstream out;
      sentinel::Watchdog watch(model, sentinel::Options().output(out));
      {
        auto step = watch.batch();
        model->forward(torch::ones({2, 4}));
        step.finish();
      }
      std::unique_lock<std::mutex> lock(mutex_);
      made_ = true;
      changed_.notify_all();
      changed_.wait(lock, [this] { return done_; });
    });
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return made_; });
  }
  ~WatchdogOnAnotherThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

 private:
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool made_ = false, done_ = false;
};

std::unique_ptr<at::ObserverContext> ignore_start(const at::RecordFunction&) { return nullptr; }
void ignore_end(const at::RecordFunction&, at::ObserverContext*) {}

void run(benchmark::State& state) {
  const auto a = torch::ones({64});
  for (auto _ : state) small_ops(a);
  state.counters["per_op"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kOps, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_UnwatchedThreadAlone(benchmark::State& state) { run(state); }

void BM_UnwatchedThreadBesideWatchdog(benchmark::State& state) {
  WatchdogOnAnotherThread elsewhere;
  run(state);
}

void BM_UnwatchedThreadBesideGlobalArgumentCallback(benchmark::State& state) {
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(ignore_start, ignore_end)
                                                .needsInputs(true)
                                                .needsOutputs(true)
                                                .scopes({at::RecordScope::FUNCTION}));
  run(state);
  at::removeCallback(handle);
}

}  // namespace

BENCHMARK(BM_UnwatchedThreadAlone)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_UnwatchedThreadBesideWatchdog)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_UnwatchedThreadBesideGlobalArgumentCallback)->Unit(benchmark::kMicrosecond);

// GPU benchmarks (needs a CUDA device and a LibTorch built with CUDA; every case skips without one).
//
// 1. The statistics kernel against the memory system: one reduction over a 256 MiB tensor is
//    bound by reading it, so its bandwidth is compared with a device-to-device copy of the same
//    bytes (read + write), the practical ceiling. Variants: float32, bfloat16, and bfloat16 with
//    the FP8 probe fused in (same bytes, more arithmetic per element).
// 2. One bf16 training step (zero_grad, forward, loss, backward, AdamW step) of a GPT-2-small-
//    sized decoder, three ways:
//      Unwatched - the model alone;
//      Watched   - under sentinel::Watchdog (every op's outputs and every gradient checked, the
//                  statistics computed on the device and read back in batches), checked
//                  before the optimizer step, and again with the batch ended after it
//                  (CheckedAtEnd: the host wait where the loop waits anyway);
//      HfStyle   - HF's DebugUnderflowOverflow as it computes: after every module, for its
//                  parameters, input and output, abs(), min(), max(), isnan().any(),
//                  isinf().any(), each read back to the host with .item() - one host
//                  synchronisation each (forward only: HF's tool sees no backward pass).
//    and, with the FP8 replays on every GEMM operand: delayed scaling alone (the probe fused into
//    the statistics launch), and all five recipes (a launch per recipe and operand besides).
//    Once each under PyTorch's profiler (Gpt2StepProfile): where the GPU time goes.
// 3. Each recipe's kernel on the bfloat16 tensor of 1., as activations (blocks along rows of
//    4096) and as a weight (NVFP4's 16 x 16 and Float8Block's 128 x 128 tiles): the tensor's
//    bytes over the time, against the copy.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <memory>
#include <sstream>
#include <string>

#include "cuda/device_stats.h"
#include "cuda/recipe_device.h"
#include "counting_device.h"
#include "gpt2_cuda_rig.h"
#include "no_work_device.h"
#include "step_profile.h"
#include "fp8/fp8_probe_math.h"

namespace {

using bench::Gpt2Rig;
using bench::kWarmUpSteps;
using bench::per_step;
using bench::skip_without_gpu;
using bench::time_steps;
using bench::warm_up;
using bench::watched_gpt2_step;
using bench::watched_gpt2_step_checked_at_end;
using sentinel::cuda::DeviceSlot;
using sentinel::cuda::DType;

// Throws so that one catch per case turns any CUDA failure into SkipWithError.
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// ---------------------------------------------------------------------------------------------
// Kernel bandwidth

constexpr int64_t kKernelBytes = int64_t{256} << 20;  // far larger than H100's 50 MB L2
// Launches per timed iteration: one launch of a 256 MiB pass is ~0.1 ms, close enough to the
// event resolution and launch gaps that a batch of them gives steadier numbers.
constexpr int kLaunchesPerIteration = 10;
// randn's |x| rarely exceeds 6, so this maps the tensor's range onto E4M3's [0, 448] as a
// delayed-scaling recipe would (the probe does the same work whatever the scale).
constexpr float kProbeScale = 448.0f / 6.0f;

struct KernelRig {
  KernelRig() {
    const auto on_gpu = torch::TensorOptions().device(torch::kCUDA);
    torch::manual_seed(0);
    f32 = torch::randn({kKernelBytes / 4}, on_gpu.dtype(torch::kFloat32));
    bf16 = torch::randn({kKernelBytes / 2}, on_gpu.dtype(torch::kBFloat16));
    cuda_check(cudaMalloc(&copy_dst, kKernelBytes), "cudaMalloc(copy destination)");
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&slot), sizeof(DeviceSlot)), "cudaMalloc(slot)");
    // Non-blocking: nothing else in the process (LibTorch's default stream) serialises with it.
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreate(&start), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
    probe = sentinel::stats::make_fp8_probe_params(kProbeScale, sentinel::fp8::Format::E4M3);
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&record), sizeof(sentinel::cuda::DeviceRecipeRecord)), "cudaMalloc(record)");
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&amax), sizeof(unsigned int)), "cudaMalloc(amax)");
    cuda_check(cudaMemset(amax, 0, sizeof(unsigned int)), "cudaMemset(amax)");
    cuda_check(cudaMemset(record, 0, sizeof(sentinel::cuda::DeviceRecipeRecord)), "cudaMemset(record)");
    torch::cuda::synchronize();  // randn ran on LibTorch's stream; the data must be there first
    // The recipes' launches read the tensor amax the statistics launch leaves.
    sentinel::cuda::reduce_into_slot(bf16.data_ptr(), bf16.numel(), DType::kBFloat16, slot, nullptr, stream, false,
                                     true, amax);
    cuda_check(cudaStreamSynchronize(stream), "amax of the bfloat16 tensor");
  }
  torch::Tensor f32, bf16;
  void* copy_dst = nullptr;
  DeviceSlot* slot = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  sentinel::stats::Fp8ProbeParams probe;
  sentinel::cuda::DeviceRecipeRecord* record = nullptr;
  unsigned int* amax = nullptr;
};

// Made on first use and never freed: freeing device memory from a static destructor can run
// after the CUDA runtime has shut down.
KernelRig& kernel_rig() {
  static KernelRig* rig = new KernelRig();
  return *rig;
}

// Times `launch` with events on the rig's stream. The reported time is per launch, and the
// bytes are per launch, so bytes_per_second and GBps are bandwidths.
template <class Launch>
void time_launches(benchmark::State& state, int64_t bytes_per_launch, Launch&& launch) {
  auto& rig = kernel_rig();
  // The first launches load the module (CUDA's lazy loading) and warm the clocks.
  for (int i = 0; i < 3; ++i) launch(rig);
  cuda_check(cudaStreamSynchronize(rig.stream), "warm-up");
  for (auto _ : state) {
    cuda_check(cudaEventRecord(rig.start, rig.stream), "cudaEventRecord");
    for (int i = 0; i < kLaunchesPerIteration; ++i) launch(rig);
    cuda_check(cudaEventRecord(rig.stop, rig.stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(rig.stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, rig.start, rig.stop), "cudaEventElapsedTime");
    state.SetIterationTime(ms / 1e3 / kLaunchesPerIteration);
  }
  const auto bytes = state.iterations() * bytes_per_launch;
  state.SetBytesProcessed(bytes);
  // Decimal GB, as GPU bandwidths are quoted (bytes_per_second above is in binary units).
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(bytes) / 1e9, benchmark::Counter::kIsRate);
}

template <class Launch>
void run_kernel_case(benchmark::State& state, int64_t bytes_per_launch, Launch&& launch) {
  if (skip_without_gpu(state)) return;
  try {
    time_launches(state, bytes_per_launch, launch);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_StatsKernel(benchmark::State& state) {
  run_kernel_case(state, kKernelBytes, [](KernelRig& r) {
    sentinel::cuda::reduce_into_slot(r.f32.data_ptr(), r.f32.numel(), DType::kFloat32, r.slot, nullptr, r.stream);
  });
}

void BM_StatsKernelBf16(benchmark::State& state) {
  run_kernel_case(state, kKernelBytes, [](KernelRig& r) {
    sentinel::cuda::reduce_into_slot(r.bf16.data_ptr(), r.bf16.numel(), DType::kBFloat16, r.slot, nullptr, r.stream);
  });
}

void BM_StatsKernelWithProbe(benchmark::State& state) {
  run_kernel_case(state, kKernelBytes, [](KernelRig& r) {
    sentinel::cuda::reduce_into_slot(r.bf16.data_ptr(), r.bf16.numel(), DType::kBFloat16, r.slot, &r.probe, r.stream);
  });
}

// The ceiling: a copy reads and writes every byte, so it moves twice the bytes of a reduction.
void BM_DeviceCopy(benchmark::State& state) {
  run_kernel_case(state, 2 * kKernelBytes, [](KernelRig& r) {
    cuda_check(cudaMemcpyAsync(r.copy_dst, r.f32.data_ptr(), kKernelBytes, cudaMemcpyDeviceToDevice, r.stream),
               "cudaMemcpyAsync");
  });
}

// A recipe's kernel on the bfloat16 tensor as a [rows, 4096] operand of aten::linear: argument 0
// (an activation, blocks along rows) or 1 (a weight: tiles for NVFP4 and Float8Block).
void run_recipe_case(benchmark::State& state, sentinel::fp8::ScalingRecipe recipe, sentinel::fp8::Role role) {
  if (skip_without_gpu(state)) return;
  auto& rig = kernel_rig();
  const std::vector<int64_t> sizes = {rig.bf16.numel() / 4096, 4096}, strides = {4096, 1};
  const auto job = sentinel::recipes::recipe_job(recipe, sentinel::Fp8Options(), role, "aten::linear",
                                                 role == sentinel::fp8::Role::Weight ? 1 : 0, 2);
  const auto launch = sentinel::cuda::make_recipe_launch(job, sizes.data(), strides.data(), 2, /*dense=*/true);
  run_kernel_case(state, kKernelBytes, [&](KernelRig& r) {
    sentinel::cuda::launch_recipe(r.bf16.data_ptr(), DType::kBFloat16, launch, r.amax, r.record, r.stream);
  });
}

void BM_RecipeKernel(benchmark::State& state) {
  const auto recipe = static_cast<sentinel::fp8::ScalingRecipe>(state.range(0));
  state.SetLabel(sentinel::fp8::recipe_name(recipe));
  run_recipe_case(state, recipe, sentinel::fp8::Role::Activation);
}

void BM_RecipeKernelWeightTiles(benchmark::State& state) {
  const auto recipe = static_cast<sentinel::fp8::ScalingRecipe>(state.range(0));
  state.SetLabel(sentinel::fp8::recipe_name(recipe));
  run_recipe_case(state, recipe, sentinel::fp8::Role::Weight);
}

// ---------------------------------------------------------------------------------------------
// GPT-2 training step

void BM_Gpt2StepUnwatched(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  try {
    Gpt2Rig rig;
    warm_up([&] { rig.step(); });
    time_steps(state, [&] { rig.step(); });
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

sentinel::Fp8Options all_recipes() {
  using sentinel::fp8::ScalingRecipe;
  return sentinel::Fp8Options().enabled(true).recipes(
      {ScalingRecipe::Delayed, ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4, ScalingRecipe::Float8Block});
}

void run_watched_steps(benchmark::State& state, const sentinel::Fp8Options& fp8,
                       void (*step)(Gpt2Rig&, sentinel::Watchdog&) = watched_gpt2_step) {
  if (skip_without_gpu(state)) return;
  try {
    Gpt2Rig rig;
    std::ostringstream out;  // a report, if any, is kept here; the watchdog would throw anyway
    sentinel::Watchdog watch(rig.model.ptr(), sentinel::Options().output(out).fp8(fp8));
    auto watched_step = [&] { step(rig, watch); };
    // Warm-up steps run watched too (the device ring is made then), so count from here.
    warm_up(watched_step);
    const sentinel::DeviceCounters before = watch.device_counters();
    time_steps(state, watched_step);
    const sentinel::DeviceCounters after = watch.device_counters();
    state.counters["readbacks_per_step"] = per_step(after.readbacks - before.readbacks, state);
    state.counters["deferred_frames_per_step"] = per_step(after.frames_deferred - before.frames_deferred, state);
    // Zero here would mean the tensors were read on the host, not by the kernels.
    state.counters["device_tensors_per_step"] =
        per_step(after.tensors_read_on_device - before.tensors_read_on_device, state);
    // Reads served by an earlier read of the same unchanged memory: no kernel launched for them.
    state.counters["device_reads_reused_per_step"] =
        per_step(after.device_reads_reused - before.device_reads_reused, state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void BM_Gpt2StepWatched(benchmark::State& state) { run_watched_steps(state, sentinel::Fp8Options()); }
void BM_Gpt2StepWatchedCheckedAtEnd(benchmark::State& state) {
  run_watched_steps(state, sentinel::Fp8Options(), watched_gpt2_step_checked_at_end);
}

// The watched step with every CUDA tensor handed to a device that does no work: the watchdog's
// host work alone, no kernel launched. Against Unwatched and Watched, it splits the watched step's
// cost between the host's per-op work and the reads (their launches and kernels).
void BM_Gpt2StepWatchedHostOnly(benchmark::State& state) {
  sentinel::device::set_device_factory_for_testing(bench::no_work_cuda_device);
  run_watched_steps(state, sentinel::Fp8Options());
  sentinel::device::set_device_factory_for_testing(nullptr);
}

void BM_Gpt2StepWatchedFp8Delayed(benchmark::State& state) {
  run_watched_steps(state, sentinel::Fp8Options().enabled(true));
}

void BM_Gpt2StepWatchedAllRecipes(benchmark::State& state) { run_watched_steps(state, all_recipes()); }

// The CUDA device, for bench::counting_device (sentinel::device::DeviceFactory's signature).
std::unique_ptr<sentinel::device::StatsDevice> cuda_device(int64_t capacity) {
  return sentinel::device::make_cuda_device(capacity);
}
constexpr sentinel::device::DeviceFactory counting_cuda_device = bench::counting_device<cuda_device>;

// One step of each kind under PyTorch's profiler, after the warm-up: the GPU's span, busy time,
// summed activity and the sentinel kernels' share, per kind, as counters; for the watched step,
// also the bytes its sentinel kernels read and their bandwidth over their summed durations (to
// set against DeviceCopy's); and the process's CPU time per step of each kind, unprofiled.
void BM_Gpt2StepProfile(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  try {
    Gpt2Rig rig;
    std::ostringstream out;
    auto record = [&](const std::string& kind, const bench::StepProfile& p) {
      state.counters[kind + "_span_ms"] = p.span_ms;
      state.counters[kind + "_busy_ms"] = p.busy_ms;
      state.counters[kind + "_device_ms"] = p.device_ms;
      state.counters[kind + "_sentinel_ms"] = p.sentinel_ms;
      state.counters[kind + "_sentinel_kernels"] = static_cast<double>(p.sentinel_kernels);
    };
    struct Kind {
      const char* name;
      sentinel::Fp8Options fp8;
      sentinel::device::DeviceFactory device;
    };
    const Kind kinds[] = {{"watched", sentinel::Fp8Options(), counting_cuda_device},
                          {"hostonly", sentinel::Fp8Options(), bench::no_work_cuda_device},
                          {"recipes", all_recipes(), nullptr}};
    // SENTINEL_TRACE_DIR, when set, gets each kind's step as a Chrome trace, <kind>.json.
    const char* trace_dir = std::getenv("SENTINEL_TRACE_DIR");
    auto trace_path = [&](const std::string& kind) { return trace_dir ? std::string(trace_dir) + "/" + kind + ".json" : ""; };
    for (auto _ : state) {
      for (int i = 0; i < kWarmUpSteps; ++i) rig.step();
      record("unwatched", bench::profile_step([&] { rig.step(); }, trace_path("unwatched")));
      for (const Kind& kind : kinds) {
        sentinel::device::set_device_factory_for_testing(kind.device);
        sentinel::Watchdog watch(rig.model.ptr(), sentinel::Options().output(out).fp8(kind.fp8));
        for (int i = 0; i < kWarmUpSteps; ++i) watched_gpt2_step(rig, watch);
        torch::cuda::synchronize();
        const int64_t bytes_before = bench::counted_reads.span_bytes;
        const bench::StepProfile p = bench::profile_step([&] { watched_gpt2_step(rig, watch); }, trace_path(kind.name));
        record(kind.name, p);
        if (kind.device == counting_cuda_device && p.sentinel_ms > 0) {
          const auto bytes = static_cast<double>(bench::counted_reads.span_bytes - bytes_before);
          state.counters["watched_read_GB"] = bytes / 1e9;
          state.counters["watched_read_TBps"] = bytes / 1e9 / p.sentinel_ms;
        }
        sentinel::device::set_device_factory_for_testing(nullptr);
      }
    }
  } catch (const std::exception& e) {
    sentinel::device::set_device_factory_for_testing(nullptr);
    state.SkipWithError(e.what());
  }
}

void BM_Gpt2StepHfStyle(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  try {
    Gpt2Rig rig;
    int64_t host_syncs = 0;
    double sink = 0;
    // One tensor as HF's analyse_variable sees it: |x|'s min and max formatted into the frame,
    // then detect_overflow's isnan().any() and isinf().any(), each a read-back.
    auto hf_stats = [&](const torch::Tensor& t) {
      auto a = t.abs();
      sink += a.min().item<double>() + a.max().item<double>();
      sink += static_cast<double>(torch::isnan(t).any().item<bool>()) +
              static_cast<double>(torch::isinf(t).any().item<bool>());
      host_syncs += 4;
    };
    bench::Gpt2Hook hook = [&](const std::string&, torch::nn::Module& m, const torch::Tensor& in,
                               const torch::Tensor& out) {
      torch::NoGradGuard no_grad;  // the checks are not part of the graph to differentiate
      for (const auto& p : m.named_parameters(/*recurse=*/false)) hf_stats(p.value());
      hf_stats(in);
      hf_stats(out);
    };
    rig.model->set_hook(&hook);
    for (int i = 0; i < kWarmUpSteps; ++i) rig.step();
    torch::cuda::synchronize();
    host_syncs = 0;
    for (auto _ : state) {
      rig.step();
      torch::cuda::synchronize();
    }
    rig.model->set_hook(nullptr);
    benchmark::DoNotOptimize(sink);
    state.counters["host_syncs_per_step"] = per_step(host_syncs, state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Kernel cases: manual (event) time. Step cases: a fixed count of steps after the warm-up inside
// each case, wall clock, since the host waits on the GPU and CPU time would miss that.
BENCHMARK(BM_StatsKernel)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StatsKernelBf16)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StatsKernelWithProbe)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DeviceCopy)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepUnwatched)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RecipeKernel)
    ->Arg(static_cast<int>(sentinel::fp8::ScalingRecipe::Current))
    ->Arg(static_cast<int>(sentinel::fp8::ScalingRecipe::MXFP8))
    ->Arg(static_cast<int>(sentinel::fp8::ScalingRecipe::NVFP4))
    ->Arg(static_cast<int>(sentinel::fp8::ScalingRecipe::Float8Block))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RecipeKernelWeightTiles)
    ->Arg(static_cast<int>(sentinel::fp8::ScalingRecipe::NVFP4))
    ->Arg(static_cast<int>(sentinel::fp8::ScalingRecipe::Float8Block))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepWatched)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepWatchedCheckedAtEnd)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepWatchedHostOnly)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepWatchedFp8Delayed)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepWatchedAllRecipes)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepHfStyle)->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt2StepProfile)->Iterations(1)->Repetitions(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

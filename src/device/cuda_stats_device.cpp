// The CUDA device: each tensor is reduced by one kernel launch on its current stream into a slot
// of a per-GPU ring (cuda/), and a range of slots is copied back to pinned memory with one wait.
// The recipes beside delayed scaling are one more launch each, into records of the slot
// (cuda/recipe_device.h), copied back with it.
// Slots are zeroed once when the ring is made and again after each read-back, so a launch needs
// no reset of its own. Built only where LibTorch has CUDA; elsewhere compiled for its syntax.
#include <ATen/core/Tensor.h>
#include "capture/op_call.h"
#include "stats/read_only_data.h"
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <sentinel/errors.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_stats.h"
#include "cuda/recipe_device.h"
#include "device/dense_span.h"
#include "device/stats_device.h"

namespace sentinel {
namespace device {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("sentinel: CUDA ") + what + " failed: " + cudaGetErrorString(status));
  }
}

bool kernel_dtype(c10::ScalarType t, cuda::DType& out) {
  switch (t) {
    case c10::ScalarType::Float: out = cuda::DType::kFloat32; return true;
    case c10::ScalarType::Half: out = cuda::DType::kFloat16; return true;
    case c10::ScalarType::BFloat16: out = cuda::DType::kBFloat16; return true;
#if __has_include(<c10/util/Float8_e4m3fn.h>)
    case c10::ScalarType::Float8_e4m3fn: out = cuda::DType::kFloat8E4M3; return true;
    case c10::ScalarType::Float8_e5m2: out = cuda::DType::kFloat8E5M2; return true;
#endif
    default: return false;
  }
}

// A dense tensor (LibTorch's cached flag) is its own span; only other views are walked.
c10::optional<DenseSpan> span_of(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return DenseSpan{t.numel(), 1};
  return dense_span(t.sizes(), t.strides());
}

// One GPU's ring, and the streams that launched into it since its slots were last zeroed: they
// must see that zeroing (made on the read-back stream) before their next launch.
struct GpuRing {
  std::unique_ptr<cuda::DeviceRing> ring;
  std::unique_ptr<cuda::RecipeRecordPool> records;  // of the slots whose tensors run recipes
  cudaEvent_t zeroed = nullptr;
  cudaStream_t zeroed_on = nullptr;
  std::vector<cudaStream_t> launch_streams;  // since the last read-back
  std::vector<cudaStream_t> waited;          // have waited for `zeroed`
  bool used = false;
};

class CudaStatsDevice final : public StatsDevice {
 public:
  CudaStatsDevice(int64_t capacity, int devices)
      : capacity_(capacity),
        gpus_(devices),
        owner_(capacity, -1),
        probe_scale_(capacity, 0.0f),
        repeats_(capacity, 1),
        recipe_first_(capacity, -1),
        recipe_count_(capacity, 0),
        results_(capacity) {}
  ~CudaStatsDevice() override {
    for (auto& g : gpus_) {
      if (g.zeroed) cudaEventDestroy(g.zeroed);
    }
  }

  bool owns(const at::Tensor& t) const override { return t.defined() && t.is_cuda(); }
  bool replays_recipes() const override { return true; }

  stats::Readability readability(const at::Tensor& t) const override {
    const auto r = stats::compute_readability(t);
    if (r != stats::Readability::NotOnCpu) return r;  // undefined, sparse, meta, ...
    if (t.numel() == 0) return stats::Readability::Empty;
    if (!t.has_storage()) return stats::Readability::NoStorage;
    if (stats::read_only_data(t) == nullptr) return stats::Readability::NoData;
    cuda::DType d;
    if (!kernel_dtype(t.scalar_type(), d)) return stats::Readability::DeviceDtype;
    if (!span_of(t)) return stats::Readability::DeviceStrided;
    return stats::Readability::Read;
  }

  bool capturing() const override {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream(), &status);
    return status != cudaStreamCaptureStatusNone;
  }

  void enqueue(const at::Tensor& t, int64_t slot, const Request& request) override {
    const c10::DeviceIndex index = t.device().index();
    c10::cuda::CUDAGuard on_device(index);
    GpuRing& g = gpu(index);
    const cudaStream_t stream = launch_stream(g, index);
    cuda::DType dtype = cuda::DType::kFloat32;
    if (!kernel_dtype(t.scalar_type(), dtype)) {
      throw Error(std::string("sentinel: no device reduction for dtype ") + c10::toString(t.scalar_type()));
    }
    const auto span = span_of(t);
    if (!span) throw Error("sentinel: a strided view with gaps has no dense span to read on the device");
    // [data_ptr, data_ptr + numel) holds exactly the span's elements. A slot that several tensors
    // add to has one scale for all: an expanded one among them is read as a dense copy (made on
    // this stream, where the allocator keeps it until the kernel is done with it).
    const size_t i = static_cast<size_t>(slot % capacity_);
    const int64_t records = recipe_records(g, t, i, request, dtype);
    unsigned int* amax = records >= 0 ? g.records->amax_word(stream) : nullptr;
    if (amax) g.records->reset_amax_async(amax, stream);
    if (holding_ && records < 0 && !request.probe && !(request.shared_slot && span->repeats > 1)) {
      held_.push_back(Held{t, index, stream, dtype, request.headroom,
                           cuda::TensorSpan{t.data_ptr(), span->numel, g.ring->device_slot(slot)}});
      repeats_[i] = span->repeats;  // 1 in a shared slot
    } else if (request.shared_slot && span->repeats > 1) {
      capture::NotRecorded not_recorded;  // profilers see the model's ops only
      const at::Tensor dense = t.contiguous();
      cuda::reduce_into_slot(dense.data_ptr(), dense.numel(), dtype, g.ring->device_slot(slot), request.probe,
                             stream, request.headroom, /*reset_slot=*/false, amax);
    } else {
      cuda::reduce_into_slot(t.data_ptr(), span->numel, dtype, g.ring->device_slot(slot), request.probe, stream,
                             request.headroom, /*reset_slot=*/false, amax);
      repeats_[i] = span->repeats;  // 1 in a shared slot
    }
    if (amax) launch_recipes(g, t, dtype, amax, records, stream);
    owner_[i] = index;
    probe_scale_[i] = request.probe ? request.probe_scale : 0.0f;
    g.used = true;
  }

  void hold_launches() override { holding_ = true; }

  // The held reductions, one launch per GPU, stream, dtype and headroom flag (per 96 tensors).
  void release_launches() override {
    holding_ = false;
    if (held_.empty()) return;
    std::vector<Held> held;
    held.swap(held_);
    std::vector<bool> done(held.size(), false);
    for (size_t i = 0; i < held.size(); ++i) {
      if (done[i]) continue;
      const Held& a = held[i];
      spans_.clear();
      for (size_t j = i; j < held.size(); ++j) {
        const Held& b = held[j];
        const bool same_launch =
            b.device == a.device && b.stream == a.stream && b.dtype == a.dtype && b.headroom == a.headroom;
        if (done[j] || !same_launch) continue;
        spans_.push_back(b.span);
        done[j] = true;
      }
      c10::cuda::CUDAGuard on_device(a.device);
      cuda::reduce_many_into_slots(spans_.data(), static_cast<int64_t>(spans_.size()), a.dtype, a.stream, a.headroom);
    }
    held.clear();
    held_.swap(held);  // keeps its capacity
  }

  void read_back(int64_t first, int64_t end) override {
    release_launches();  // none should be held here; if any are, they belong to this read-back
    if (end - first > capacity_) {
      throw Error("sentinel: " + std::to_string(end - first) + " slots to read back from a ring of " +
                  std::to_string(capacity_));
    }
    for (int64_t s = first; s < end; ++s) results_[static_cast<size_t>(s % capacity_)] = SlotResult{};
    bool waited = false;
    for (size_t d = 0; d < gpus_.size(); ++d) {
      GpuRing& g = gpus_[d];
      if (!g.used || end <= first) continue;
      const auto index = static_cast<c10::DeviceIndex>(d);
      c10::cuda::CUDAGuard on_device(index);
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index).stream();
      // Kernels launched on other streams are ordered before the copy by events, not by waiting.
      for (cudaStream_t other : g.launch_streams) {
        if (other == stream) continue;
        cudaEvent_t done = nullptr;
        check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "creation of an ordering event");
        check(cudaEventRecord(done, other), "record of an ordering event");
        check(cudaStreamWaitEvent(stream, done, 0), "wait for another stream's statistics");
        cudaEventDestroy(done);
      }
      // Every slot in flight is read back at once (DeferredFrames), so every record taken is.
      if (g.records && g.records->used() > 0) g.records->copy_back_and_reset_async(stream);
      g.ring->copy_back_async(first, end - first, stream);
      g.ring->reset_async(first, end - first, stream);
      if (!g.zeroed) check(cudaEventCreateWithFlags(&g.zeroed, cudaEventDisableTiming), "creation of the ring event");
      check(cudaEventRecord(g.zeroed, stream), "record of the ring event");
      g.zeroed_on = stream;
      g.waited.clear();
      for (int64_t s = first; s < end; ++s) {
        const size_t i = static_cast<size_t>(s % capacity_);
        if (owner_[i] != index) continue;
        const cuda::DeviceSlot& raw = g.ring->wait_and_read(s);
        SlotResult& r = results_[i];
        r.stats = cuda::decode_stats(raw);
        r.headroom = cuda::decode_headroom(raw);
        if (probe_scale_[i] != 0.0f) r.probe = cuda::decode_probe(raw, probe_scale_[i]);
        scale_by_repeats(r, repeats_[i]);
        for (int j = 0; j < recipe_count_[i]; ++j) r.recipes.push_back(cuda::decode_recipe(g.records->host_record(recipe_first_[i] + j)));
        repeats_[i] = 1;
        owner_[i] = -1;
      }
      g.launch_streams.clear();
      g.used = false;
      waited = true;
    }
    // Every record was copied back and zeroed: no slot of the range holds one now, whether or not
    // its enqueue got as far as launching.
    for (int64_t s = first; s < end; ++s) {
      recipe_first_[static_cast<size_t>(s % capacity_)] = -1;
      recipe_count_[static_cast<size_t>(s % capacity_)] = 0;
    }
    synchronisations_ += waited;
  }

  SlotResult result(int64_t slot) const override {
    return results_[static_cast<size_t>(slot % capacity_)];
  }
  int64_t capacity() const override { return capacity_; }
  int64_t synchronisations() const override { return synchronisations_; }

 private:
  // The first of the slot's records for the request's recipes (those it already has when it adds
  // to a slot), or -1 when the tensor runs none: no recipes asked, a dtype they do not take, or no
  // record to be had during a graph capture (said once).
  int64_t recipe_records(GpuRing& g, const at::Tensor& t, size_t i, const Request& request, cuda::DType dtype) {
    if (!request.recipes || request.recipes->empty()) return -1;
    if (dtype != cuda::DType::kFloat32 && dtype != cuda::DType::kFloat16 && dtype != cuda::DType::kBFloat16) return -1;
    // Made before any launch: one that cannot be made throws, and the watchdog skips the tensor.
    launches_.clear();
    for (const recipes::RecipeJob& job : *request.recipes) {
      launches_.push_back(cuda::make_recipe_launch(job, t.sizes().data(), t.strides().data(), static_cast<int>(t.dim()),
                                                   t.is_non_overlapping_and_dense()));
    }
    const int n = static_cast<int>(request.recipes->size());
    if (request.accumulate && recipe_first_[i] >= 0 && recipe_count_[i] >= n) return recipe_first_[i];
    if (!g.records) g.records = std::make_unique<cuda::RecipeRecordPool>(t.device().index());
    const int64_t first = g.records->take(n, !capturing());
    if (first < 0) {
      if (!warned_capture_records_) {
        warned_capture_records_ = true;
        TORCH_WARN("sentinel: some tensors of a CUDA graph get no fp8 recipe replay: its capture needed more "
                   "recipe records than the watched steps before it had allocated (none can be allocated while "
                   "a graph is captured)");
      }
      return -1;
    }
    recipe_first_[i] = first;
    recipe_count_[i] = n;
    return first;
  }

  // The launches recipe_records made, into the records from `first`.
  void launch_recipes(GpuRing& g, const at::Tensor& t, cuda::DType dtype, const unsigned int* amax, int64_t first,
                      cudaStream_t stream) {
    for (size_t j = 0; j < launches_.size(); ++j) {
      cuda::launch_recipe(t.data_ptr(), dtype, launches_[j], amax, g.records->device_record(first + static_cast<int64_t>(j)),
                          stream);
    }
  }

  // The current stream of GPU `index`, noted among those that launch into its ring, made to wait
  // for the ring's last zeroing if it ran elsewhere.
  cudaStream_t launch_stream(GpuRing& g, c10::DeviceIndex index) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index).stream();
    if (std::find(g.launch_streams.begin(), g.launch_streams.end(), stream) == g.launch_streams.end()) {
      g.launch_streams.push_back(stream);
    }
    if (g.zeroed && stream != g.zeroed_on && std::find(g.waited.begin(), g.waited.end(), stream) == g.waited.end()) {
      check(cudaStreamWaitEvent(stream, g.zeroed, 0), "wait for the zeroed result ring");
      g.waited.push_back(stream);
    }
    return stream;
  }

  GpuRing& gpu(c10::DeviceIndex index) {
    if (index < 0 || static_cast<size_t>(index) >= gpus_.size()) {
      throw Error("sentinel: CUDA device " + std::to_string(index) + " is not among the " +
                  std::to_string(gpus_.size()) + " devices seen when the watchdog was made");
    }
    GpuRing& g = gpus_[static_cast<size_t>(index)];
    if (!g.ring) g.ring = std::make_unique<cuda::DeviceRing>(capacity_, index);  // once per GPU
    return g;
  }

  int64_t capacity_;
  std::vector<GpuRing> gpus_;
  std::vector<int> owner_;          // the GPU whose ring holds a slot, -1 when none
  std::vector<float> probe_scale_;  // the FP8 scale of a probed slot, 0 when not probed
  std::vector<int64_t> repeats_;    // elements of the view per element read (expanded views)
  std::vector<int64_t> recipe_first_;  // the slot's first recipe record, -1 when none
  std::vector<int> recipe_count_;      // and how many it has, one per job
  std::vector<SlotResult> results_;  // of the last read-back, by slot (allocated once)
  std::vector<cuda::RecipeLaunch> launches_;  // the tensor's being enqueued
  // Reductions held between hold_launches() and release_launches(), with their tensors: the
  // memory read stays theirs until the launch is queued.
  struct Held {
    at::Tensor tensor;
    c10::DeviceIndex device;
    cudaStream_t stream;
    cuda::DType dtype;
    bool headroom;
    cuda::TensorSpan span;
  };
  bool holding_ = false;
  std::vector<Held> held_;
  std::vector<cuda::TensorSpan> spans_;  // one launch's, of the held
  bool warned_capture_records_ = false;
  int64_t synchronisations_ = 0;
};

}  // namespace

std::unique_ptr<StatsDevice> make_cuda_device(int64_t capacity, std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why) *why = status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device";
    cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaStatsDevice>(capacity, count);
}

}  // namespace device
}  // namespace sentinel

// The layers above the kernel: reduce_into_slot (validating entry) -> launch_reduce (grid and
// stream) -> kernel::reduce_kernel. Nothing here allocates or synchronises.
#include <cuda_runtime.h>

#include <sentinel/errors.h>

#include <atomic>
#include <string>

#include "cuda/device_stats.h"
#include "cuda/stats_kernel.cuh"

namespace sentinel {
namespace cuda {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("sentinel: CUDA ") + what + " failed: " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")");
  }
}

// The multiprocessor count is read once per device.
int max_blocks(int device) {
  constexpr int kDevices = 64;
  static std::atomic<int> sm_count[kDevices];
  int count = device >= 0 && device < kDevices ? sm_count[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "query of the multiprocessor count");
    if (device >= 0 && device < kDevices) sm_count[device].store(count, std::memory_order_relaxed);
  }
  return count * 8;
}

namespace {

template <typename Load, int kExtras>
void launch_with(const typename Load::storage* data, int64_t numel, float min_normal, const stats::Fp8ProbeParams* probe,
                 DeviceSlot* slot, unsigned int* tensor_amax_bits, int blocks, cudaStream_t stream) {
  kernel::reduce_kernel<Load, kExtras><<<blocks, kernel::kThreads, 0, stream>>>(
      data, numel, min_normal, probe ? *probe : stats::Fp8ProbeParams{}, slot, tensor_amax_bits);
}

template <typename Load>
void launch_reduce(const void* data, int64_t numel, float min_normal, const stats::Fp8ProbeParams* probe,
                   bool headroom, DeviceSlot* slot, unsigned int* tensor_amax_bits, cudaStream_t stream) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "query of the current device");
  // Elements a block takes per pass: kUnroll 16-byte loads per thread.
  constexpr int64_t kPerBlock = int64_t{kernel::kThreads} * kernel::kUnroll * (16 / sizeof(typename Load::storage));
  const int64_t wanted = (numel + kPerBlock - 1) / kPerBlock;
  const int blocks = static_cast<int>(wanted < max_blocks(device) ? wanted : max_blocks(device));
  const auto* typed = static_cast<const typename Load::storage*>(data);
  using namespace kernel;
  if (probe && headroom) launch_with<Load, kProbe | kHeadroom>(typed, numel, min_normal, probe, slot, tensor_amax_bits, blocks, stream);
  else if (probe) launch_with<Load, kProbe>(typed, numel, min_normal, probe, slot, tensor_amax_bits, blocks, stream);
  else if (headroom) launch_with<Load, kHeadroom>(typed, numel, min_normal, probe, slot, tensor_amax_bits, blocks, stream);
  else launch_with<Load, kNone>(typed, numel, min_normal, probe, slot, tensor_amax_bits, blocks, stream);
  check_cuda(cudaGetLastError(), "launch of the statistics kernel");
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
  }
  return "unknown";
}

int dtype_size(DType d) {
  switch (d) {
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    default: return 1;
  }
}

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    if (why) *why = status != cudaSuccess ? std::string(cudaGetErrorString(status)) : "no CUDA device";
    cudaGetLastError();  // resets the runtime's last error, so later calls start clean
    return false;
  }
  return true;
}

void reset_slots(DeviceSlot* first, int64_t count, void* stream) {
  check_cuda(cudaMemsetAsync(first, 0, sizeof(DeviceSlot) * count, static_cast<cudaStream_t>(stream)),
        "reset of result slots");
}

void reduce_into_slot(const void* data, int64_t numel, DType dtype, DeviceSlot* slot,
                      const stats::Fp8ProbeParams* probe, void* stream, bool headroom, bool reset_slot,
                      unsigned int* tensor_amax_bits) {
  if (!slot) throw InputError("sentinel: reduce_into_slot needs a result slot, got a null pointer");
  if (numel < 0) throw InputError("sentinel: reduce_into_slot needs numel >= 0, got " + std::to_string(numel));
  if (numel > 0 && !data) throw InputError("sentinel: reduce_into_slot got a null data pointer for " +
                                           std::to_string(numel) + " elements");
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) != 0) {
    throw InputError(std::string("sentinel: reduce_into_slot got a ") + dtype_name(dtype) +
                     " pointer not aligned to its element size");
  }
  if (probe && dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    throw InputError(std::string("sentinel: the FP8 probe takes float32, float16 or bfloat16 tensors, got ") +
                     dtype_name(dtype));
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (reset_slot) check_cuda(cudaMemsetAsync(slot, 0, sizeof(DeviceSlot), s), "reset of a result slot");
  if (numel == 0) return;
  switch (dtype) {
    case DType::kFloat32: launch_reduce<kernel::Float32>(data, numel, 1.17549435e-38f, probe, headroom, slot, tensor_amax_bits, s); break;
    case DType::kFloat16: launch_reduce<kernel::Float16>(data, numel, 6.103515625e-05f, probe, headroom, slot, tensor_amax_bits, s); break;
    case DType::kBFloat16: launch_reduce<kernel::BFloat16>(data, numel, 1.17549435e-38f, probe, headroom, slot, tensor_amax_bits, s); break;
    case DType::kFloat8E4M3:
      launch_reduce<kernel::Float8<fp8::Format::E4M3>>(data, numel, fp8::min_normal(fp8::Format::E4M3), nullptr, headroom, slot, tensor_amax_bits, s);
      break;
    case DType::kFloat8E5M2:
      launch_reduce<kernel::Float8<fp8::Format::E5M2>>(data, numel, fp8::min_normal(fp8::Format::E5M2), nullptr, headroom, slot, tensor_amax_bits, s);
      break;
  }
}

namespace {

template <typename Load>
void launch_many(const TensorSpan* spans, int64_t count, float min_normal, bool headroom, cudaStream_t stream) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "query of the current device");
  constexpr int64_t kPerBlock = int64_t{kernel::kThreads} * kernel::kUnroll * (16 / sizeof(typename Load::storage));
  kernel::SpanBatch batch{};
  auto launch = [&] {
    if (batch.count == 0) return;
    const int blocks = batch.first_block[batch.count];
    using kernel::reduce_many_kernel;
    if (headroom) reduce_many_kernel<Load, kernel::kHeadroom><<<blocks, kernel::kThreads, 0, stream>>>(batch, min_normal);
    else reduce_many_kernel<Load, kernel::kNone><<<blocks, kernel::kThreads, 0, stream>>>(batch, min_normal);
    check_cuda(cudaGetLastError(), "launch of the statistics kernel over several tensors");
    batch.count = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    if (spans[i].numel == 0) continue;
    const int64_t wanted = (spans[i].numel + kPerBlock - 1) / kPerBlock;
    const int blocks = static_cast<int>(wanted < max_blocks(device) ? wanted : max_blocks(device));
    if (batch.count == kernel::kMaxSpansPerLaunch || batch.first_block[batch.count] > (1 << 30)) launch();
    const int k = batch.count++;
    batch.data[k] = spans[i].data;
    batch.numel[k] = spans[i].numel;
    batch.slot[k] = spans[i].slot;
    batch.first_block[k + 1] = batch.first_block[k] + blocks;
  }
  launch();
}

}  // namespace

void reduce_many_into_slots(const TensorSpan* spans, int64_t count, DType dtype, void* stream, bool headroom) {
  if (count < 0) throw InputError("sentinel: reduce_many_into_slots needs count >= 0, got " + std::to_string(count));
  if (count > 0 && !spans) throw InputError("sentinel: reduce_many_into_slots got a null list of tensors");
  for (int64_t i = 0; i < count; ++i) {
    const TensorSpan& s = spans[i];
    const std::string which = "tensor " + std::to_string(i) + " of reduce_many_into_slots";
    if (!s.slot) throw InputError("sentinel: " + which + " has no result slot");
    if (s.numel < 0) throw InputError("sentinel: " + which + " has numel " + std::to_string(s.numel));
    if (s.numel > 0 && !s.data) throw InputError("sentinel: " + which + " has a null data pointer");
    if (reinterpret_cast<uintptr_t>(s.data) % dtype_size(dtype) != 0) {
      throw InputError("sentinel: " + which + " is a " + dtype_name(dtype) + " pointer not aligned to its element size");
    }
  }
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32: launch_many<kernel::Float32>(spans, count, 1.17549435e-38f, headroom, s); break;
    case DType::kFloat16: launch_many<kernel::Float16>(spans, count, 6.103515625e-05f, headroom, s); break;
    case DType::kBFloat16: launch_many<kernel::BFloat16>(spans, count, 1.17549435e-38f, headroom, s); break;
    case DType::kFloat8E4M3:
      launch_many<kernel::Float8<fp8::Format::E4M3>>(spans, count, fp8::min_normal(fp8::Format::E4M3), headroom, s);
      break;
    case DType::kFloat8E5M2:
      launch_many<kernel::Float8<fp8::Format::E5M2>>(spans, count, fp8::min_normal(fp8::Format::E5M2), headroom, s);
      break;
  }
}

DeviceRing::DeviceRing(int64_t capacity, int device) : capacity_(capacity), device_(device) {
  if (capacity <= 0) throw InputError("sentinel: a device ring needs capacity > 0, got " + std::to_string(capacity));
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "query of the current device");
  check_cuda(cudaSetDevice(device), "selection of the ring's device");
  try {
    check_cuda(cudaMalloc(&slots_, sizeof(DeviceSlot) * capacity), "allocation of the result ring");
    check_cuda(cudaMallocHost(&host_, sizeof(DeviceSlot) * capacity), "allocation of the pinned read-back buffer");
    // Zeroed once here; the owner re-zeroes slots after reading them back, so that a launch
    // need not reset its own slot (one kernel per tensor, no memset node).
    check_cuda(cudaMemset(slots_, 0, sizeof(DeviceSlot) * capacity), "reset of the result ring");
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creation of the read-back event");
    event_ = event;
  } catch (...) {
    if (slots_) cudaFree(slots_);
    if (host_) cudaFreeHost(host_);
    cudaSetDevice(previous);
    throw;
  }
  cudaSetDevice(previous);
}

DeviceRing::~DeviceRing() {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  cudaFreeHost(host_);
  cudaFree(slots_);
  cudaSetDevice(previous);
}

DeviceSlot* DeviceRing::device_slot(int64_t index) const { return slots_ + index % capacity_; }

void DeviceRing::copy_back_async(int64_t first, int64_t count, void* stream) {
  if (count > capacity_) {
    throw InputError("sentinel: cannot read back " + std::to_string(count) + " slots from a ring of " +
                     std::to_string(capacity_));
  }
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t start = first % capacity_;
  const int64_t head = count < capacity_ - start ? count : capacity_ - start;  // up to the ring's end
  check_cuda(cudaMemcpyAsync(host_ + start, slots_ + start, sizeof(DeviceSlot) * head, cudaMemcpyDeviceToHost, s),
        "read-back of the result ring");
  if (count > head) {
    check_cuda(cudaMemcpyAsync(host_, slots_, sizeof(DeviceSlot) * (count - head), cudaMemcpyDeviceToHost, s),
          "read-back of the result ring");
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_), s), "record of the read-back event");
  pending_ = true;
}

void DeviceRing::reset_async(int64_t first, int64_t count, void* stream) {
  const int64_t start = first % capacity_;
  const int64_t head = count < capacity_ - start ? count : capacity_ - start;
  if (head > 0) reset_slots(slots_ + start, head, stream);
  if (count > head) reset_slots(slots_, count - head, stream);
}

const DeviceSlot& DeviceRing::wait_and_read(int64_t index) {
  if (pending_) {
    check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "wait for the result read-back");
    pending_ = false;
  }
  return host_[index % capacity_];
}

}  // namespace cuda
}  // namespace sentinel

#pragma once
// Statistics on the GPU: the statistics pass and the FP8 probe as one CUDA reduction that
// writes its result into a slot of a device-side ring. Host API: no CUDA headers here (a stream
// is passed as void*, a cudaStream_t), so plain C++ files and tests can include it.
#include <sentinel/stats.h>

#include <cstdint>
#include <string>

#include "fp8/fp8_probe_result.h"
#include "fp8/fp8_probe_math.h"

namespace sentinel {
namespace cuda {

enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat8E4M3, kFloat8E5M2 };
const char* dtype_name(DType d);
int dtype_size(DType d);

// One result as the kernel leaves it in device memory. All-zero bytes mean "nothing reduced",
// so a slot is reset by a memset node (legal under CUDA graph capture). Magnitudes are kept as
// float bits, which order as unsigned integers for non-negative floats: the maximum by
// atomicMax, the minimum by atomicMax on the complemented bits (zero then means +inf).
struct DeviceSlot {
  unsigned long long count, nan, pos_inf, neg_inf, zeros, subnormal;
  unsigned int abs_max_bits, abs_min_complement;
  unsigned long long probe_count, overflow, underflow;
  double sum_sq_error, sum_a_q, sum_q_sq;  // scaled domain, as Fp8ProbeAccumulator
  unsigned long long fp16_overflow, fp16_underflow, bf16_overflow, bf16_underflow;  // headroom
};

// Host side: a slot as the CPU pass reports it.
TensorStats decode_stats(const DeviceSlot& slot);
stats::Fp8ProbeResult decode_probe(const DeviceSlot& slot, float scale);
HeadroomCounts decode_headroom(const DeviceSlot& slot);

// Whether kernels can run here; `why` says why not (no driver, no device).
bool device_available(std::string* why = nullptr);

// The validating entry: checks the arguments (throws sentinel::InputError naming what was
// wrong), then resets `slot` (unless `reset_slot` is false: the caller keeps it zeroed, or wants
// this reduction added to what the slot holds) and launches the reduction on `stream`, with no
// allocation and no synchronisation. `probe` (optional) adds the FP8 probe under those
// parameters (float32, float16 and bfloat16 tensors only); `headroom` adds the fp16/bf16
// headroom counts; `tensor_amax_bits` (optional, zeroed before on `stream`) receives this
// tensor's own amax as float bits, apart from the slot's. Launch errors are checked and thrown as
// sentinel::Error.
void reduce_into_slot(const void* data, int64_t numel, DType dtype, DeviceSlot* slot,
                      const stats::Fp8ProbeParams* probe, void* stream, bool headroom = false,
                      bool reset_slot = true, unsigned int* tensor_amax_bits = nullptr);
// One tensor of a reduce_many_into_slots: `numel` elements from `data`, into `slot` (zeroed).
struct TensorSpan {
  const void* data;
  int64_t numel;
  DeviceSlot* slot;
};
// reduce_into_slot for `count` tensors of one dtype at once, each into its own slot, without the
// probe: one launch per 96 tensors (an optimizer's lists of parameters, gradients and moments
// would otherwise be a launch each). Validates every span before launching any.
void reduce_many_into_slots(const TensorSpan* spans, int64_t count, DType dtype, void* stream, bool headroom = false);
// Zeroes `count` slots from `first` on `stream` (one memset node; legal under graph capture).
void reset_slots(DeviceSlot* first, int64_t count, void* stream);

// A fixed ring of result slots in device memory, with a pinned host mirror for read-back.
// Allocates only when made; reading back is one asynchronous copy and one event.
class DeviceRing {
 public:
  DeviceRing(int64_t capacity, int device);
  ~DeviceRing();
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  int64_t capacity() const { return capacity_; }
  DeviceSlot* device_slot(int64_t index) const;  // index modulo capacity
  // Copies slots [first, first + count) (modulo capacity) back on `stream` and records an event.
  void copy_back_async(int64_t first, int64_t count, void* stream);
  // Waits for the last copy-back (the only host synchronisation) and gives its slots.
  const DeviceSlot& wait_and_read(int64_t index);
  // Zeroes slots [first, first + count) (modulo capacity) on `stream`, ready for reuse.
  void reset_async(int64_t first, int64_t count, void* stream);

 private:
  int64_t capacity_;
  int device_;
  DeviceSlot* slots_ = nullptr;  // device memory
  DeviceSlot* host_ = nullptr;   // pinned mirror
  void* event_ = nullptr;
  bool pending_ = false;
};

}  // namespace cuda
}  // namespace sentinel

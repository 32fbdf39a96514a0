#pragma once
// The __global__ reduction: each thread folds its elements into the same accumulators as the
// CPU pass (src/stats/stats_accumulator.h, src/fp8/fp8_probe_math.h), warps and then the
// block combine them, and one thread per block folds the block's result into the slot with
// atomics. Private to cuda/.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/lane_scan.h"
#include "cuda/probe_lanes.h"
#include "cuda/slot_merge.h"

namespace sentinel {
namespace cuda {
// Throws sentinel::Error naming `what` when a CUDA call failed.
void check_cuda(cudaError_t status, const char* what);
// Blocks per launch: enough to fill the device a few times over, no more (each block then
// loops over its share).
int max_blocks(int device);

namespace kernel {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread

// Storage type of each dtype, its widening to float, and the lanes of the kernel's fast path over
// vectors of ordinary numbers (cuda/lane_scan.h; none for the 8-bit types).
struct Float32 {
  using storage = float;
  static __device__ float get(float v) { return v; }
  using Lanes = Float32Lanes;
};
struct Float16 {
  using storage = __half;
  static __device__ float get(__half v) { return __half2float(v); }
  using Lanes = Float16Lanes;
};
struct BFloat16 {
  using storage = __nv_bfloat16;
  static __device__ float get(__nv_bfloat16 v) { return __bfloat162float(v); }
  using Lanes = BFloat16Lanes;
};
template <fp8::Format F>
struct Float8 {
  using storage = uint8_t;
  static __device__ float get(uint8_t v) { return fp8::decode(v, F); }
  using Lanes = void;
};

// A warp's or block's partial result, as plain fields (shared memory holds no constructors).
struct Partial {
  float abs_min, abs_max;
  unsigned int nan, inf, pos_inf, zeros, subnormal;
  unsigned int probe_count, overflow, underflow;
  double sum_sq_error, sum_a_q, sum_q_sq;
  unsigned int h16_over, h16_under, hbf_over, hbf_under;
};

// What a launch computes beyond the statistics.
enum Extras : int { kNone = 0, kProbe = 1, kHeadroom = 2 };

__device__ inline Partial to_partial(const stats::AbsStatsAccumulator<float>& a,
                                     const stats::Fp8ProbeAccumulator<double>& p, const stats::HeadroomAccumulator& h) {
  return Partial{a.abs_min, a.abs_max, a.nan, a.inf, a.pos_inf, a.zeros, a.subnormal,
                 p.count, p.overflow, p.underflow, p.sum_sq_error, p.sum_a_q, p.sum_q_sq,
                 h.fp16_overflow, h.fp16_underflow, h.bf16_overflow, h.bf16_underflow};
}

__device__ inline void from_partial(const Partial& q, stats::AbsStatsAccumulator<float>& a,
                                    stats::Fp8ProbeAccumulator<double>& p, stats::HeadroomAccumulator& h) {
  h.fp16_overflow = q.h16_over;
  h.fp16_underflow = q.h16_under;
  h.bf16_overflow = q.hbf_over;
  h.bf16_underflow = q.hbf_under;
  a.abs_min = q.abs_min;
  a.abs_max = q.abs_max;
  a.nan = q.nan;
  a.inf = q.inf;
  a.pos_inf = q.pos_inf;
  a.zeros = q.zeros;
  a.subnormal = q.subnormal;
  p.count = q.probe_count;
  p.overflow = q.overflow;
  p.underflow = q.underflow;
  p.sum_sq_error = q.sum_sq_error;
  p.sum_a_q = q.sum_a_q;
  p.sum_q_sq = q.sum_q_sq;
}

__device__ inline Partial shuffle_down(const Partial& q, int offset) {
  constexpr unsigned kAll = 0xffffffffu;
  return Partial{__shfl_down_sync(kAll, q.abs_min, offset),     __shfl_down_sync(kAll, q.abs_max, offset),
                 __shfl_down_sync(kAll, q.nan, offset),         __shfl_down_sync(kAll, q.inf, offset),
                 __shfl_down_sync(kAll, q.pos_inf, offset),     __shfl_down_sync(kAll, q.zeros, offset),
                 __shfl_down_sync(kAll, q.subnormal, offset),   __shfl_down_sync(kAll, q.probe_count, offset),
                 __shfl_down_sync(kAll, q.overflow, offset),    __shfl_down_sync(kAll, q.underflow, offset),
                 __shfl_down_sync(kAll, q.sum_sq_error, offset), __shfl_down_sync(kAll, q.sum_a_q, offset),
                 __shfl_down_sync(kAll, q.sum_q_sq, offset),    __shfl_down_sync(kAll, q.h16_over, offset),
                 __shfl_down_sync(kAll, q.h16_under, offset),   __shfl_down_sync(kAll, q.hbf_over, offset),
                 __shfl_down_sync(kAll, q.hbf_under, offset)};
}

// Combines the partials of a warp into lane 0, with the accumulators' own combine().
__device__ inline void warp_combine(stats::AbsStatsAccumulator<float>& a, stats::Fp8ProbeAccumulator<double>& p,
                                    stats::HeadroomAccumulator& h) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const Partial other = shuffle_down(to_partial(a, p, h), offset);
    stats::AbsStatsAccumulator<float> oa(0.0f);
    stats::Fp8ProbeAccumulator<double> op;
    stats::HeadroomAccumulator oh;
    from_partial(other, oa, op, oh);
    a.combine(oa);
    p.combine(op);
    h.combine(oh);
  }
}

// One pass over n elements by `blocks` blocks, this one `block` of them: 16-byte loads where the
// data is aligned, single elements for the rest. The slot was zeroed on the same stream before the
// launch; so was `tensor_amax_bits`, when given (the recipes' launches that follow read it).
template <typename Load, int kExtras>
__device__ __forceinline__ void reduce_blocks(const typename Load::storage* __restrict__ data, int64_t n,
                                              float min_normal, const stats::Fp8ProbeParams& params, DeviceSlot* slot,
                                              unsigned int* tensor_amax_bits, int64_t block, int64_t blocks) {
  using T = typename Load::storage;
  constexpr int kVec = 16 / sizeof(T);
  const float inf = __int_as_float(0x7f800000);
  stats::AbsStatsAccumulator<float> acc(inf);
  stats::Fp8ProbeAccumulator<double> probe;
  stats::HeadroomAccumulator headroom;
  auto visit = [&](float x) {
    acc.reduce(x, inf, min_normal);
    if (kExtras & kProbe) probe.reduce(x, params);
    if (kExtras & kHeadroom) headroom.reduce(fabsf(x), inf);
  };
  const int64_t thread = block * blockDim.x + threadIdx.x;
  const int64_t threads = blocks * blockDim.x;
  const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  const int64_t vectors = aligned ? n / kVec : 0;
  const uint4* vec = reinterpret_cast<const uint4*>(data);
  auto visit_vector = [&](const uint4& raw) {
    const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) visit(Load::get(values[k]));
  };
  // The fast path takes the plain statistics of the 32- and 16-bit floats, and the FP8 probe
  // over them (cuda/probe_lanes.h); the headroom counts need every element anyway.
  constexpr bool kLanes = (kExtras & kHeadroom) == 0 && !std::is_void<typename Load::Lanes>::value;
  using LaneType = std::conditional_t<kLanes, typename Load::Lanes, Float32Lanes>;
  LaneScan<LaneType> lanes;
  ProbeLanes<LaneType> probe_lanes;
  auto take_vector = [&](const uint4& raw) {
    if constexpr (kLanes) {
      uint32_t hi, lo;
      if (lanes.fold(raw.x, raw.y, raw.z, raw.w, hi, lo)) {
        if constexpr ((kExtras & kProbe) != 0) probe_lanes.take({raw.x, raw.y, raw.z, raw.w}, hi, lo, params, probe);
        return;
      }
    }
    visit_vector(raw);
  };
  // kUnroll coalesced loads in flight per thread before the first is used, then one at a time.
  int64_t v = thread;
  for (; v + (kUnroll - 1) * threads < vectors; v += kUnroll * threads) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = __ldg(vec + v + u * threads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) take_vector(raw[u]);
  }
  for (; v < vectors; v += threads) take_vector(__ldg(vec + v));
  for (int64_t i = vectors * kVec + thread; i < n; i += threads) visit(Load::get(data[i]));
  if constexpr (kLanes) {
    lanes.finish(acc);
    if constexpr ((kExtras & kProbe) != 0) probe_lanes.flush(probe);
  }

  warp_combine(acc, probe, headroom);
  __shared__ Partial warps[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = to_partial(acc, probe, headroom);
  __syncthreads();
  if (warp != 0) return;
  if (lane < kWarps) {
    from_partial(warps[lane], acc, probe, headroom);
  } else {
    acc = stats::AbsStatsAccumulator<float>(inf);
    probe = stats::Fp8ProbeAccumulator<double>();
    headroom = stats::HeadroomAccumulator();
  }
  warp_combine(acc, probe, headroom);
  if (lane != 0) return;
  merge_stats<AtomicSlotOps>(*slot, acc);
  if (tensor_amax_bits) atomicMax(tensor_amax_bits, magnitude_bits(acc.abs_max));  // this tensor's alone
  if (kExtras & kProbe) merge_probe<AtomicSlotOps>(*slot, probe);
  if (kExtras & kHeadroom) merge_headroom<AtomicSlotOps>(*slot, headroom);
  if (block == 0) atomicAdd(&slot->count, static_cast<unsigned long long>(n));
}

// One tensor, the whole grid.
template <typename Load, int kExtras>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(const typename Load::storage* __restrict__ data, int64_t n, float min_normal,
                  stats::Fp8ProbeParams params, DeviceSlot* slot, unsigned int* tensor_amax_bits) {
  reduce_blocks<Load, kExtras>(data, n, min_normal, params, slot, tensor_amax_bits, blockIdx.x, gridDim.x);
}

// Several tensors of one dtype in one launch (an op's list of tensors: an optimizer's parameters,
// gradients and moments), each into its own slot: the grid is the tensors' block counts laid end
// to end, and each block finds its tensor among the few in the launch's parameters.
constexpr int kMaxSpansPerLaunch = 96;  // the parameters stay under 4 KiB (2.7 KiB)
struct SpanBatch {
  const void* data[kMaxSpansPerLaunch];
  int64_t numel[kMaxSpansPerLaunch];
  DeviceSlot* slot[kMaxSpansPerLaunch];
  int first_block[kMaxSpansPerLaunch + 1];  // of each span; the last entry is the grid's size
  int count;
};

template <typename Load, int kExtras>
__global__ void __launch_bounds__(kThreads) reduce_many_kernel(const SpanBatch batch, float min_normal) {
  const int block = static_cast<int>(blockIdx.x);
  int i = 0;
  while (i + 1 < batch.count && batch.first_block[i + 1] <= block) ++i;
  reduce_blocks<Load, kExtras>(static_cast<const typename Load::storage*>(batch.data[i]), batch.numel[i], min_normal,
                               stats::Fp8ProbeParams{}, batch.slot[i], nullptr, block - batch.first_block[i],
                               batch.first_block[i + 1] - batch.first_block[i]);
}

}  // namespace kernel
}  // namespace cuda
}  // namespace sentinel

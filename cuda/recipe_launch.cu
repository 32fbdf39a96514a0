// The recipes' kernel (cuda/recipe_device.h), in grid-stride loops over the scaling groups: each
// group's amax and whether it holds an inf or NaN, its scale and tallies (recipes::group_scale,
// the CPU replay's arithmetic), then every element cast with that scale into a CastTally. The
// block then combines its threads' tallies and adds them, and its histogram of scale codes (kept
// in shared memory, where its groups' increments do not contend with other blocks'), into the
// record with atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <sentinel/errors.h>
#include <sentinel/fp8_scaling.h>

#include <string>

#include "cuda/recipe_device.h"
#include "cuda/stats_kernel.cuh"

namespace sentinel {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = 0xffffffffu;

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kAll, v, offset));  // NaN-free
  return v;
}

// Lane 0 ends up with the warp's tallies.
__device__ void warp_combine(recipes::CastTally& c, recipes::GroupTally& g) {
  for (int offset = 16; offset > 0; offset /= 2) {
    auto add = [offset](auto& x, auto) { x += __shfl_down_sync(kAll, x, offset); };
    c.zip(c, add);
    g.zip(g, add);
  }
}

static_assert(sizeof(uint64_t) == sizeof(unsigned long long), "the tallies' counts are added as 64-bit atomics");
__device__ void atomic_add(uint64_t& target, uint64_t v) {
  if (v) atomicAdd(reinterpret_cast<unsigned long long*>(&target), static_cast<unsigned long long>(v));
}
__device__ void atomic_add(double& target, double v) { atomicAdd(&target, v); }

__device__ void add_into_record(DeviceRecipeRecord* r, recipes::CastTally& c, recipes::GroupTally& g) {
  auto add = [](auto& target, auto v) { atomic_add(target, v); };
  r->cast.zip(c, add);
  r->groups.zip(g, add);
}

// How a launch spreads its work: current scaling over a dense tensor in memory order (kFlat); a
// thread per group where a group is a few hundred elements at most, each thread reading its group
// twice, the second time from cache (kThread); a warp per group for Float8Block's 128 x 128
// tiles, each lane every 32nd vector of it (kWarp). 16-byte loads wherever the rows allow them.
enum class Shape { kFlat, kThread, kWarp };

// The histogram of scale codes in shared memory: the lanes of a warp holding the same code add
// it once, by their leader (most groups of a tensor share a few codes).
__device__ void count_code(unsigned int* codes, uint8_t code) {
  const unsigned peers = __match_any_sync(__activemask(), static_cast<unsigned>(code));
  if (threadIdx.x % 32 == static_cast<unsigned>(__ffs(peers) - 1)) atomicAdd(&codes[code], __popc(peers));
}

// Whether a group's rows can be read 16 bytes at a time: unit column stride, whole vectors per row,
// rows and the group's start aligned.
template <typename T, typename I>
__device__ bool whole_vectors(const T* p, const recipes::GroupGeometry& geo, I width) {
  constexpr int kVec = 16 / sizeof(T);
  return geo.col_stride == 1 && width % kVec == 0 && geo.row_stride % kVec == 0 &&
         reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// f(x) for every element of a group of `height` rows of `width`, by one thread: 16-byte loads
// where whole_vectors, single elements otherwise.
template <typename Load, typename I, typename F>
__device__ void each_element(const typename Load::storage* p, const recipes::GroupGeometry& geo, I height, I width,
                             F&& f) {
  using T = typename Load::storage;
  constexpr int kVec = 16 / sizeof(T);
  if (whole_vectors(p, geo, width)) {
    for (I r = 0; r < height; ++r) {
      const uint4* row = reinterpret_cast<const uint4*>(p + static_cast<int64_t>(r) * geo.row_stride);
      for (I v = 0; v < width / kVec; ++v) {
        const uint4 raw = __ldg(row + v);
        const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int k = 0; k < kVec; ++k) f(Load::get(values[k]));
      }
    }
    return;
  }
  for (I r = 0; r < height; ++r) {
    for (I c = 0; c < width; ++c) f(Load::get(p[geo.at(0, r, c)]));
  }
}

// The same spread over a warp's lanes, each taking every 32nd vector (or element) of the group.
template <typename Load, typename I, typename F>
__device__ void each_element_of_warp(const typename Load::storage* p, const recipes::GroupGeometry& geo, I height,
                                     I width, int lane, F&& f) {
  using T = typename Load::storage;
  constexpr int kVec = 16 / sizeof(T);
  if (whole_vectors(p, geo, width)) {
    const I per_row = width / kVec;
    for (I v = lane; v < height * per_row; v += 32) {
      const I r = v / per_row;
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p + static_cast<int64_t>(r) * geo.row_stride) + (v - r * per_row));
      const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) f(Load::get(values[k]));
    }
    return;
  }
  for (I r = 0; r < height; ++r) {
    for (I c = lane; c < width; c += 32) f(Load::get(p[geo.at(0, r, c)]));
  }
}

template <typename Load, fp8::ScalingRecipe kKind, Shape kShape, typename I>
__global__ void __launch_bounds__(kThreads)
    recipe_kernel(const typename Load::storage* __restrict__ data, RecipeLaunch l,
                  const unsigned int* __restrict__ tensor_amax_bits, DeviceRecipeRecord* record) {
  using T = typename Load::storage;
  // Shared memory runs no constructors: raw storage for the warps' tallies.
  __shared__ unsigned int codes[256];
  __shared__ alignas(recipes::CastTally) unsigned char cast_bytes[kWarps * sizeof(recipes::CastTally)];
  __shared__ alignas(recipes::GroupTally) unsigned char group_bytes[kWarps * sizeof(recipes::GroupTally)];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) codes[i] = 0;
  __syncthreads();

  const float tensor_amax = fp8::detail::bits_to_float(*tensor_amax_bits);
  float tensor_scale = 1.0f;  // NVFP4's S_enc, or current scaling's one scale
  if (kKind == fp8::ScalingRecipe::NVFP4) tensor_scale = fp8::nvfp4_tensor_scale(tensor_amax);
  if (kKind == fp8::ScalingRecipe::Current) tensor_scale = fp8::scale_for_amax(tensor_amax, l.element.max, l.margin, 1.0f);

  recipes::CastTally cast;
  recipes::GroupTally groups;
  const int lane = threadIdx.x % 32;
  const recipes::GroupGeometry& geo = l.geometry;
  if constexpr (kShape == Shape::kFlat) {
    constexpr int kVec = 16 / sizeof(T);
    const int64_t n = l.flat_elements;
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t vectors = reinterpret_cast<uintptr_t>(data) % 16 == 0 ? n / kVec : 0;
    for (int64_t v = thread; v < vectors; v += threads) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(data) + v);
      const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) cast.add_scaled(Load::get(values[k]), tensor_scale, l.element);
    }
    for (int64_t i = vectors * kVec + thread; i < n; i += threads) cast.add_scaled(Load::get(data[i]), tensor_scale, l.element);
  } else if constexpr (kShape == Shape::kThread) {
    const I step = static_cast<I>(gridDim.x) * kThreads;
    for (I g = static_cast<I>(blockIdx.x) * kThreads + threadIdx.x; g < static_cast<I>(geo.groups); g += step) {
      I height = 0, width = 0;
      const T* p = data + geo.group_start(g, height, width);
      if constexpr (kKind == fp8::ScalingRecipe::Current) {
        each_element<Load>(p, geo, height, width, [&](float x) { cast.add_scaled(x, tensor_scale, l.element); });
      } else {
        float amax = 0.0f;
        bool special = false;
        each_element<Load>(p, geo, height, width, [&](float x) {
          const float ax = fabsf(x);
          amax = fmaxf(amax, ax);  // NaN ignored, as the CPU's amax
          special = special || !(ax <= FLT_MAX);
        });
        const fp8::BlockScale s = recipes::group_scale(l.rule, amax, special, tensor_scale);
        groups.add(s, amax, special);
        count_code(codes, s.code);
        each_element<Load>(p, geo, height, width, [&](float x) { cast.add(x, s.encode, s.decode, l.element); });
      }
    }
  } else {
    const I step = static_cast<I>(gridDim.x) * kWarps;
    for (I g = static_cast<I>(blockIdx.x) * kWarps + threadIdx.x / 32; g < static_cast<I>(geo.groups); g += step) {
      I height = 0, width = 0;
      const T* p = data + geo.group_start(g, height, width);
      float amax = 0.0f;
      bool special = false;
      each_element_of_warp<Load>(p, geo, height, width, lane, [&](float x) {
        const float ax = fabsf(x);
        amax = fmaxf(amax, ax);
        special = special || !(ax <= FLT_MAX);
      });
      amax = warp_max(amax);
      special = __any_sync(kAll, special);
      const fp8::BlockScale s = recipes::group_scale(l.rule, amax, special, tensor_scale);
      if (lane == 0) {
        groups.add(s, amax, special);
        atomicAdd(&codes[s.code], 1u);
      }
      each_element_of_warp<Load>(p, geo, height, width, lane, [&](float x) { cast.add(x, s.encode, s.decode, l.element); });
    }
  }

  warp_combine(cast, groups);
  auto* warp_cast = reinterpret_cast<recipes::CastTally*>(cast_bytes);
  auto* warp_groups = reinterpret_cast<recipes::GroupTally*>(group_bytes);
  if (lane == 0) {
    warp_cast[threadIdx.x / 32] = cast;
    warp_groups[threadIdx.x / 32] = groups;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    if (codes[i]) atomicAdd(&record->scale_codes[i], codes[i]);
  }
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kWarps; ++w) {
    cast.combine(warp_cast[w]);
    groups.combine(warp_groups[w]);
  }
  if (kKind == fp8::ScalingRecipe::Current) cast.unscale(tensor_scale);  // each tensor with its own scale
  add_into_record(record, cast, groups);
}

template <typename Load, fp8::ScalingRecipe kKind>
void launch_shaped(const typename Load::storage* data, const RecipeLaunch& l, const unsigned int* amax,
                   DeviceRecipeRecord* record, int max, cudaStream_t stream) {
  auto blocks = [&](int64_t per_block, int64_t work) {
    const int64_t wanted = (work + per_block - 1) / per_block;
    return static_cast<int>(wanted < max ? wanted : max);
  };
  const recipes::GroupGeometry& g = l.geometry;
  if constexpr (kKind == fp8::ScalingRecipe::Current) {
    if (l.flat_elements > 0) {
      recipe_kernel<Load, kKind, Shape::kFlat, int64_t>
          <<<blocks(int64_t{kThreads} * 16, l.flat_elements), kThreads, 0, stream>>>(data, l, amax, record);
      return;
    }
  }
  if (g.tile_rows * g.tile_cols <= 256 || kKind == fp8::ScalingRecipe::Current) {
    if (g.narrow()) {
      recipe_kernel<Load, kKind, Shape::kThread, uint32_t><<<blocks(kThreads, g.groups), kThreads, 0, stream>>>(data, l, amax, record);
    } else {
      recipe_kernel<Load, kKind, Shape::kThread, int64_t><<<blocks(kThreads, g.groups), kThreads, 0, stream>>>(data, l, amax, record);
    }
  } else if constexpr (kKind != fp8::ScalingRecipe::Current) {
    recipe_kernel<Load, kKind, Shape::kWarp, int64_t><<<blocks(kWarps, g.groups), kThreads, 0, stream>>>(data, l, amax, record);
  }
}

template <typename Load>
void launch_for(const void* data, const RecipeLaunch& l, const unsigned int* amax, DeviceRecipeRecord* record,
                int max, cudaStream_t stream) {
  const auto* typed = static_cast<const typename Load::storage*>(data);
  using fp8::ScalingRecipe;
  switch (l.recipe) {
    case ScalingRecipe::Current: return launch_shaped<Load, ScalingRecipe::Current>(typed, l, amax, record, max, stream);
    case ScalingRecipe::MXFP8: return launch_shaped<Load, ScalingRecipe::MXFP8>(typed, l, amax, record, max, stream);
    case ScalingRecipe::NVFP4: return launch_shaped<Load, ScalingRecipe::NVFP4>(typed, l, amax, record, max, stream);
    case ScalingRecipe::Float8Block:
      return launch_shaped<Load, ScalingRecipe::Float8Block>(typed, l, amax, record, max, stream);
    case ScalingRecipe::Delayed: break;
  }
  throw InputError("sentinel: delayed scaling is the statistics launch's probe, not a recipe launch");
}

}  // namespace

void launch_recipe(const void* data, DType dtype, const RecipeLaunch& launch, const unsigned int* tensor_amax_bits,
                   DeviceRecipeRecord* record, void* stream) {
  if (!record || !tensor_amax_bits) throw InputError("sentinel: launch_recipe needs a record and an amax word");
  if (launch.geometry.groups == 0) return;
  if (!data) throw InputError("sentinel: launch_recipe got a null data pointer");
  int device = 0;
  check_cuda(cudaGetDevice(&device), "query of the current device");
  const int max = max_blocks(device);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::kFloat32: launch_for<kernel::Float32>(data, launch, tensor_amax_bits, record, max, s); break;
    case DType::kFloat16: launch_for<kernel::Float16>(data, launch, tensor_amax_bits, record, max, s); break;
    case DType::kBFloat16: launch_for<kernel::BFloat16>(data, launch, tensor_amax_bits, record, max, s); break;
    default:
      throw InputError(std::string("sentinel: the recipes take float32, float16 or bfloat16 tensors, got ") +
                       dtype_name(dtype));
  }
  check_cuda(cudaGetLastError(), "launch of a recipe kernel");
}

RecipeRecordPool::RecipeRecordPool(int device) : device_(device) {
  int previous = 0;
  check_cuda(cudaGetDevice(&previous), "query of the current device");
  check_cuda(cudaSetDevice(device), "selection of the records' device");
  const cudaError_t status = cudaMalloc(&amax_words_, sizeof(unsigned int) * kStreams);
  cudaSetDevice(previous);
  check_cuda(status, "allocation of the amax words");
}

RecipeRecordPool::~RecipeRecordPool() {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  for (Chunk& c : chunks_) {
    cudaFree(c.device);
    cudaFreeHost(c.host);
  }
  if (amax_words_) cudaFree(amax_words_);
  cudaSetDevice(previous);
}

int64_t RecipeRecordPool::take(int n, bool may_allocate) {
  if (n <= 0 || n > kChunk) throw InputError("sentinel: " + std::to_string(n) + " recipe records at once");
  int64_t first = used_;
  if (first % kChunk + n > kChunk) first = (first / kChunk + 1) * kChunk;  // consecutive in one chunk
  const size_t chunk = static_cast<size_t>((first + n - 1) / kChunk);
  if (chunk >= chunks_.size()) {
    if (!may_allocate) return -1;
    int previous = 0;
    check_cuda(cudaGetDevice(&previous), "query of the current device");
    check_cuda(cudaSetDevice(device_), "selection of the records' device");
    Chunk c;
    const size_t bytes = sizeof(DeviceRecipeRecord) * kChunk;
    // Zeroed once here; afterwards after each read-back, on the stream of the read-back.
    cudaError_t status = cudaMalloc(&c.device, bytes);
    if (status == cudaSuccess) status = cudaMallocHost(&c.host, bytes);
    if (status == cudaSuccess) status = cudaMemset(c.device, 0, bytes);
    cudaSetDevice(previous);
    if (status != cudaSuccess) {
      if (c.device) cudaFree(c.device);
      if (c.host) cudaFreeHost(c.host);
      check_cuda(status, "allocation of recipe records");
    }
    chunks_.push_back(c);
  }
  used_ = first + n;
  return first;
}

DeviceRecipeRecord* RecipeRecordPool::device_record(int64_t index) const {
  return chunks_[static_cast<size_t>(index / kChunk)].device + index % kChunk;
}

const DeviceRecipeRecord& RecipeRecordPool::host_record(int64_t index) const {
  return chunks_[static_cast<size_t>(index / kChunk)].host[index % kChunk];
}

void RecipeRecordPool::copy_back_and_reset_async(void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  for (int64_t first = 0; first < used_; first += kChunk) {
    const Chunk& c = chunks_[static_cast<size_t>(first / kChunk)];
    const size_t bytes = sizeof(DeviceRecipeRecord) * static_cast<size_t>(used_ - first < kChunk ? used_ - first : kChunk);
    check_cuda(cudaMemcpyAsync(c.host, c.device, bytes, cudaMemcpyDeviceToHost, s), "read-back of recipe records");
    check_cuda(cudaMemsetAsync(c.device, 0, bytes, s), "reset of recipe records");
  }
  used_ = 0;
}

unsigned int* RecipeRecordPool::amax_word(void* stream) {
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i] == stream) return amax_words_ + i;
  }
  // Streams beyond kStreams share words: a word is read right after it is written on its stream,
  // so two streams collide only if they enqueue recipes at the same moment.
  const size_t i = streams_.size() < kStreams ? streams_.size() : reinterpret_cast<uintptr_t>(stream) % kStreams;
  if (i == streams_.size()) streams_.push_back(stream);
  else streams_[i] = stream;
  return amax_words_ + i;
}

void RecipeRecordPool::reset_amax_async(unsigned int* word, void* stream) {
  check_cuda(cudaMemsetAsync(word, 0, sizeof(unsigned int), static_cast<cudaStream_t>(stream)), "reset of an amax word");
}

}  // namespace cuda
}  // namespace sentinel

#pragma once
// The recipes beside delayed scaling on the GPU: current scaling, MXFP8 (both rules), NVFP4 and
// Float8Block, one launch per recipe and tensor, after the tensor's statistics launch on the same
// stream, whose amax (the tensor-wide scales' input) the launch reads from device memory. The
// arithmetic is src/fp8/group_math.h, the CPU replay's own. Host API: no CUDA headers.
#include <cstdint>
#include <vector>

#include "cuda/device_stats.h"
#include "fp8/block_probe.h"
#include "fp8/group_math.h"
#include "fp8/recipe_probe.h"

namespace sentinel {
namespace cuda {

// One recipe's result in one slot as the kernels leave it in device memory: all-zero bytes are
// "nothing cast", and tensors that share the slot add into it.
struct DeviceRecipeRecord {
  recipes::CastTally cast;  // current scaling's sums dequantized too
  recipes::GroupTally groups;
  unsigned int scale_codes[256];
};

// Host side: the record as the CPU replay reports it.
recipes::BlockProbeResult decode_recipe(const DeviceRecipeRecord& record);

// What one launch replays, all but the tensor.
struct RecipeLaunch {
  fp8::ScalingRecipe recipe = fp8::ScalingRecipe::Current;  // not Delayed
  recipes::GroupGeometry geometry;  // current scaling: any grouping of its elements
  recipes::GroupRule rule;          // the block recipes'
  stats::Fp8ProbeParams element;    // the element grid at scale 1 (stats::make_fp8_probe_params)
  int margin = 0;                   // current scaling's
  // Current scaling of a tensor whose elements fill [data, data + flat_elements) (non-overlapping
  // and dense: their order does not matter to one scale): read in memory order. 0: by groups.
  int64_t flat_elements = 0;
};

// The launch of `job` on a tensor of these sizes and strides (in elements); `dense`: its elements
// fill a span of memory without gaps or overlaps. Throws sentinel::InputError for a tensor of
// more than recipes::kMaxGroupDims dimensions.
RecipeLaunch make_recipe_launch(const recipes::RecipeJob& job, const int64_t* sizes, const int64_t* strides, int dims,
                                bool dense);

// Replays `launch` on the tensor at `data` (float32, float16 or bfloat16) into `record`, on
// `stream`, the tensor's amax read from `tensor_amax_bits` (float bits, set on that stream
// before). No allocation, no synchronisation; errors are thrown as sentinel::Error.
void launch_recipe(const void* data, DType dtype, const RecipeLaunch& launch, const unsigned int* tensor_amax_bits,
                   DeviceRecipeRecord* record, void* stream);

// The records of one GPU between two read-backs, in chunks of device memory with pinned host
// mirrors, made as they are first needed and kept; and one word per stream for the amax of the
// tensor whose recipes run next on it.
class RecipeRecordPool {
 public:
  explicit RecipeRecordPool(int device);
  ~RecipeRecordPool();
  RecipeRecordPool(const RecipeRecordPool&) = delete;
  RecipeRecordPool& operator=(const RecipeRecordPool&) = delete;

  // The first of `n` consecutive records (n <= kChunk), or -1 when a new chunk would be needed
  // and `may_allocate` is false (a CUDA graph is being captured).
  int64_t take(int n, bool may_allocate);
  DeviceRecipeRecord* device_record(int64_t index) const;
  const DeviceRecipeRecord& host_record(int64_t index) const;  // after the read-back's wait
  // Copies the records taken since the last reset back and zeroes them, on `stream`: the caller
  // then waits for the stream (an event recorded after this) before reading them.
  void copy_back_and_reset_async(void* stream);
  int64_t used() const { return used_; }

  // The word for the tensor amax of `stream` (zeroed on it by reset_amax_async).
  unsigned int* amax_word(void* stream);
  void reset_amax_async(unsigned int* word, void* stream);

  static constexpr int kChunk = 256;

 private:
  struct Chunk {
    DeviceRecipeRecord* device = nullptr;
    DeviceRecipeRecord* host = nullptr;
  };
  int device_;
  std::vector<Chunk> chunks_;
  int64_t used_ = 0;
  unsigned int* amax_words_ = nullptr;  // kStreams words in device memory
  std::vector<void*> streams_;          // the stream of each word, in order of first use
  static constexpr int kStreams = 64;
};

}  // namespace cuda
}  // namespace sentinel

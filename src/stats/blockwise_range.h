#pragma once
// TransformerEngine's max_blockwise_dynamic_range statistic: over blocks of a tensor seen as 2-D
// ([numel / last dim, last dim]), the largest log2(amax / smallest non-zero |x|) of a block (0 for
// an all-zero block). Blocks are `block_size` consecutive elements of the flattened rows (dims 1)
// or block_size x block_size tiles (dims 2); with `max_over_orientations` the transposed tensor's
// blocks (the columns') count too. A NaN element makes the value NaN, an inf one inf. Internal.
#include <cstdint>
#include <string>

namespace at {
class Tensor;
}

namespace sentinel {
namespace stats {

struct BlockwiseRange {
  int64_t block_size = 32;
  int dims = 1;
  bool max_over_orientations = false;
};

enum class BlockwiseOutcome {
  Computed,
  NotRead,    // not a CPU tensor of a floating dtype with elements in memory
  Undivided,  // a shape the blocks do not divide, which TransformerEngine rejects
};

// The statistic of a CPU tensor of a floating dtype (dense or strided), in double from the
// elements as float, into `out`. Otherwise `why` says why it was not computed.
BlockwiseOutcome max_blockwise_dynamic_range(const at::Tensor& t, const BlockwiseRange& range, double& out,
                                             std::string& why);

// The larger of two values of the statistic, NaN if either is (as torch's max over blocks).
inline double nan_propagating_max(double a, double b) { return a != a || b != b ? a + b : (a > b ? a : b); }

// "max_blockwise_dynamic_range_block_size_32_dims_1" (and "_max_over_orientations"): the name
// TransformerEngine logs it under.
std::string blockwise_range_name(const BlockwiseRange& range);

}  // namespace stats
}  // namespace sentinel

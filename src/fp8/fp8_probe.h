#pragma once
// The FP8 probe: what casting a tensor to E4M3/E5M2 under a given scale would do, computed in
// the same read as its statistics. Definitions (docs/fp8.md): v = x * scale in float32; the
// saturating round-to-nearest-even cast q = decode(encode(v)); the dequantized value q / scale.
#include <sentinel/fp8.h>
#include <sentinel/stats.h>

#include "fp8/fp8_probe_result.h"
#include "stats/stats_accumulator.h"
#include "stats/tensor_stats.h"

#include <cstdint>

namespace at {
class Tensor;
}

namespace sentinel {
namespace stats {

// One read of `t` (float32/float64/float16/bfloat16, any dense or strided layout) fills both.
// Returns false (and leaves `probe` empty) for tensors the statistics pass cannot read.
// `readability` (optional) receives what the statistics pass said of the tensor.
// `moments` (optional) adds the statistics menu from the same chunks.
bool compute_with_fp8_probe(const at::Tensor& t, float scale, fp8::Format format, TensorStats& stats,
                            Fp8ProbeResult& probe, Readability* readability = nullptr,
                            MomentsAccumulator* moments = nullptr);

// The probe alone, for a tensor whose statistics are already known (current scaling's second
// read): the same result as compute_with_fp8_probe's `probe`, without the statistics' work.
bool compute_fp8_probe(const at::Tensor& t, float scale, fp8::Format format, Fp8ProbeResult& probe);

// Scalar reference of one element's cast, as the vector kernel computes it (exposed for tests).
float fp8_quantize_dequantize(float x, float scale, fp8::Format format, bool& overflow);

}  // namespace stats
}  // namespace sentinel

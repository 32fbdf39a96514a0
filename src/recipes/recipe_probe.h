#pragma once
// The recipes beside delayed scaling (current, mxfp8, nvfp4, float8block) on one GEMM operand, and their
// metrics per slot and step. The FP8 monitor (core/fp8_monitor.h) keeps one tally per recipe
// in each slot. Internal.
#include <sentinel/options.h>
#include <sentinel/report.h>
#include <sentinel/stats.h>

#include <string>

#include "recipes/block_probe.h"

namespace at {
class Tensor;
}

namespace sentinel {
namespace recipes {

struct RecipeTally {
  fp8::ScalingRecipe recipe;
  BlockProbeResult result;  // for current: the cast sums only
};

// Reads `t` once more for `tally.recipe` (not Delayed) and adds what it found. `stats` are the
// tensor's statistics from the first read (their abs_max sets the tensor-wide scales); `op` and
// `arg` place its blocks (operand_layout). False if the tensor is not read.
bool probe_recipe(const at::Tensor& t, const Fp8Options& options, fp8::Role role, const std::string& op, int arg,
                  const TensorStats& stats, RecipeTally& tally);

// count, overflow, underflow, their percentages, mse, cosine and sqnr_db of a cast's sums.
void fill_cast_metrics(Fp8SlotMetrics& m, const stats::Fp8ProbeResult& cast);

// The slot's metrics under the tally's recipe; `base` holds the slot's step, path, role, uses
// and cur_amax.
Fp8SlotMetrics recipe_metrics(const RecipeTally& tally, const Fp8Options& options, fp8::Role role,
                              const Fp8SlotMetrics& base);

}  // namespace recipes
}  // namespace sentinel

#pragma once
// The recipes beside delayed scaling (current, mxfp8, nvfp4, float8block) on one GEMM operand, and their
// metrics per slot and step. The FP8 monitor (fp8/fp8_monitor.h) keeps one tally per recipe
// in each slot. Internal.
#include <sentinel/block_scaling.h>
#include <sentinel/options.h>
#include <sentinel/report.h>
#include <sentinel/stats.h>

#include <string>

#include "fp8/block_probe.h"

namespace at {
class Tensor;
}

namespace sentinel {
namespace recipes {

struct RecipeTally {
  fp8::ScalingRecipe recipe;
  BlockProbeResult result;  // for current: the cast sums only
};

// One recipe's read of one operand, all but the tensor and its amax: what a device that replays
// the recipes is handed with the tensor (src/device/stats_device.h).
struct RecipeJob {
  fp8::ScalingRecipe recipe = fp8::ScalingRecipe::Current;  // not Delayed
  fp8::Format element = fp8::Format::E4M3;  // current scaling's and the FP8 block recipes' elements
  int margin = 0;                           // current scaling's
  BlockRecipe block;                        // the block recipes'
  BlockLayout layout;
};
// The job of `recipe` for an operand of `dims` dimensions: `op` and `arg` place its blocks
// (operand_layout).
RecipeJob recipe_job(fp8::ScalingRecipe recipe, const Fp8Options& options, fp8::Role role, const std::string& op,
                     int arg, int64_t dims);
// Runs it on `t`, whose statistics from the first read are `stats` (their abs_max sets the
// tensor-wide scales), and adds what it found into `out`. False if the tensor is not read.
bool run_recipe_job(const at::Tensor& t, const RecipeJob& job, const TensorStats& stats, BlockProbeResult& out);

// Reads `t` once more for `tally.recipe` (not Delayed) and adds what it found: the job above.
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

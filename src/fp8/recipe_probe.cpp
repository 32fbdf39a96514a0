#include "fp8/recipe_probe.h"

#include <ATen/core/Tensor.h>

#include "fp8/operand_layout.h"
#include "fp8/fp8_probe.h"

namespace sentinel {
namespace recipes {

namespace {

fp8::Format element_of(const Fp8Options& options, fp8::Role role) { return fp8::format_for(options.recipe(), role); }

// Current scaling's rule: TransformerEngine's scale from this tensor's amax, 1 when the amax is 0
// or not finite.
float current_scale(fp8::Format f, int margin, float amax) {
  return fp8::DelayedScaler::scale_from_amax(amax, fp8::max_value(f), margin, 1.0f);
}

float current_scale(const Fp8Options& options, fp8::Role role, float amax) {
  return current_scale(element_of(options, role), options.recipe().margin(), amax);
}

}  // namespace

RecipeJob recipe_job(fp8::ScalingRecipe recipe, const Fp8Options& options, fp8::Role role, const std::string& op,
                     int arg, int64_t dims) {
  RecipeJob job;
  job.recipe = recipe;
  job.element = element_of(options, role);
  job.margin = options.recipe().margin();
  job.block = BlockRecipe{recipe, job.element, options.mx_scale_rule(), options.block_scaling_pow2_scales(),
                          static_cast<float>(options.block_scaling_amax_epsilon())};
  const bool tiled_weights = recipe == fp8::ScalingRecipe::NVFP4 || recipe == fp8::ScalingRecipe::Float8Block;
  job.layout = operand_layout(op, role, arg, dims, tiled_weights);
  return job;
}

bool run_recipe_job(const at::Tensor& t, const RecipeJob& job, const TensorStats& stats, BlockProbeResult& out) {
  const float amax = recipe_amax(stats.abs_max);
  if (job.recipe == fp8::ScalingRecipe::Current) {
    stats::Fp8ProbeResult cast;
    if (!stats::compute_fp8_probe(t, current_scale(job.element, job.margin, amax), job.element, cast)) return false;
    out.cast.add(cast);
    return true;
  }
  BlockProbeResult found;
  if (!probe_blocks(t, job.block, job.layout, amax, found)) return false;
  out.add(found);
  return true;
}

bool probe_recipe(const at::Tensor& t, const Fp8Options& options, fp8::Role role, const std::string& op, int arg,
                  const TensorStats& stats, RecipeTally& tally) {
  return run_recipe_job(t, recipe_job(tally.recipe, options, role, op, arg, t.dim()), stats, tally.result);
}

void fill_cast_metrics(Fp8SlotMetrics& m, const stats::Fp8ProbeResult& cast) {
  m.count = cast.count;
  m.overflow = cast.overflow;
  m.underflow = cast.underflow;
  m.overflow_pct = m.count ? 100.0 * m.overflow / m.count : 0.0;
  m.underflow_pct = m.count ? 100.0 * m.underflow / m.count : 0.0;
  m.mse = cast.mse();
  m.cosine = cast.cosine();
  m.sqnr_db = cast.sqnr_db();
}

Fp8SlotMetrics recipe_metrics(const RecipeTally& tally, const Fp8Options& options, fp8::Role role,
                              const Fp8SlotMetrics& base) {
  Fp8SlotMetrics m = base;
  m.recipe = fp8::recipe_name(tally.recipe);
  m.drift_log2 = 0;
  const float amax = recipe_amax(m.cur_amax);
  const BlockProbeResult& r = tally.result;
  fill_cast_metrics(m, r.cast);
  switch (tally.recipe) {
    case fp8::ScalingRecipe::Current:
      m.format = fp8::format_name(element_of(options, role));
      m.delayed_scale = m.current_scale = current_scale(options, role, amax);
      return m;
    case fp8::ScalingRecipe::NVFP4:
      m.format = "E2M1";
      m.delayed_scale = m.current_scale = fp8::nvfp4_tensor_scale(amax);
      break;
    default:
      m.format = fp8::format_name(element_of(options, role));
      m.delayed_scale = m.current_scale = 1.0;
      break;
  }
  m.blocks = r.blocks;
  m.blocks_zero = r.blocks_zero;
  m.blocks_saturated = r.blocks_saturated;
  m.blocks_at_min = r.blocks_at_min;
  m.blocks_nonfinite = r.blocks_nonfinite;
  m.lost = r.lost;
  for (int code = 0; code < 256; ++code) {
    if (r.scale_codes[code] == 0) continue;
    // Float8Block: scale_inv's power of two (exact for its default power-of-two scales).
    const double value = tally.recipe == fp8::ScalingRecipe::NVFP4 ? fp8::decode(static_cast<uint8_t>(code), fp8::Format::E4M3)
                                                                  : fp8::e8m0_decode(static_cast<uint8_t>(code));
    m.block_scales.emplace_back(value, r.scale_codes[code]);
  }
  // E8M0 codes and exponent bytes ascend with their values; E4M3's positive codes too (the sign
  // bit is never set).
  return m;
}

}  // namespace recipes
}  // namespace sentinel

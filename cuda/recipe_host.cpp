// Host side of the recipes' launches: what a launch is handed for a job and a tensor, and what
// its record holds, as the CPU replay reports it.
#include <sentinel/errors.h>

#include <string>

#include "cuda/recipe_device.h"
#include "fp8/block_kernels.h"

namespace sentinel {
namespace cuda {

RecipeLaunch make_recipe_launch(const recipes::RecipeJob& job, const int64_t* sizes, const int64_t* strides, int dims,
                                bool dense) {
  // The element grids at scale 1: two binary searches each, made once.
  static const stats::Fp8ProbeParams e4m3 = recipes::element_format(fp8::Format::E4M3);
  static const stats::Fp8ProbeParams e5m2 = recipes::element_format(fp8::Format::E5M2);
  static const stats::Fp8ProbeParams e2m1 = recipes::e2m1_format();
  RecipeLaunch launch;
  launch.recipe = job.recipe;
  if (!recipes::make_group_geometry(sizes, strides, dims, job.layout, recipes::group_length(job.recipe), launch.geometry)) {
    throw InputError("sentinel: the fp8 recipes walk tensors of at most " + std::to_string(recipes::kMaxGroupDims) +
                     " dimensions on a GPU, this one has " + std::to_string(dims));
  }
  launch.rule = recipes::group_rule(job.block);
  launch.element = job.recipe == fp8::ScalingRecipe::NVFP4 ? e2m1 : job.element == fp8::Format::E4M3 ? e4m3 : e5m2;
  launch.margin = job.margin;
  if (job.recipe == fp8::ScalingRecipe::Current && dense) {
    launch.flat_elements = 1;
    for (int d = 0; d < dims; ++d) launch.flat_elements *= sizes[d];
  }
  return launch;
}

recipes::BlockProbeResult decode_recipe(const DeviceRecipeRecord& r) {
  recipes::BlockProbeResult out;
  recipes::add_tallies(r.cast, r.groups, out);
  for (size_t c = 0; c < out.scale_codes.size(); ++c) out.scale_codes[c] = r.scale_codes[c];
  return out;
}

}  // namespace cuda
}  // namespace sentinel

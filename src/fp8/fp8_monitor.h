#pragma once
// FP8 bring-up: per slot (module path x role) and step, what delayed scaling would do to the GEMM
// inputs of the selected layers. Fed from the same read as the frame statistics; a step ends
// when its batch ends (inference) or after its backward (training).
#include <sentinel/fp8_scaling.h>
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <cstdint>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "frames/string_table.h"
#include "fp8/recipe_probe.h"
#include "fp8/fp8_probe.h"
#include "fp8/fp8_probe_math.h"
#include "stats/tensor_stats.h"

namespace at {
class Tensor;
}

namespace sentinel {
namespace core {

using frames::PlaceTable;

class Fp8Monitor {
 public:
  // Throws sentinel::OptionError for an invalid regex or frequency.
  explicit Fp8Monitor(const Fp8Options& options);

  bool enabled() const { return options_.enabled(); }
  // Which of a GEMM's operands (`gemm_operands`: core::gemm_operands, bit i for argument i) of
  // this place, at this step, are probed; 0 for none.
  uint32_t wants(int64_t step, uint32_t gemm_operands, uint32_t place, const PlaceTable& places);
  // Reads `t` once: its statistics, and its cast under the slot's delayed scale; then once more
  // for each other recipe (Fp8Options::recipes), whose blocks `op` and `arg` (the GEMM and the
  // operand's argument index) place. `moments` (optional) adds the statistics menu.
  stats::Readability probe(const at::Tensor& t, uint32_t place, fp8::Role role, int64_t step, const PlaceTable& places,
                           TensorStats& out, stats::MomentsAccumulator* moments = nullptr,
                           const std::string& op = std::string(), int arg = 0);
  // Whether recipes other than delayed scaling are replayed (they read CPU tensors only).
  bool other_recipes() const { return !others_.empty(); }
  // The same in two halves, for a tensor read elsewhere (a device) and counted later: the cast's
  // parameters for the slot's delayed scale, then the slot's share of the result.
  struct Target {
    const stats::Fp8ProbeParams* params;
    float scale;
    fp8::Format format;
  };
  Target target(uint32_t place, fp8::Role role, int64_t step, const PlaceTable& places);
  void add_result(uint32_t place, fp8::Role role, const TensorStats& stats, const stats::Fp8ProbeResult& result);
  // The other recipes' jobs for an operand read on a device that replays them, and what the device
  // found with them (in the same order), added to the slot's tallies.
  std::vector<recipes::RecipeJob> recipe_jobs(fp8::Role role, const std::string& op, int arg, int64_t dims) const;
  void add_recipe_results(uint32_t place, fp8::Role role, const std::vector<recipes::BlockProbeResult>& results);
  bool step_open() const { return !slots_.empty(); }
  // Closes the open step: metrics per slot, scalers updated, alarms over their thresholds.
  std::vector<Fp8SlotMetrics> end_step(std::vector<Fp8Alarm>& alarms);
  const Fp8Options& options() const { return options_; }

 private:
  struct Slot {
    fp8::DelayedScaler* scaler;
    std::string path;
    fp8::Role role;
    int64_t step;
    int64_t uses = 0;
    double amax = 0;
    stats::Fp8ProbeResult sums;
    stats::Fp8ProbeParams params;  // of the scaler's scale at this step (fixed within it)
    std::vector<recipes::RecipeTally> others;  // one per recipe other than delayed, in order
  };
  // Appends one slot's metrics, and its alarm if a threshold is crossed.
  void add_metrics(Fp8SlotMetrics m, std::vector<Fp8Alarm>& alarms, std::vector<Fp8SlotMetrics>& metrics) const;
  Slot& slot_for(uint32_t place, fp8::Role role, int64_t step, const PlaceTable& places);
  Fp8Options options_;
  std::regex layers_;
  fp8::ScalingTable scalers_;
  std::map<std::pair<uint32_t, int>, Slot> slots_;  // slots used in the open step
  std::vector<int8_t> selected_by_place_;
  bool delayed_ = true;                          // delayed scaling is among the recipes
  std::vector<fp8::ScalingRecipe> others_;       // the other recipes, in the order given
};

}  // namespace core
}  // namespace sentinel

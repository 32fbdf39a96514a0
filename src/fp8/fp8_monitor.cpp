#include "fp8/fp8_monitor.h"

#include <sentinel/errors.h>

#include <ATen/core/Tensor.h>

#include <cmath>
#include <fmt/format.h>

namespace sentinel {
namespace core {

namespace {

std::string percent(double fraction) {
  return fmt::format("{:.3f}%", 100.0 * fraction);
}

}  // namespace

Fp8Monitor::Fp8Monitor(const Fp8Options& options) : options_(options), scalers_(options.recipe()) {
  if (!options_.enabled()) return;
  delayed_ = false;
  for (fp8::ScalingRecipe r : options_.recipes()) {
    if (r == fp8::ScalingRecipe::Delayed) delayed_ = true;
    else others_.push_back(r);
  }
  try {
    layers_ = std::regex(options_.layers(), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw OptionError("sentinel: fp8 layers regex '" + options_.layers() + "' is invalid: " + e.what());
  }
}

uint32_t Fp8Monitor::wants(int64_t step, uint32_t gemm_operands, uint32_t place, const PlaceTable& places) {
  if (!options_.enabled() || gemm_operands == 0 || step < options_.start_step()) return 0;
  if (options_.end_step() >= 0 && step > options_.end_step()) return 0;
  if ((step - options_.start_step()) % options_.freq() != 0) return 0;
  if (place >= selected_by_place_.size()) selected_by_place_.resize(place + 1, -1);
  if (selected_by_place_[place] < 0) selected_by_place_[place] = std::regex_match(places.path(place), layers_);
  return selected_by_place_[place] == 1 ? gemm_operands : 0;
}

Fp8Monitor::Slot& Fp8Monitor::slot_for(uint32_t place, fp8::Role role, int64_t step, const PlaceTable& places) {
  auto key = std::make_pair(place, static_cast<int>(role));
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    const std::string path = places.path(place);
    fp8::DelayedScaler* scaler = &scalers_.slot(path, role);
    it = slots_.emplace(key, Slot{scaler, path, role, step, 0, 0.0, {}, {}, {}}).first;
    it->second.params = stats::make_fp8_probe_params(scaler->scale(), scaler->format());
    for (fp8::ScalingRecipe r : others_) it->second.others.push_back(recipes::RecipeTally{r, {}});
  }
  return it->second;
}

namespace {

void add_to_slot(double& amax, int64_t& uses, stats::Fp8ProbeResult& sums, const TensorStats& out,
                 const stats::Fp8ProbeResult& result) {
  ++uses;
  if (out.count > out.nan && std::isfinite(out.abs_max)) amax = std::max(amax, out.abs_max);
  else if (out.pos_inf + out.neg_inf > 0) amax = INFINITY;  // TE's rule: a non-finite amax keeps the scale
  sums.add(result);
}

}  // namespace

stats::Readability Fp8Monitor::probe(const at::Tensor& t, uint32_t place, fp8::Role role, int64_t step,
                                     const PlaceTable& places, TensorStats& out,
                                     stats::MomentsAccumulator* moments, const std::string& op, int arg) {
  Slot& slot = slot_for(place, role, step, places);
  stats::Fp8ProbeResult result;
  stats::Readability readability = stats::Readability::Read;
  if (delayed_) {
    if (!stats::compute_with_fp8_probe(t, slot.scaler->scale(), slot.scaler->format(), out, result, &readability,
                                       moments)) {
      return readability;  // not a floating tensor the cast applies to: statistics only
    }
  } else {
    stats::MomentsAccumulator unused;
    readability = stats::compute_with_moments(t, out, moments ? *moments : unused);
    const auto dtype = t.scalar_type();
    const bool floating = dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kHalf || dtype == c10::kBFloat16;
    if (readability != stats::Readability::Read || !floating) return readability;
  }
  for (recipes::RecipeTally& tally : slot.others) recipes::probe_recipe(t, options_, role, op, arg, out, tally);
  add_to_slot(slot.amax, slot.uses, slot.sums, out, result);
  return stats::Readability::Read;
}

Fp8Monitor::Target Fp8Monitor::target(uint32_t place, fp8::Role role, int64_t step, const PlaceTable& places) {
  Slot& slot = slot_for(place, role, step, places);
  return Target{&slot.params, slot.scaler->scale(), slot.scaler->format()};
}

void Fp8Monitor::add_result(uint32_t place, fp8::Role role, const TensorStats& stats,
                            const stats::Fp8ProbeResult& result) {
  auto it = slots_.find(std::make_pair(place, static_cast<int>(role)));
  if (it == slots_.end()) return;  // its step was closed before the numbers came back
  add_to_slot(it->second.amax, it->second.uses, it->second.sums, stats, result);
}

std::vector<recipes::RecipeJob> Fp8Monitor::recipe_jobs(fp8::Role role, const std::string& op, int arg,
                                                         int64_t dims) const {
  std::vector<recipes::RecipeJob> jobs;
  for (fp8::ScalingRecipe r : others_) jobs.push_back(recipes::recipe_job(r, options_, role, op, arg, dims));
  return jobs;
}

void Fp8Monitor::add_recipe_results(uint32_t place, fp8::Role role, const std::vector<recipes::BlockProbeResult>& results) {
  auto it = slots_.find(std::make_pair(place, static_cast<int>(role)));
  if (it == slots_.end()) return;  // its step was closed before the numbers came back
  std::vector<recipes::RecipeTally>& tallies = it->second.others;
  for (size_t i = 0; i < results.size() && i < tallies.size(); ++i) tallies[i].result.add(results[i]);
}

void Fp8Monitor::add_metrics(Fp8SlotMetrics m, std::vector<Fp8Alarm>& alarms, std::vector<Fp8SlotMetrics>& metrics) const {
  std::string reason;
  const double overflow_fraction = m.count ? double(m.overflow) / m.count : 0.0;
  if (overflow_fraction > options_.overflow_alarm()) {
    reason = "overflow " + percent(overflow_fraction) + " > " + percent(options_.overflow_alarm());
  }
  // Only delayed scaling lags behind the amax; the other recipes' scales follow it.
  if (m.recipe == fp8::recipe_name(fp8::ScalingRecipe::Delayed) && m.drift_log2 > options_.drift_alarm()) {
    reason += (reason.empty() ? "" : "; ") + fmt::format("drift {:.2f} > {:.2f}", m.drift_log2, options_.drift_alarm());
  }
  if (m.recipe != fp8::recipe_name(fp8::ScalingRecipe::Delayed) && !reason.empty()) reason = m.recipe + ": " + reason;
  if (!reason.empty()) alarms.push_back(Fp8Alarm{m, reason});
  metrics.push_back(std::move(m));
}

std::vector<Fp8SlotMetrics> Fp8Monitor::end_step(std::vector<Fp8Alarm>& alarms) {
  std::vector<Fp8SlotMetrics> metrics;
  for (auto& [key, slot] : slots_) {
    if (slot.uses == 0) continue;  // every operand unreadable (meta, sparse, integer): nothing to say
    Fp8SlotMetrics m;
    m.step = slot.step;
    m.module_path = slot.path;
    m.role = fp8::role_name(slot.role);
    m.format = fp8::format_name(slot.scaler->format());
    m.uses = slot.uses;
    m.cur_amax = slot.amax;
    m.delayed_scale = slot.scaler->scale();
    m.current_scale = slot.scaler->current_scale(static_cast<float>(slot.amax));
    m.drift_log2 = fp8::DelayedScaler::drift_log2(static_cast<float>(m.delayed_scale), static_cast<float>(m.current_scale));
    recipes::fill_cast_metrics(m, slot.sums);
    slot.scaler->update(static_cast<float>(slot.amax));  // the next step's scale sees this amax
    if (delayed_) add_metrics(m, alarms, metrics);
    for (const recipes::RecipeTally& tally : slot.others) {
      add_metrics(recipes::recipe_metrics(tally, options_, slot.role, m), alarms, metrics);
    }
  }
  slots_.clear();
  return metrics;
}

}  // namespace core
}  // namespace sentinel

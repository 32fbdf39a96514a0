// Simulator of TransformerEngine's FP8 delayed-scaling recipe.
//
// Under delayed scaling a tensor is cast as fp8(x * scale), where the scale
// was chosen from the amaxes (max |x|) of EARLIER steps. This lets a GEMM
// cast its input in one pass, but when the amax grows faster than the history
// reacts, the scale is too large and values overflow. The simulator replays
// the recipe per tensor slot so those steps can be found and measured.
//
// Rules (one slot, step t = 0, 1, 2, ...):
//   * the scale used at step 0 is 1;
//   * after step t records its amax a_t, the scale for step t+1 is
//       scale = fp8_max / amax / 2^margin
//     where amax = max(a_{t-L+1} .. a_t)  (AmaxAlgo::Max, L = history length;
//     steps before 0 count as 0) or amax = a_t (AmaxAlgo::MostRecent);
//   * if that amax is 0, inf or NaN, the previous scale is kept (under Max a
//     NaN anywhere in the window makes the amax NaN);
//   * a scale that overflows to inf (amax tiny) becomes FLT_MAX.
// See docs/fp8.md.
#ifndef SENTINEL_FP8_SCALING_H_
#define SENTINEL_FP8_SCALING_H_

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "sentinel/fp8.h"

namespace sentinel {
namespace fp8 {

// The format a tensor of this role is cast to under the recipe.
Format format_for(const Recipe& recipe, Role role);

// TransformerEngine's amax -> scale rule, the same float operations in the same order on the host
// and on a GPU: (fp8_max / amax) / 2^margin; `previous` when amax is 0 or not finite (nothing can
// be learned from it); FLT_MAX when the quotient overflows (a tiny amax), as TE clamps it.
SENTINEL_HOST_DEVICE inline float scale_for_amax(float amax, float fp8_max, int margin, float previous) {
  if (!(amax > 0.0f && amax <= FLT_MAX)) return previous;
  const float scale = (fp8_max / amax) / ldexpf(1.0f, margin);
  return scale > FLT_MAX ? FLT_MAX : scale;
}

// Delayed-scaling state of ONE tensor slot.
class DelayedScaler {
 public:
  // Throws std::invalid_argument if recipe.amax_history_len() < 1.
  DelayedScaler(const Recipe& recipe, Format format);

  // The scale to cast this step's tensor with (derived from earlier steps).
  float scale() const { return scale_; }

  // Records this step's amax and derives the scale for the next step.
  void update(float cur_amax);

  // The scale this step's amax alone would call for (the "current scaling"
  // recipe); falls back to scale() when cur_amax is 0 or non-finite.
  float current_scale(float cur_amax) const;

  // log2(delayed / current). > 0: the delayed scale is larger than this
  // step's amax allows, so its largest values overflow; < 0: range is wasted.
  static double drift_log2(float delayed, float current);

  // scale_for_amax, for one slot's format.
  static float scale_from_amax(float amax, float fp8_max, int margin, float previous);

  Format format() const { return format_; }
  const Recipe& recipe() const { return recipe_; }
  // Number of update() calls so far.
  int64_t steps() const { return steps_; }
  // The reduced amax the last update() computed (0 before the first).
  float history_amax() const { return history_amax_; }
  // The recorded amaxes still in the window, oldest first (at most L).
  std::vector<float> history() const;

 private:
  float reduce_history() const;

  Recipe recipe_;
  Format format_;
  std::vector<float> ring_;  // L entries, zero-filled like TE's history
  std::size_t next_ = 0;     // ring index the next amax is written to
  int64_t steps_ = 0;
  float scale_ = 1.0f;
  float history_amax_ = 0.0f;
};

// One DelayedScaler per (module path, role), created on first use with the
// format the recipe gives that role.
class ScalingTable {
 public:
  explicit ScalingTable(const Recipe& recipe = Recipe()) : recipe_(recipe) {}

  // The slot's scaler, created on first use.
  DelayedScaler& slot(const std::string& module_path, Role role);
  // nullptr if the slot was never used.
  const DelayedScaler* find(const std::string& module_path, Role role) const;

  std::size_t size() const { return slots_.size(); }
  const Recipe& recipe() const { return recipe_; }
  void clear() { slots_.clear(); }

  // Visits every slot (unspecified order): f(module_path, role, scaler).
  template <typename F>
  void for_each(F&& f) const {
    for (const auto& kv : slots_) f(kv.first.path, kv.first.role, kv.second);
  }

 private:
  struct Key {
    std::string path;
    Role role;
    bool operator==(const Key& o) const { return role == o.role && path == o.path; }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };

  Recipe recipe_;
  std::unordered_map<Key, DelayedScaler, KeyHash> slots_;
};

}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_FP8_SCALING_H_

// TransformerEngine's delayed-scaling recipe, replayed on the host.
#include "sentinel/fp8_scaling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

namespace sentinel {
namespace fp8 {

Format format_for(const Recipe& recipe, Role role) {
  switch (recipe.format()) {
    case FormatPolicy::E4M3: return Format::E4M3;
    case FormatPolicy::E5M2: return Format::E5M2;
    case FormatPolicy::HYBRID: break;
  }
  // Gradients need range more than precision; forward tensors the reverse.
  return role == Role::Gradient ? Format::E5M2 : Format::E4M3;
}

DelayedScaler::DelayedScaler(const Recipe& recipe, Format format)
    : recipe_(recipe), format_(format) {
  if (recipe.amax_history_len() < 1) {
    throw std::invalid_argument("sentinel::fp8::Recipe: amax_history_len must be >= 1, got " +
                                std::to_string(recipe.amax_history_len()));
  }
  // Zero-filled like TE's history buffer, so early steps reduce over zeros,
  // which never change a maximum of non-negative amaxes.
  ring_.assign(static_cast<std::size_t>(recipe.amax_history_len()), 0.0f);
}

float DelayedScaler::scale_from_amax(float amax, float fp8_max, int margin, float previous) {
  return scale_for_amax(amax, fp8_max, margin, previous);
}

float DelayedScaler::reduce_history() const {
  // torch.max semantics: a NaN anywhere in the window makes the result NaN,
  // which then keeps the previous scale until the NaN leaves the window.
  float amax = ring_[0];
  for (float a : ring_) {
    if (std::isnan(a)) return a;
    amax = std::max(amax, a);
  }
  return amax;
}

void DelayedScaler::update(float cur_amax) {
  // Write first, then reduce: TE reduces the history including the amax just
  // recorded, then rolls, so the window is the L most recent steps.
  ring_[next_] = cur_amax;
  next_ = (next_ + 1) % ring_.size();
  ++steps_;
  history_amax_ = recipe_.amax_compute_algo() == AmaxAlgo::Max ? reduce_history() : cur_amax;
  scale_ = scale_from_amax(history_amax_, max_value(format_), recipe_.margin(), scale_);
}

float DelayedScaler::current_scale(float cur_amax) const {
  return scale_from_amax(cur_amax, max_value(format_), recipe_.margin(), scale_);
}

double DelayedScaler::drift_log2(float delayed, float current) {
  // In double the quotient of two floats cannot overflow or underflow, and
  // exact power-of-two ratios give exact integer drifts.
  return std::log2(static_cast<double>(delayed) / static_cast<double>(current));
}

std::vector<float> DelayedScaler::history() const {
  const std::size_t len = ring_.size();
  const std::size_t n = std::min<std::size_t>(len, static_cast<std::size_t>(steps_));
  std::vector<float> out;
  out.reserve(n);
  // The oldest retained entry sits n slots behind the write position.
  for (std::size_t i = 0; i < n; ++i) out.push_back(ring_[(next_ + len - n + i) % len]);
  return out;
}

std::size_t ScalingTable::KeyHash::operator()(const Key& k) const {
  const std::size_t h = std::hash<std::string>()(k.path);
  return h ^ (static_cast<std::size_t>(k.role) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}

DelayedScaler& ScalingTable::slot(const std::string& module_path, Role role) {
  Key key{module_path, role};
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    it = slots_.emplace(std::move(key), DelayedScaler(recipe_, format_for(recipe_, role))).first;
  }
  return it->second;
}

const DelayedScaler* ScalingTable::find(const std::string& module_path, Role role) const {
  auto it = slots_.find(Key{module_path, role});
  return it == slots_.end() ? nullptr : &it->second;
}

}  // namespace fp8
}  // namespace sentinel

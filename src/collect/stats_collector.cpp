#include "collect/stats_collector.h"

#include <sentinel/errors.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

namespace sentinel {
namespace collect {

namespace {

std::string where(const StatsCollection& c) {
  return c.source().empty() ? fmt::format("sentinel: stats collection '{}'", c.name())
                            : fmt::format("{}: stats collection '{}'", c.source(), c.name());
}

bool is_fp8_stat(Stat s) { return s == Stat::Underflows || s == Stat::Overflows; }

stats::BlockwiseRange blockwise_of(const StatsCollection& c) {
  return {c.blockwise_block_size(), static_cast<int>(c.blockwise_dims()), c.blockwise_max_over_orientations()};
}

}  // namespace

double stat_value(Stat stat, const stats::MomentsAccumulator& m) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (m.n == 0) return nan;
  switch (stat) {
    case Stat::Min: return m.any_nan ? nan : m.min;
    case Stat::Max: return m.any_nan ? nan : m.max;
    case Stat::Mean: return m.mean;
    case Stat::Std: return m.n < 2 ? nan : std::sqrt(m.m2 / static_cast<double>(m.n - 1));
    case Stat::L1Norm: return m.sum_abs;
    case Stat::L2Norm: return std::sqrt(m.sum_sq);
    case Stat::CurAmax: return m.any_nan ? nan : m.max_abs;
    case Stat::DynamicRange:
      if (m.any_nan) return nan;
      return std::isinf(m.min_nonzero_abs) ? 0.0 : std::log2(m.max_abs / m.min_nonzero_abs);
    case Stat::Underflows:
    case Stat::Overflows:
    case Stat::MaxBlockwiseDynamicRange: return nan;
  }
  return nan;
}

StatsCollector::StatsCollector(const std::vector<StatsCollection>& collections) {
  // The ranges were checked by Options::validate().
  for (const auto& c : collections) {
    Collection entry{c, {}, 0};
    entry.blockwise = std::find(c.stats().begin(), c.stats().end(), Stat::MaxBlockwiseDynamicRange) != c.stats().end();
    try {
      entry.layers = std::regex(c.layers(), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw OptionError(fmt::format("{}: layers regex '{}' is invalid: {}", where(c), c.layers(), e.what()));
    }
    for (fp8::Role r : c.tensors()) entry.roles |= 1u << static_cast<int>(r);
    collections_.push_back(std::move(entry));
  }
}

bool StatsCollector::scheduled(const StatsCollection& c, int64_t step) const {
  if (step < c.start_step() || (c.end_step() >= 0 && step > c.end_step())) return false;
  return (step - c.start_step()) % c.freq() == 0;
}

uint64_t StatsCollector::selecting(uint32_t place, const frames::PlaceTable& places) {
  if (place >= selected_by_place_.size()) {
    selected_by_place_.resize(place + 1, 0);
    place_matched_.resize(place + 1, false);
  }
  if (!place_matched_[place]) {
    const std::string path = places.path(place);
    uint64_t mask = 0;
    for (size_t i = 0; i < collections_.size(); ++i) {
      if (std::regex_match(path, collections_[i].layers)) mask |= uint64_t{1} << i;
    }
    selected_by_place_[place] = mask;
    place_matched_[place] = true;
  }
  return selected_by_place_[place];
}

bool StatsCollector::reads(const Collection& c, size_t i, int64_t step, uint32_t place, fp8::Role role,
                           const frames::PlaceTable& places) {
  return ((selecting(place, places) >> i) & 1) && (c.roles >> static_cast<int>(role) & 1) && scheduled(c.options, step);
}

bool StatsCollector::wants(int64_t step, uint32_t place, fp8::Role role, const frames::PlaceTable& places) {
  for (size_t i = 0; i < collections_.size(); ++i) {
    if (reads(collections_[i], i, step, place, role, places)) return true;
  }
  return false;
}

bool StatsCollector::wants_tensor(int64_t step, uint32_t place, fp8::Role role, const frames::PlaceTable& places) {
  for (size_t i = 0; i < collections_.size(); ++i) {
    if (collections_[i].blockwise && reads(collections_[i], i, step, place, role, places)) return true;
  }
  return false;
}

void StatsCollector::add_tensor(uint32_t place, fp8::Role role, int64_t step, const at::Tensor& t,
                                const frames::PlaceTable& places, std::ostream& out) {
  step_ = step;
  for (size_t i = 0; i < collections_.size(); ++i) {
    Collection& c = collections_[i];
    if (!c.blockwise || !reads(c, i, step, place, role, places)) continue;
    double value = 0;
    std::string why;
    const auto outcome = stats::max_blockwise_dynamic_range(t, blockwise_of(c.options), value, why);
    if (outcome != stats::BlockwiseOutcome::Computed) {
      if (outcome == stats::BlockwiseOutcome::Undivided && !c.told_undivided) {
        c.told_undivided = true;
        out << fmt::format("{}: max_blockwise_dynamic_range of {} {} is not computed: {} (said once)\n", where(c.options),
                           places.path(place), fp8::role_name(role), why)
            << std::flush;
      }
      continue;
    }
    const auto key = std::make_tuple(i, place, static_cast<int>(role));
    auto [it, fresh] = blockwise_.try_emplace(key, value);
    if (!fresh) it->second = stats::nan_propagating_max(it->second, value);
  }
}

void StatsCollector::add(uint32_t place, fp8::Role role, int64_t step, const stats::MomentsAccumulator& moments) {
  step_ = step;
  slots_[std::make_pair(place, static_cast<int>(role))].combine(moments);
}

std::vector<StatRecord> StatsCollector::end_step(const std::vector<Fp8SlotMetrics>& fp8, const frames::PlaceTable& places) {
  std::vector<StatRecord> records;
  std::set<std::tuple<std::string, int, std::string>> seen;  // (layer, role, stat): once, whichever collection asks
  for (size_t i = 0; i < collections_.size(); ++i) {
    const Collection& c = collections_[i];
    if (!scheduled(c.options, step_)) continue;
    for (const auto& [key, moments] : slots_) {
      const auto [place, role_index] = key;
      const auto role = static_cast<fp8::Role>(role_index);
      if (!((selecting(place, places) >> i) & 1) || !((c.roles >> role_index) & 1)) continue;
      const std::string layer = places.path(place);
      for (Stat s : c.options.stats()) {
        const bool blockwise = s == Stat::MaxBlockwiseDynamicRange;
        const std::string name = blockwise ? stats::blockwise_range_name(blockwise_of(c.options)) : stat_name(s);
        if (!seen.emplace(layer, role_index, name).second) continue;
        double value;
        if (blockwise) {
          const auto found = blockwise_.find(std::make_tuple(i, place, role_index));
          if (found == blockwise_.end()) continue;  // not computed for this slot (said once)
          value = found->second;
        } else if (is_fp8_stat(s)) {
          auto m = std::find_if(fp8.begin(), fp8.end(), [&](const Fp8SlotMetrics& x) {
            return x.module_path == layer && x.role == fp8::role_name(role) && x.step == step_;
          });
          if (m == fp8.end()) continue;  // the probe did not read this slot in this step
          value = s == Stat::Underflows ? m->underflow_pct : m->overflow_pct;
        } else {
          if (moments.n == 0) continue;
          value = stat_value(s, moments);
        }
        records.push_back(StatRecord{step_, layer, fp8::role_name(role), name, value});
      }
    }
  }
  slots_.clear();
  blockwise_.clear();
  return records;
}

void StatsCollector::check_layers(const std::vector<std::string>& module_paths) const {
  for (const auto& c : collections_) {
    const bool any = std::any_of(module_paths.begin(), module_paths.end(),
                                 [&](const std::string& p) { return std::regex_match(p, c.layers); });
    if (!any) {
      throw OptionError(fmt::format("{}: layers '{}' match none of the model's {} modules", where(c.options),
                                    c.options.layers(), module_paths.size()));
    }
  }
}

std::vector<std::string> StatsCollector::describe(const std::vector<std::string>& module_paths) const {
  std::vector<std::string> lines;
  for (const auto& c : collections_) {
    std::vector<std::string> stats, roles, selected;
    for (Stat s : c.options.stats()) stats.push_back(stat_name(s));
    for (fp8::Role r : c.options.tensors()) roles.push_back(fp8::role_name(r));
    for (const auto& p : module_paths) {
      if (std::regex_match(p, c.layers)) selected.push_back(p.empty() ? "(root)" : p);
    }
    lines.push_back(fmt::format("collection {}{}: layers '{}' stats [{}] tensors [{}] freq {} start_step {} end_step {}",
                                c.options.name(), c.options.source().empty() ? "" : " (" + c.options.source() + ")",
                                c.options.layers(), fmt::join(stats, ", "), fmt::join(roles, ", "), c.options.freq(),
                                c.options.start_step(), c.options.end_step()));
    lines.push_back(fmt::format("  selected layers ({}): {}", selected.size(), fmt::join(selected, ", ")));
  }
  return lines;
}

Fp8Options fp8_options_for(const Options& options) {
  if (options.fp8().enabled()) return options.fp8();
  std::vector<const StatsCollection*> wanting;
  for (const auto& c : options.stats_collections()) {
    if (std::any_of(c.stats().begin(), c.stats().end(), is_fp8_stat)) wanting.push_back(&c);
  }
  if (wanting.empty()) return options.fp8();
  std::string layers;
  bool same_schedule = true;
  for (const auto* c : wanting) {
    layers += (layers.empty() ? "" : "|") + fmt::format("(?:{})", c->layers());
    same_schedule = same_schedule && c->freq() == wanting[0]->freq() && c->start_step() == wanting[0]->start_step() &&
                    c->end_step() == wanting[0]->end_step();
  }
  Fp8Options fp8 = options.fp8();
  fp8.enabled(true).layers(layers).overflow_alarm(INFINITY).drift_alarm(INFINITY);
  if (same_schedule) {
    fp8.freq(wanting[0]->freq()).start_step(wanting[0]->start_step()).end_step(wanting[0]->end_step());
  } else {
    fp8.freq(1).start_step(0).end_step(-1);
  }
  return fp8;
}

}  // namespace collect
}  // namespace sentinel

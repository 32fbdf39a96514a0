#pragma once
// The statistics collections (Options::stats_collections): per slot (module path x tensor role)
// and step, the menu of every use in the step combined, and at the step's end one record per
// collection, slot and statistic. Fed from the same read as the frame statistics.
#include <sentinel/loggers.h>
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <cstdint>
#include <map>
#include <ostream>
#include <tuple>
#include <regex>
#include <string>
#include <vector>

#include "frames/string_table.h"
#include "stats/blockwise_range.h"
#include "stats/stats_accumulator.h"

namespace at {
class Tensor;
}

namespace sentinel {
namespace collect {

class StatsCollector {
 public:
  // Throws sentinel::OptionError for an invalid regex, schedule or an empty list of statistics
  // or tensors, naming the collection and where it was configured.
  explicit StatsCollector(const std::vector<StatsCollection>& collections);

  bool enabled() const { return !collections_.empty(); }
  // Whether any collection reads this slot at this step.
  bool wants(int64_t step, uint32_t place, fp8::Role role, const frames::PlaceTable& places);
  // One use of the slot: its menu.
  void add(uint32_t place, fp8::Role role, int64_t step, const stats::MomentsAccumulator& moments);
  // Whether a collection reading this slot at this step wants Stat::MaxBlockwiseDynamicRange,
  // and then one use's tensor for it (a second read; `out` hears once per collection of a tensor
  // whose shape its blocks do not divide).
  bool wants_tensor(int64_t step, uint32_t place, fp8::Role role, const frames::PlaceTable& places);
  void add_tensor(uint32_t place, fp8::Role role, int64_t step, const at::Tensor& t, const frames::PlaceTable& places,
                  std::ostream& out);
  bool step_open() const { return !slots_.empty(); }
  // Closes the open step. `fp8` (the FP8 probe's metrics of the same step) gives underflows and
  // overflows; a slot the probe did not read gets no such records.
  std::vector<StatRecord> end_step(const std::vector<Fp8SlotMetrics>& fp8, const frames::PlaceTable& places);

  // Throws sentinel::OptionError when a collection's layers match none of the model's modules.
  void check_layers(const std::vector<std::string>& module_paths) const;
  // One line per collection: its layers, statistics, tensors, schedule and the modules it selects.
  std::vector<std::string> describe(const std::vector<std::string>& module_paths) const;

 private:
  struct Collection {
    StatsCollection options;
    std::regex layers;
    uint32_t roles = 0;  // bit per fp8::Role
    bool blockwise = false;  // lists Stat::MaxBlockwiseDynamicRange
    bool told_undivided = false;
  };
  bool reads(const Collection& c, size_t i, int64_t step, uint32_t place, fp8::Role role, const frames::PlaceTable& places);
  bool scheduled(const StatsCollection& c, int64_t step) const;
  uint64_t selecting(uint32_t place, const frames::PlaceTable& places);  // bit per collection

  std::vector<Collection> collections_;
  std::vector<uint64_t> selected_by_place_;
  std::vector<bool> place_matched_;
  std::map<std::pair<uint32_t, int>, stats::MomentsAccumulator> slots_;  // slots used in the open step
  // Stat::MaxBlockwiseDynamicRange of the open step by (collection, place, role): the max over uses.
  std::map<std::tuple<size_t, uint32_t, int>, double> blockwise_;
  int64_t step_ = -1;
};

// The value of one statistic from a slot's menu (Underflows/Overflows are not in it: NaN).
double stat_value(Stat stat, const stats::MomentsAccumulator& m);

// The FP8 probe the collections need for their underflows and overflows when Options::fp8 is
// off: on for the layers and steps they select, without alarms. Else Options::fp8 itself.
Fp8Options fp8_options_for(const Options& options);

}  // namespace collect
}  // namespace sentinel

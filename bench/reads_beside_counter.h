#pragma once
// How many inputs a watched case read on the second thread beside their op, per iteration (0 when
// no core is left idle or Options::read_inputs_beside_ops is off).
#include <benchmark/benchmark.h>
#include <sentinel/report.h>

namespace bench {

inline void count_reads_beside(benchmark::State& state, const sentinel::DeviceCounters& c) {
  state.counters["read_beside"] =
      benchmark::Counter(static_cast<double>(c.tensors_read_beside_ops), benchmark::Counter::kAvgIterations);
}

}  // namespace bench

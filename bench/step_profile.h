#pragma once
// Where a step's GPU time goes, from PyTorch's own profiler (Kineto, through CUPTI): the device
// activities of one step (kernels, copies, memsets), their summed durations, the union of their
// intervals (the time the GPU was busy) and the span from the first start to the last end. A
// watched step that is busy about as long as the unwatched one but spans longer waits on the host;
// one busier by about its sentinel kernels' time waits on the reads themselves.
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace bench {

struct StepProfile {
  double span_ms = 0, busy_ms = 0, device_ms = 0, sentinel_ms = 0;
  int64_t activities = 0, sentinel_kernels = 0;
};

// `trace_path`, when given, gets the step's timeline as a Chrome trace (chrome://tracing, Perfetto).
inline StepProfile profile_step(const std::function<void()>& step, const std::string& trace_path = "") {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  step();
  torch::cuda::synchronize();
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!trace_path.empty()) result->save(trace_path);
  StepProfile p;
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  for (const prof::KinetoEvent& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA || e.endNs() <= e.startNs()) continue;
    intervals.emplace_back(e.startNs(), e.endNs());
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    p.device_ms += ms;
    ++p.activities;
    if (e.name().find("sentinel") != std::string::npos) {
      p.sentinel_ms += ms;
      ++p.sentinel_kernels;
    }
  }
  std::sort(intervals.begin(), intervals.end());
  uint64_t busy = 0, open_start = 0, open_end = 0;
  for (const auto& [start, end] : intervals) {
    if (start > open_end) {
      busy += open_end - open_start;
      open_start = start;
      open_end = end;
    } else {
      open_end = std::max(open_end, end);
    }
  }
  busy += open_end - open_start;
  p.busy_ms = static_cast<double>(busy) / 1e6;
  if (!intervals.empty()) {
    uint64_t last = 0;
    for (const auto& i : intervals) last = std::max(last, i.second);
    p.span_ms = static_cast<double>(last - intervals.front().first) / 1e6;
  }
  return p;
}

}  // namespace bench

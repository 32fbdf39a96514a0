#pragma once
// Page faults per iteration of a case (minor faults: memory the process touches for the first
// time since malloc took it from the kernel). glibc gives freed memory back to the kernel when the
// top of its heap is free beyond a threshold, and the next allocation faults it in again, page by
// page; how often depends on the order of every allocation and free in the process. Shown with
// each model case so that a difference in time between two cases can be told apart from a
// difference in what malloc did.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

namespace bench {

class PageFaults {
 public:
  explicit PageFaults(benchmark::State& state) : state_(state), start_(minor_faults()) {}
  ~PageFaults() {
    state_.counters["page_faults"] =
        benchmark::Counter(static_cast<double>(minor_faults() - start_), benchmark::Counter::kAvgIterations);
  }
  PageFaults(const PageFaults&) = delete;
  PageFaults& operator=(const PageFaults&) = delete;

 private:
  static long minor_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  }
  benchmark::State& state_;
  long start_;
};

}  // namespace bench

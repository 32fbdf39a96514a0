#pragma once
#include <sentinel/options.h>

namespace sentinel {
namespace cli {

// `sentinel demo fp8`: a projection whose input amax grows from step to step, so delayed scaling
// lags behind it. Prints each step's FP8 metrics and where the alarms fire; returns the exit code
// (3 when an alarm fired).
int run_fp8_demo(const Options& options);

}  // namespace cli
}  // namespace sentinel

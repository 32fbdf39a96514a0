#pragma once
// Reports and trace diffs as single HTML pages: styles, script and plots (inline SVG) are in the
// file itself, so a page opens offline, from a CI artifact or an e-mail, exactly as it was written.
#include <sentinel/report.h>

#include <string>
#include <vector>

#include "report/trace_diff.h"

namespace sentinel {
namespace report {

// The report's header, a plot of each frame's largest and smallest non-zero magnitudes against
// the fp16/bf16/FP8 limits, the frame table, the headroom summary, the call stacks and, when FP8
// is watched, per-slot plots over `fp8_history` (the metrics log) and `report.fp8_metrics`.
std::string render_html(const Report& report, const std::vector<Fp8SlotMetrics>& fp8_history = {});

// The verdict, a plot of each matched frame's worst relative difference against the tolerance,
// the matched frames and the frames found in one trace only.
std::string render_diff_html(const TraceDiff& diff);

}  // namespace report
}  // namespace sentinel

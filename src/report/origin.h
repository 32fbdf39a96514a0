#pragma once
// The `origin:` line: whether the report's trigger frame made the first inf/nan or passed on one
// it was given. Works on the plain report values alone.
#include <sentinel/report.h>

namespace sentinel {
namespace report {

// Sets report.batch_number, produced_here and origin from report.trigger().
void describe_origin(Report& report);

}  // namespace report
}  // namespace sentinel

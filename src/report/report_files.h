#pragma once
#include <sentinel/report.h>

#include <string>

namespace sentinel {
namespace report {

// Creates the directory and proves it writable; throws sentinel::OptionError naming it if not.
void prepare_report_dir(const std::string& dir);
// Writes <dir>/sentinel_batch<N>.txt and .json; returns "" or what went wrong (never throws:
// the report must not be lost because a file could not be written).
std::string write_report_files(const std::string& dir, const Report& report, const std::string& text);

}  // namespace report
}  // namespace sentinel

#pragma once
// The Python keyword arguments of overflow_sentinel's watchdogs, as sentinel::Options, read
// through the option tables (options/option_table.h, docs/options.md): the nested ones (fp8,
// dumps, ranks, stats_collections) take dicts, enums their names as strings ("warn", "e4m3",
// "mxfp8"). An unknown name raises TypeError, a value of the wrong type TypeError naming the
// argument, a value out of range ValueError (sentinel::OptionError).
#include <pybind11/pybind11.h>

#include <sentinel/options.h>

namespace sentinel {
namespace python {

// Applies `kwargs` on top of `options`. `callback` is handled by the caller (it needs the GIL).
void apply_options(Options& options, const pybind11::dict& kwargs);

// The names apply_options takes, for messages and the docs' test.
std::vector<std::string> option_names();

}  // namespace python
}  // namespace sentinel

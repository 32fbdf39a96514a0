#pragma once
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include <pybind11/pybind11.h>

namespace sentinel {
namespace python {

// At most this many Python lines in a report (innermost first).
constexpr size_t kMaxPythonLines = 20;

// Makes reports carry the Python stack of the thread that ran the op (report::python_call_stack).
void install_python_stack_source();

// A frame as Python names it: file, line, function.
using PythonFrame = std::tuple<std::string, int, std::string>;

// While a replay runs a call again (overflow_sentinel/_replay.py), the frames from the one running
// `replaying` outward are the replay's and the code that raised, not the call's: this thread's
// stacks stop there and go on with `call_site`, the frames the call was made from (innermost
// first, shown as a report shows its own). `replaying` None: as they are.
void set_replayed_call_site(pybind11::handle replaying, const std::vector<PythonFrame>& call_site);

}  // namespace python
}  // namespace sentinel

#pragma once
#include <cstddef>

namespace sentinel {
namespace python {

// At most this many Python lines in a report (innermost first).
constexpr size_t kMaxPythonLines = 20;

// Makes reports carry the Python stack of the thread that ran the op (report::python_call_stack).
void install_python_stack_source();

}  // namespace python
}  // namespace sentinel

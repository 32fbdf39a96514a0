#pragma once
// Where in the user's code an op ran: collected only when inf/nan is detected.
#include <string>
#include <vector>

namespace sentinel {
namespace report {

// The calling thread's C++ stack, innermost first, demangled; runs of the sentinel's, LibTorch's
// and the standard library's frames collapse into one "[... N library frames]" line.
std::vector<std::string> user_call_stack(size_t max_lines = 40);
// The TorchScript call stack of the op running on this thread ("file:line: source"), innermost
// first; empty outside TorchScript.
std::vector<std::string> torchscript_call_stack();

// The Python stack of the calling thread, innermost first, from the source the Python module
// installs at import (it takes the GIL: called only at detection). Empty without one.
using PythonStackSource = std::vector<std::string> (*)();
void set_python_stack_source(PythonStackSource source);
std::vector<std::string> python_call_stack();

}  // namespace report
}  // namespace sentinel

// The Python source lines that ran an op, taken when the op's inf/nan is detected: the only time
// a watchdog made from Python takes the GIL inside LibTorch's callbacks.
#include "python/python_stack.h"

#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include "report/stack_trace.h"

namespace py = pybind11;

namespace sentinel {
namespace python {

namespace {

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// torch's own Python files (module calls, autograd's entry points), found at import.
std::string& torch_dir() {
  static std::string* dir = new std::string;  // never destroyed: read until the process ends
  return *dir;
}

// Frames of the machinery between the user's line and the op: torch's and this package's.
bool is_machinery(const std::string& file) {
  return (!torch_dir().empty() && file.rfind(torch_dir(), 0) == 0) ||
         file.find("/overflow_sentinel/") != std::string::npos || file.rfind("<frozen ", 0) == 0;
}

std::vector<std::string> python_stack() {
  std::vector<std::string> lines;
  if (!Py_IsInitialized() || finalizing()) return lines;
  py::gil_scoped_acquire gil;  // this thread's own state: its frames are the code that ran the op
  try {
    auto linecache = py::module_::import("linecache");
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    while (frame != nullptr && lines.size() < kMaxPythonLines) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
      const auto owned_code = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(code));
      const std::string file = py::str(owned_code.attr("co_filename"));
      const std::string function = py::str(owned_code.attr("co_name"));
      const int line = PyFrame_GetLineNumber(frame);
      if (!is_machinery(file)) {
        std::string source = py::str(linecache.attr("getline")(file, line).attr("strip")());
        lines.push_back(fmt::format("{}:{}: {}  (in {})", file, line, source, function));
      }
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(frame);
  } catch (const py::error_already_set&) {
    // What was collected is kept; the error is cleared (the report must not fail over it).
  }
  return lines;
}

}  // namespace

void install_python_stack_source() {
  auto os_path = py::module_::import("os.path");
  const auto torch_file = py::module_::import("torch").attr("__file__");
  torch_dir() = py::str(os_path.attr("dirname")(torch_file)).cast<std::string>() + "/";
  report::set_python_stack_source(&python_stack);
}

}  // namespace python
}  // namespace sentinel

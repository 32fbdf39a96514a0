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

// A replayed call's site on this thread (set_replayed_call_site): a borrowed code object, kept
// alive by the replay's own function, and the lines that stand for the frames from it outward.
struct ReplayedCall {
  PyObject* replaying = nullptr;
  std::vector<std::string> call_site;
};
thread_local ReplayedCall replayed_call;

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

std::string frame_line(const py::module_& linecache, const std::string& file, int line, const std::string& function) {
  const std::string source = py::str(linecache.attr("getline")(file, line).attr("strip")());
  return fmt::format("{}:{}: {}  (in {})", file, line, source, function);
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
      if (replayed_call.replaying != nullptr && owned_code.ptr() == replayed_call.replaying) {
        for (const std::string& line : replayed_call.call_site) {
          if (lines.size() == kMaxPythonLines) break;
          lines.push_back(line);
        }
        break;
      }
      const std::string file = py::str(owned_code.attr("co_filename"));
      if (!is_machinery(file)) {
        lines.push_back(frame_line(linecache, file, PyFrame_GetLineNumber(frame), py::str(owned_code.attr("co_name"))));
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

void set_replayed_call_site(py::handle replaying, const std::vector<PythonFrame>& call_site) {
  replayed_call.replaying = replaying.is_none() ? nullptr : replaying.ptr();
  replayed_call.call_site.clear();
  if (replaying.is_none()) return;
  auto linecache = py::module_::import("linecache");
  for (const auto& [file, line, function] : call_site) {
    if (!is_machinery(file)) replayed_call.call_site.push_back(frame_line(linecache, file, line, function));
  }
}

void install_python_stack_source() {
  auto os_path = py::module_::import("os.path");
  const auto torch_file = py::module_::import("torch").attr("__file__");
  torch_dir() = py::str(os_path.attr("dirname")(torch_file)).cast<std::string>() + "/";
  report::set_python_stack_source(&python_stack);
}

}  // namespace python
}  // namespace sentinel

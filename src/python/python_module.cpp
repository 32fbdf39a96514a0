// overflow_sentinel._native: the watchdog for Python models (python/overflow_sentinel wraps it in
// HF's DebugUnderflowOverflow and the watch() context manager).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <sentinel/errors.h>
#include <sentinel/version.h>

#include "capture/op_call.h"
#include "python/python_options.h"
#include "python/python_stack.h"
#include "python/python_watch.h"

namespace py = pybind11;
using sentinel::python::PythonWatch;

PYBIND11_MODULE(_native, m) {
  m.doc() = "Overflow Sentinel's native watchdog for Python models";
  m.attr("__version__") = SENTINEL_VERSION_STRING;
  m.attr("report_schema_version") = SENTINEL_REPORT_SCHEMA_VERSION;
  sentinel::python::install_python_stack_source();

  // What the user got wrong is a ValueError naming it; a missing or unreadable file an OSError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sentinel::OptionError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const sentinel::InputError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    }
  });

  py::class_<PythonWatch>(m, "Watch")
      .def(py::init<py::handle, const py::dict&, py::object, py::object>(), py::arg("model"), py::arg("options"),
           py::arg("config") = py::none(), py::arg("callback") = py::none())
      .def("take_modules", &PythonWatch::take_modules)
      .def("enter", &PythonWatch::enter)
      .def("leave", &PythonWatch::leave)
      .def("begin_batch", &PythonWatch::begin_batch)
      .def("end_batch", &PythonWatch::end_batch)
      .def("check", &PythonWatch::check)
      .def("after_backward", &PythonWatch::after_backward)
      .def("take_text", &PythonWatch::take_text)
      .def("close", &PythonWatch::close)
      .def_property_readonly("closed", &PythonWatch::closed)
      .def_property_readonly("batch_number", &PythonWatch::batch_number)
      .def("last_report_json", &PythonWatch::last_report_json)
      .def("fp8_metrics_json", &PythonWatch::fp8_metrics_json)
      .def("saved_frames_json", &PythonWatch::saved_frames_json)
      .def("describe_headroom", &PythonWatch::describe_headroom);

  m.def("option_names", &sentinel::python::option_names, "The keyword arguments the watchdogs take.");
  // For tests: whether LibTorch still holds op callbacks (global or on this thread).
  m.def("record_function_callbacks_installed", &sentinel::capture::callbacks_installed);
}

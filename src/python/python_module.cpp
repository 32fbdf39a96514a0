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
#include "stats/tensor_stats.h"

namespace py = pybind11;
using sentinel::python::PythonWatch;

namespace {

// Raises overflow_sentinel._errors.<name>, made from the message (a report's text, for the errors
// that carry one) and the report as JSON.
void raise_sentinel_error(const char* name, const std::string& message, const sentinel::Report* report) {
  try {
    const py::object cls = py::module_::import("overflow_sentinel._errors").attr(name);
    const py::object json = report ? py::object(py::str(sentinel::render_json(*report))) : py::object(py::none());
    const py::object error = cls.attr("_from_native")(message, json);
    PyErr_SetObject(cls.ptr(), error.ptr());
  } catch (py::error_already_set& e) {
    e.restore();  // the module could not make it: that error is raised instead
  }
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Overflow Sentinel's native watchdog for Python models";
  m.attr("__version__") = SENTINEL_VERSION_STRING;
  m.attr("report_schema_version") = SENTINEL_REPORT_SCHEMA_VERSION;
  sentinel::python::install_python_stack_source();

  // Every error of the native side is mapped to Python here, once: a mistake in the options is a
  // ValueError naming it, a missing or unreadable file an OSError, and what a watchdog detects
  // the class of overflow_sentinel._errors that carries its report.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sentinel::NonFiniteError& e) {
      raise_sentinel_error("NonFiniteError", e.what(), &e.report());
    } catch (const sentinel::Fp8AlarmError& e) {
      raise_sentinel_error("Fp8AlarmError", e.what(), &e.report());
    } catch (const sentinel::RanksMissingError& e) {
      raise_sentinel_error("RanksMissingError", e.what(), &e.report());
    } catch (const sentinel::AbortAfterBatch& e) {
      raise_sentinel_error("AbortAfterBatch", e.what(), nullptr);
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
      .def("leave", &PythonWatch::leave, py::arg("module"), py::arg("output"), py::arg("arguments") = py::none(),
           py::arg("written") = py::none())
      .def("tolerated_json", &PythonWatch::tolerated_json)
      .def("begin_batch", &PythonWatch::begin_batch)
      .def("end_batch", &PythonWatch::end_batch)
      .def("check", &PythonWatch::check)
      .def("after_backward", &PythonWatch::after_backward)
      .def("check_gradients", &PythonWatch::check_gradients)
      .def("meet_after_backward", &PythonWatch::meet_after_backward)
      .def("take_text", &PythonWatch::take_text)
      .def("close", &PythonWatch::close)
      .def_property_readonly("closed", &PythonWatch::closed)
      .def_property_readonly("exact", &PythonWatch::exact)
      .def_property_readonly("warns", &PythonWatch::warns)
      .def_property_readonly("watching_ops", &PythonWatch::watching_ops)
      .def_property_readonly("batch_number", &PythonWatch::batch_number)
      .def("set_batch_number", &PythonWatch::set_batch_number)
      .def("set_phase", &PythonWatch::set_phase)
      .def("set_inside_compiled_code", &PythonWatch::set_inside_compiled_code)
      .def("watch_loop_ops", &PythonWatch::watch_loop_ops)
      .def("set_compiler_running", &PythonWatch::set_compiler_running)
      .def("read_call_arguments", &PythonWatch::read_call_arguments)
      .def("check_written", &PythonWatch::check_written)
      .def("read_magnitude", &PythonWatch::read_magnitude)
      .def("proven_finite", &PythonWatch::proven_finite)
      .def("read_compiled_output", &PythonWatch::read_compiled_output)
      .def("name_tensors", &PythonWatch::name_tensors)
      .def("last_report_json", &PythonWatch::last_report_json)
      .def("fp8_metrics_json", &PythonWatch::fp8_metrics_json)
      .def("saved_frames_json", &PythonWatch::saved_frames_json)
      .def("describe_headroom", &PythonWatch::describe_headroom);

  m.def("option_names", &sentinel::python::option_names, "The keyword arguments the watchdogs take.");
  m.def(
      "count_nonfinite",
      [](const std::vector<at::Tensor>& tensors) {
        std::vector<sentinel::TensorStats> stats(tensors.size());
        std::vector<sentinel::stats::Readability> readable(tensors.size());
        {
          py::gil_scoped_release unlocked;
          sentinel::stats::compute_many(tensors, stats.data(), readable.data());
        }
        int64_t count = 0;
        for (size_t i = 0; i < tensors.size(); ++i) {
          count += readable[i] == sentinel::stats::Readability::Read && !stats[i].finite();
        }
        return count;
      },
      "How many of the tensors hold inf or NaN, read by the watchdog's own pass (bench/boundary_rows.py "
      "measures what reading at module boundaries costs with it).");
  m.def("set_replayed_call_site", &sentinel::python::set_replayed_call_site,
        "While a replay runs a call again: the stacks of this thread stop at the frame running the code "
        "`replaying` and go on with `call_site` (None: as they are).");
  // For tests: whether LibTorch still holds op callbacks (global or on this thread).
  m.def("record_function_callbacks_installed", &sentinel::capture::callbacks_installed);
}

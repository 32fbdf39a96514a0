#include "python/python_containers.h"

#include <torch/csrc/autograd/python_variable.h>

#include <fmt/format.h>

namespace py = pybind11;

namespace sentinel {
namespace python {

namespace {

// Deep enough for a Cache in a ModelOutput in a tuple (output[0].past_key_values.layers[3].keys)
// and an encoder-decoder cache one level more; bounded so that an odd object graph costs little.
constexpr int kMaxDepth = 7;
constexpr size_t kMaxTensors = 1024;

// HF's analyse_variable: a tensor and None are shown; anything else is "not a tensor".
bool opaque(py::handle v) { return !v.is_none() && !THPVariable_Check(v.ptr()); }

// Values that hold no tensor and are common as arguments: passed over without a look inside.
bool plain(py::handle v) {
  PyObject* o = v.ptr();
  return o == Py_None || PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o) || PyUnicode_Check(o) ||
         PyBytes_Check(o) || PyType_Check(o) || PyModule_Check(o) || PyCallable_Check(o);
}

void walk(py::handle v, std::string& path, NamedTensors& out, int depth) {
  if (out.size() >= kMaxTensors) return;
  if (THPVariable_Check(v.ptr())) {
    out.emplace_back(path, THPVariable_Unpack(v.ptr()));
    return;
  }
  if (depth >= kMaxDepth || plain(v)) return;
  const auto inside = [&](const std::string& step, py::handle item) {
    const size_t length = path.size();
    path += step;
    walk(item, path, out, depth + 1);
    path.resize(length);
  };
  PyObject* o = v.ptr();
  if (PyTuple_Check(o) || PyList_Check(o)) {
    size_t i = 0;
    for (auto item : v) inside(fmt::format("[{}]", i++), item);
  } else if (PyDict_Check(o)) {
    // A ModelOutput's keys are its attributes (output.logits); a plain dict's are keys.
    const bool attributes = !PyDict_CheckExact(o);
    for (auto item : v.cast<py::dict>()) {
      const bool by_name = attributes && py::isinstance<py::str>(item.first) && py::hasattr(v, item.first);
      inside(by_name ? "." + item.first.cast<std::string>() : fmt::format("[{}]", py::repr(item.first).cast<std::string>()),
             item.second);
    }
  } else if (PyObject* attributes = PyObject_GenericGetDict(o, nullptr)) {
    // An object's own public attributes (a Cache's layers; a layer's keys and values).
    py::dict own = py::reinterpret_steal<py::dict>(attributes);
    for (auto item : own) {
      if (!py::isinstance<py::str>(item.first)) continue;
      const std::string name = item.first.cast<std::string>();
      if (!name.empty() && name[0] != '_') inside("." + name, item.second);
    }
  } else {
    PyErr_Clear();  // no __dict__: nothing inside to name
  }
}

}  // namespace

bool has_opaque_arguments(py::handle arguments) {
  if (!PyTuple_Check(arguments.ptr())) return opaque(arguments);
  for (auto item : arguments) {
    if (opaque(item)) return true;
  }
  return false;
}

bool opaque_result(py::handle result) {
  if (!PyTuple_Check(result.ptr())) return opaque(result);
  for (auto item : result) {
    if (PyTuple_Check(item.ptr())) {
      for (auto inner : item) {
        if (opaque(inner)) return true;
      }
    } else if (opaque(item)) {
      return true;
    }
  }
  return false;
}

void opaque_arguments(py::handle arguments, NamedTensors& out) {
  if (!PyTuple_Check(arguments.ptr())) return named_tensors(arguments, "input", out);
  size_t i = 0;
  for (auto item : arguments) {
    if (opaque(item)) named_tensors(item, fmt::format("input[{}]", i), out);
    ++i;
  }
}

void named_tensors(py::handle value, const std::string& root, NamedTensors& out) {
  std::string path = root;
  walk(value, path, out, 0);
}

}  // namespace python
}  // namespace sentinel

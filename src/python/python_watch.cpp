#include "python/python_watch.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/nn/module.h>

#include <pybind11/stl.h>

#include <fmt/format.h>

#include <unordered_map>

#include <sentinel/errors.h>
#include <sentinel/report.h>
#include <sentinel/scope_stack.h>

#include "python/python_containers.h"
#include "python/python_options.h"

namespace py = pybind11;

namespace sentinel {
namespace python {

namespace {

// Whether Python's watchdogs watch every op unless told otherwise (exact=False: module
// boundaries, and a replay at an inf/nan).
constexpr bool kPythonWatchesEveryOp = false;

struct MirrorBuild {
  std::unordered_map<PyObject*, std::shared_ptr<torch::nn::Module>> made;
  std::vector<std::shared_ptr<torch::nn::Module>>& mirrors;
  py::list& modules;
};

// A module shared by two parents (tied layers) gets one mirror, named where named_modules()
// first meets it.
std::shared_ptr<torch::nn::Module> mirror_of(py::handle module, MirrorBuild& build) {
  if (auto it = build.made.find(module.ptr()); it != build.made.end()) return it->second;
  // (the user's class: fully_shard's FSDP<Class> is named by <Class>)
  const std::string cls = py::str(py::module_::import("overflow_sentinel._fsdp").attr("user_class_name")(module));
  auto node = std::make_shared<torch::nn::Module>(cls);
  build.made.emplace(module.ptr(), node);
  build.mirrors.push_back(node);
  build.modules.append(module);
  for (auto item : module.attr("named_parameters")(py::arg("recurse") = false)) {
    const auto pair = item.cast<py::tuple>();
    if (pair[1].is_none()) continue;
    const at::Tensor tensor = pair[1].cast<at::Tensor>();
    node->register_parameter(pair[0].cast<std::string>(), tensor, tensor.requires_grad());
  }
  for (auto item : module.attr("named_children")()) {
    const auto pair = item.cast<py::tuple>();
    if (pair[1].is_none()) continue;
    node->register_module(pair[0].cast<std::string>(), mirror_of(pair[1], build));
  }
  return node;
}

}  // namespace

PythonWatch::PythonWatch(py::handle model, const py::dict& kwargs, py::object config, py::object callback) {
  if (!py::isinstance(model, py::module_::import("torch.nn").attr("Module"))) {
    throw py::type_error(fmt::format("overflow_sentinel: model must be a torch.nn.Module, not {}",
                                     py::str(py::type::of(model).attr("__name__")).cast<std::string>()));
  }
  // Python's default tier (Options::exact).
  Options defaults;
  defaults.exact(kPythonWatchesEveryOp);
  Options options = config.is_none() ? defaults : Options::from_yaml(py::str(config), defaults);
  apply_options(options, kwargs);
  if (!callback.is_none()) {
    if (!PyCallable_Check(callback.ptr())) throw py::type_error("overflow_sentinel: callback must be callable");
    // Called by the watchdog without its lock, on the thread that detected: the GIL is taken
    // here, and the report handed over as its JSON (the Python side makes it an object).
    // Released with the GIL held, wherever the watchdog goes (close() gives the GIL up).
    std::shared_ptr<py::object> held(new py::object(std::move(callback)), [](py::object* o) {
      if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
      py::gil_scoped_acquire gil;
      delete o;
    });
    options.callback([held](const Report& report) {
      py::gil_scoped_acquire gil;
      try {
        (*held)(render_json(report), render_text(report));
      } catch (py::error_already_set& e) {
        throw std::runtime_error(e.what());
      }
    });
  }
  options.output(out_);
  MirrorBuild build{{}, mirrors_, python_modules_};
  auto root = mirror_of(model, build);
  watchdog_ = std::make_unique<Watchdog>(root, std::move(options));
  watchdog_->set_every_forward_scoped(true);  // each module's hooks scope its forward
  watchdog_->set_local_tensor_reader(local_tensor_of);
}

at::Tensor PythonWatch::local_tensor_of(const at::Tensor& t) {
  // A DTensor (FSDP2's parameters, their gradients and optimizer states) keeps this rank's shard
  // as `_local_tensor`; other subclasses have no memory of their own to read.
  if (!Py_IsInitialized()) return at::Tensor();
  py::gil_scoped_acquire gil;
  try {
    py::object wrapped = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
    if (!wrapped || !py::hasattr(wrapped, "_local_tensor")) return at::Tensor();
    py::object local = wrapped.attr("_local_tensor");
    return THPVariable_Check(local.ptr()) ? THPVariable_Unpack(local.ptr()) : at::Tensor();
  } catch (const py::error_already_set&) {
    return at::Tensor();  // (an attribute that raised: labelled, not read)
  }
}

PythonWatch::~PythonWatch() {
  try {
    close();
  } catch (...) {
  }
}

Watchdog& PythonWatch::live() const {
  if (!watchdog_) throw py::value_error("overflow_sentinel: this watchdog was closed");
  return *watchdog_;
}

template <typename Body>
void PythonWatch::without_gil(Body&& body) {
  // The GIL is given up while the watchdog's lock may be waited for (see the header); it is taken
  // again before an exception leaves, for the translator that raises it in Python.
  py::gil_scoped_release no_gil;
  body();
}

void PythonWatch::enter(size_t module, py::handle arguments) {
  if (module >= mirrors_.size()) throw py::index_error("overflow_sentinel: no such module");
  if (has_opaque_arguments(arguments)) {
    // A cache handed from layer to layer is read where it is first met in the batch, not again
    // at every layer: its tensors are read by the ops that use them anyway.
    NamedTensors found, fresh;
    opaque_arguments(arguments, found);
    for (auto& named : found) {
      const at::Tensor& t = named.second;
      if (!t.defined()) continue;
      // (Inference tensors keep no version: they cannot be written outside inference mode.)
      const HandedIn key{t.unsafeGetTensorImpl(), t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr,
                         t.is_inference() ? 0u : t.unsafeGetTensorImpl()->version_counter().current_version()};
      if (handed_in_.insert(key).second) fresh.push_back(std::move(named));
    }
    if (!fresh.empty()) {
      Watchdog& w = live();
      without_gil([&] { w.module_boundary(*mirrors_[module], /*returning=*/false, fresh); });
    }
  }
  enter_scope(*mirrors_[module]);
}

namespace {

// The tensors in what a forward returned, a few levels deep (a ModelOutput is a dict).
void tensors_in(py::handle value, std::vector<at::Tensor>& out, int depth = 0) {
  if (THPVariable_Check(value.ptr())) {
    out.push_back(THPVariable_Unpack(value.ptr()));
  } else if (depth < 4 && (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value))) {
    for (auto item : value) tensors_in(item, out, depth + 1);
  } else if (depth < 4 && py::isinstance<py::dict>(value)) {
    for (auto item : value.cast<py::dict>()) tensors_in(item.second, out, depth + 1);
  }
}

}  // namespace

bool PythonWatch::leave(size_t module, py::handle output, py::handle arguments, py::handle written) {
  if (module >= mirrors_.size()) throw py::index_error("overflow_sentinel: no such module");
  Watchdog& w = live();
  if (!ops_watched_ && batch_) {
    NamedTensors handed, returned, buffers;
    if (!arguments.is_none()) named_tensors(arguments, "input", handed);
    named_tensors(output, "output", returned);
    if (!written.is_none()) {
      for (auto item : written) {
        const auto pair = item.cast<py::tuple>();
        buffers.emplace_back(pair[0].cast<std::string>(), pair[1].cast<at::Tensor>());
      }
    }
    if (!returned.empty() || !buffers.empty()) {
      without_gil([&] { w.module_returned(*mirrors_[module], handed, returned, buffers); });
    }
  } else if (opaque_result(output)) {
    // What HF shows as "not a tensor" (a ModelOutput, a cache): its tensors, named, in a frame.
    NamedTensors found;
    named_tensors(output, "output", found);
    if (!found.empty()) without_gil([&] { w.module_boundary(*mirrors_[module], /*returning=*/true, found); });
  } else {
    bool tolerating = false;
    without_gil([&] { tolerating = w.tolerating(); });  // the watchdog's lock: never waited for with the GIL
    if (tolerating) {
      std::vector<at::Tensor> tensors;
      tensors_in(output, tensors);
      if (!tensors.empty()) without_gil([&] { w.returned(*mirrors_[module], tensors); });
    }
  }
  leave_scope(*mirrors_[module]);
  return text_.waiting();
}

template <typename Read>
void PythonWatch::read_named(size_t module, py::handle value, const char* root, Read&& read) {
  if (module >= mirrors_.size()) throw py::index_error("overflow_sentinel: no such module");
  NamedTensors found;
  named_tensors(value, root, found);
  if (found.empty()) return;
  Watchdog& w = live();
  without_gil([&] { read(w, *mirrors_[module], found); });
}

void PythonWatch::read_call_arguments(size_t module, py::handle arguments) {
  read_named(module, arguments, "input", [](Watchdog& w, const torch::nn::Module& m, const NamedTensors& found) {
    w.module_boundary(m, /*returning=*/false, found);
  });
}

void PythonWatch::read_compiled_output(size_t module, py::handle output) {
  read_named(module, output, "output", [](Watchdog& w, const torch::nn::Module& m, const NamedTensors& found) {
    w.compiled_call_returned(m, found);
  });
}

void PythonWatch::check_written(const std::string& what, const NamedTensors& tensors) {
  Watchdog& w = live();
  without_gil([&] { w.check_written(what, tensors); });
}

double PythonWatch::read_magnitude(const std::vector<at::Tensor>& tensors) const {
  const Watchdog& w = live();
  py::gil_scoped_release no_gil;
  return w.read_magnitude(tensors);
}

void PythonWatch::proven_finite(const std::vector<at::Tensor>& tensors, double bound) {
  Watchdog& w = live();
  without_gil([&] { w.proven_finite(tensors, bound); });
}

std::string PythonWatch::tolerated_json() const {
  Report holder;
  {
    Watchdog& w = live();
    py::gil_scoped_release no_gil;
    holder.tolerated = w.tolerated();
  }
  return render_json(holder);
}

void PythonWatch::begin_batch() {
  Watchdog& w = live();
  // A forward that raised never reached its end: its batch ends now, and what it caught (if the
  // exception was not already the sentinel's) is raised before the next batch starts.
  if (batch_) end_batch();
  handed_in_.clear();
  without_gil([&] {
    batch_.emplace(w.batch());
    ops_watched_ = w.watching_ops();
  });
}

void PythonWatch::end_batch() {
  live();
  if (!batch_) return;
  BatchGuard guard(std::move(*batch_));
  batch_.reset();
  // Modules an exception left before their end are left now (the model's own entries, each time
  // it was entered).
  while (leave_scope(*mirrors_.front())) {
  }
  without_gil([&] { guard.finish(); });
}

void PythonWatch::check() {
  Watchdog& w = live();
  without_gil([&] { w.check(); });
}

void PythonWatch::after_backward() {
  Watchdog& w = live();
  without_gil([&] { w.after_backward(); });
}

void PythonWatch::check_gradients() {
  Watchdog& w = live();
  without_gil([&] { w.check_gradients(); });
}

void PythonWatch::meet_after_backward() {
  Watchdog& w = live();
  without_gil([&] { w.meet_after_backward(); });
}

std::string PythonWatch::close() {
  if (!watchdog_) return text_.take();
  {
    py::gil_scoped_release no_gil;
    if (batch_) {
      BatchGuard guard(std::move(*batch_));
      batch_.reset();
      try {
        guard.finish();
      } catch (...) {
        // Said in the text already; closing never raises.
      }
    }
    watchdog_.reset();
  }
  mirrors_.clear();
  python_modules_ = py::list();
  return text_.take();
}

int64_t PythonWatch::batch_number() const { return live().batch_number(); }

void PythonWatch::name_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  Watchdog& w = live();
  without_gil([&] { w.name_tensors(tensors); });
}

void PythonWatch::set_phase(const std::string& phase) {
  Watchdog& w = live();
  without_gil([&] { w.set_phase(phase); });
}

void PythonWatch::watch_loop_ops(bool on) {
  Watchdog& w = live();
  without_gil([&] { w.watch_loop_ops(on); });
}

void PythonWatch::set_inside_compiled_code(bool inside) {
  Watchdog& w = live();
  without_gil([&] { w.set_inside_compiled_code(inside); });
}

void PythonWatch::set_compiler_running(bool running) {
  Watchdog& w = live();
  without_gil([&] { w.set_compiler_running(running); });
}

void PythonWatch::set_batch_number(int64_t next) {
  Watchdog& w = live();
  without_gil([&] { w.set_batch_number(next); });
}

py::object PythonWatch::last_report_json() const {
  std::optional<Report> report;
  {
    Watchdog& w = live();
    py::gil_scoped_release no_gil;
    report = w.last_report();
  }
  return report ? py::object(py::str(render_json(*report))) : py::object(py::none());
}

std::vector<std::string> PythonWatch::fp8_metrics_json() const {
  std::vector<Fp8SlotMetrics> metrics;
  {
    Watchdog& w = live();
    py::gil_scoped_release no_gil;
    metrics = w.fp8_metrics();
  }
  std::vector<std::string> out;
  for (const auto& m : metrics) out.push_back(fp8_metrics_json_line(m));
  return out;
}

std::string PythonWatch::saved_frames_json() const {
  Report frames;
  {
    Watchdog& w = live();
    py::gil_scoped_release no_gil;
    frames.frames = w.saved_frames();
  }
  frames.kind = "trace";
  return render_json(frames);
}

std::vector<std::string> PythonWatch::describe_headroom() const {
  HeadroomSummary h;
  {
    Watchdog& w = live();
    py::gil_scoped_release no_gil;
    h = w.headroom();
  }
  std::vector<std::string> out;
  out.push_back(fmt::format("frames checked {}, fp16 overflow {}, fp16 underflow {}, bf16 overflow {}, bf16 underflow {}",
                            h.frames_checked, h.frames_fp16_overflow, h.frames_fp16_underflow, h.frames_bf16_overflow,
                            h.frames_bf16_underflow));
  if (h.first_fp16_overflow) out.push_back("first fp16 overflow: " + render_frame_text(*h.first_fp16_overflow));
  if (h.first_bf16_overflow) out.push_back("first bf16 overflow: " + render_frame_text(*h.first_bf16_overflow));
  return out;
}

}  // namespace python
}  // namespace sentinel

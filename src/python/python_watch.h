#pragma once
// The native side of overflow_sentinel's watchdog: a sentinel::Watchdog over a C++ mirror of the
// user's Python model, driven by the module hooks the Python side registers.
//
// The mirror is one torch::nn::Module per Python module, named by its class, registered under the
// same child names and holding the very same parameter tensors: the watchdog indexes it as any
// C++-frontend model, so an op that uses a parameter is its module's, and its gradient nodes and
// .grad checks are the same as in C++. Ops that use no parameter (the mul between two
// sub-modules) take the innermost module being run: each module's forward pre-hook pushes its
// mirror on the thread's scope stack, its forward hook pops it.
//
// Every call that can wait on the watchdog's lock releases the GIL first: the watchdog takes the
// GIL (for the Python stack, or the user's callback) while it holds that lock.
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <unordered_set>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <sentinel/watchdog.h>

#include "python/text_buffer.h"

namespace sentinel {
namespace python {

// Hidden, as pybind11's own types are (the module exports only its init function).
class __attribute__((visibility("hidden"))) PythonWatch {
 public:
  // `kwargs`: Options by name (python_options.h); `config`: a YAML path or None, applied first.
  PythonWatch(pybind11::handle model, const pybind11::dict& kwargs, pybind11::object config,
              pybind11::object callback);
  ~PythonWatch();

  // The Python modules, in the order the hooks number them (the mirror of each), handed over once
  // and not kept: a reference held here, out of sight of Python's cycle collector, would keep the
  // model alive for as long as a watchdog that the model's own hooks keep alive.
  pybind11::list take_modules() { return std::exchange(python_modules_, pybind11::list()); }
  // Module i's forward starts / ends on this thread. leave returns whether text is waiting: every
  // trip prints its report, so the Python side then prints take_text() and calls check().
  // `arguments`, `output`: the forward's positional arguments and its result. Where HF's report
  // shows "not a tensor" (a ModelOutput, a cache), the tensors inside are read, named by their
  // path (Watchdog::module_boundary); otherwise the result's tensors are looked at by the place
  // rule (Watchdog::returned) while a value is tolerated.
  // In a batch that watches no op (Options::exact false), leave reads the module's whole forward,
  // `arguments` and `output`, as one frame (Watchdog::module_returned), with `written`: (name,
  // tensor) of the module's own buffers its forward may have written (None: none).
  void enter(size_t module, pybind11::handle arguments);
  bool leave(size_t module, pybind11::handle output, pybind11::handle arguments, pybind11::handle written);
  // Every tensor in module i's arguments (positional or keyword), read as a "call" frame
  // ("input[0]", "input['mask']"), judged as what the module was handed, after enter(): what
  // crosses a compiled call (whose kernels run no op that would read it), and the model's own
  // inputs in a batch that watches no op. And the tensors in a compiled call's result
  // (Watchdog::compiled_call_returned), before leave().
  void read_call_arguments(size_t module, pybind11::handle arguments);
  void read_compiled_output(size_t module, pybind11::handle output);
  // Watchdog::check_written: tensors written outside the ops watched (an optimizer's step), named.
  void check_written(const std::string& what, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  // Watchdog::read_magnitude: the largest magnitude in these tensors as last read, NaN if unknown.
  double read_magnitude(const std::vector<at::Tensor>& tensors) const;
  // Watchdog::proven_finite: what an optimizer's step wrote, proven no larger than `bound`.
  void proven_finite(const std::vector<at::Tensor>& tensors, double bound);
  // The values the place rule tolerated so far: a JSON report whose `tolerated` holds them.
  std::string tolerated_json() const;
  // What these detect is thrown as the library's errors, which the module's one exception
  // translator (python_module.cpp) raises as overflow_sentinel's classes.
  void begin_batch();
  void end_batch();
  void check();
  void after_backward();
  // Its two halves (Watchdog::check_gradients, meet_after_backward): a Trainer step raises at its end.
  void check_gradients();
  void meet_after_backward();
  void set_phase(const std::string& phase);
  void set_inside_compiled_code(bool inside);
  void watch_loop_ops(bool on);  // Watchdog::watch_loop_ops
  void set_compiler_running(bool running);
  std::string take_text() { return text_.take(); }
  // Ends an open batch, destroys the watchdog (its last FP8 step and device reads are
  // delivered) and returns what it printed meanwhile. Idempotent.
  std::string close();
  bool closed() const { return !watchdog_; }
  bool exact() const { return live().options().exact(); }
  bool warns() const { return live().options().action() == Action::Warn; }
  bool watching_ops() const { return ops_watched_; }  // in the open (or last) batch

  int64_t batch_number() const;
  void set_batch_number(int64_t next);
  // Watchdog::name_tensors: (name, tensor) pairs, an optimizer's state.
  void name_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  pybind11::object last_report_json() const;
  std::vector<std::string> fp8_metrics_json() const;
  std::string saved_frames_json() const;
  std::vector<std::string> describe_headroom() const;

 private:
  Watchdog& live() const;
  // Watchdog::set_local_tensor_reader: a DTensor's `_local_tensor` (taken under the GIL).
  static at::Tensor local_tensor_of(const at::Tensor& t);
  template <typename Body>
  void without_gil(Body&& body);
  // The tensors in `value`, named from `root`, handed to read(watchdog, module i, them) without
  // the GIL; nothing when there are none.
  template <typename Read>
  void read_named(size_t module, pybind11::handle value, const char* root, Read&& read);

  TextBuffer text_;  // before out_ and watchdog_: it outlives both
  std::ostream out_{&text_};
  std::vector<std::shared_ptr<torch::nn::Module>> mirrors_;  // mirrors_[i] stands for module i
  pybind11::list python_modules_;
  std::unique_ptr<Watchdog> watchdog_;
  std::optional<BatchGuard> batch_;
  bool ops_watched_ = true;  // by the open batch (Watchdog::watching_ops)
  // The tensors read in modules' arguments this batch, each as it was then (its version).
  struct HandedIn {
    const void* impl;
    const void* storage;
    uint32_t version;
    bool operator==(const HandedIn& o) const { return impl == o.impl && storage == o.storage && version == o.version; }
  };
  struct HashHandedIn {
    size_t operator()(const HandedIn& k) const {
      return std::hash<const void*>()(k.impl) ^ (std::hash<const void*>()(k.storage) * 31) ^ k.version;
    }
  };
  std::unordered_set<HandedIn, HashHandedIn> handed_in_;
};

}  // namespace python
}  // namespace sentinel

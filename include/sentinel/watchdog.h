#pragma once
// The watchdog: attach to a model, run it as usual, get a report at the first inf/nan.
//
//   auto debug = sentinel::DebugUnderflowOverflow(model);      // C++ frontend or TorchScript
//   auto y = debug.forward(x);                                 // one batch; throws NonFiniteError
//   debug.backward(loss);                                      // training: before optimizer.step()
//
// Or, in a loop that calls the model itself:
//   sentinel::Watchdog watch(model);
//   for (...) { auto step = watch.batch(); auto y = model->forward(x); ...; step.finish(); }
//
// Detaching is destroying the object: its RecordFunction callback is removed.
#include <sentinel/loggers.h>
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Module;
template <typename Contained>
class ModuleHolder;
}  // namespace nn
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch
namespace c10 {
struct IValue;
}
namespace at {
class Tensor;
}

namespace sentinel {

class Watchdog;

// One batch, from construction to finish() (or destruction). A batch's ops, and a training
// step's backward run inside it, carry its number. finish() ends it and throws what it caught.
class BatchGuard {
 public:
  BatchGuard(BatchGuard&& other) noexcept;
  BatchGuard& operator=(BatchGuard&&) = delete;
  BatchGuard(const BatchGuard&) = delete;
  // Ends the batch if finish() was not called; throws a pending error unless already unwinding.
  ~BatchGuard() noexcept(false);
  // Ends the batch; throws sentinel::NonFiniteError, sentinel::Fp8AlarmError or
  // sentinel::AbortAfterBatch if due.
  void finish();

 private:
  friend class Watchdog;
  explicit BatchGuard(Watchdog* owner);
  Watchdog* owner_;
  int uncaught_at_start_;
};

class Watchdog {
 public:
  Watchdog(std::shared_ptr<torch::nn::Module> model, Options options = Options());
  Watchdog(const torch::jit::Module& model, Options options = Options());
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Opens a batch on the calling thread (throws a pending error first).
  BatchGuard batch();
  // Throws what was detected since the last safe point, if anything.
  void check();
  // loss.backward(), then every parameter's .grad is checked, and what was detected in the
  // backward pass is thrown here - before the optimizer step can spread it into the weights.
  void backward(const at::Tensor& loss);
  // For callers that run the backward pass themselves (the Python module, after loss.backward()):
  // what backward() does once the pass has run.
  void after_backward();
  // after_backward() in its two halves, for a caller that raises only at its step's end (Trainer's
  // ranks under DDP: none may raise inside a backward whose gradient all-reduce the others wait
  // in). check_gradients() judges the parameters' .grad and throws nothing; meet_after_backward()
  // takes the ranks' round of the backward and throws what this rank, or another, found.
  void check_gradients();
  void meet_after_backward();
  // The number the next batch will get (= batches finished so far).
  int64_t batch_number() const;
  // The number the next batch gets, set between batches (>= 0): a training run resumed from a
  // checkpoint goes on numbering from its step. Throws std::logic_error while a batch is open.
  void set_batch_number(int64_t next);
  // What the batches opened from now on are, said in their reports (Report::phase): "evaluation"
  // for a Trainer's forwards between its steps; empty for none. The open batch keeps its own.
  void set_phase(std::string phase);
  // Code that writes tensors without bumping their version counters runs from now on (`inside`
  // true: torch.compile's generated kernels, which reuse buffers in place) or has returned: no
  // read kept from before serves a tensor after it, and none made inside is reused.
  void set_inside_compiled_code(bool inside);
  // torch.compile is compiling (`running` true until it has finished): the ops it runs itself
  // on real tensors while it traces (constants it folds, example values) are not the model's and
  // make no frame. The Python module follows dynamo's compile-start and compile-end callbacks.
  void set_compiler_running(bool running);
  // Every module's forward runs inside its module scope (the Python module's hooks scope each
  // one): an op then belongs to the innermost module running, whichever module's parameters it
  // reads (`F.linear(x, self.proj.weight)` is the caller's op, its entry named "proj.weight"). By
  // default a C++ model's ops that read a parameter belong to the module holding it, since its
  // children's forwards may run unscoped.
  void set_every_forward_scoped(bool scoped);
  // A tensor subclass whose elements are not in its own memory (a DTensor: the rank's shard is
  // its local tensor) is read through `local`, which returns the tensor holding this rank's
  // elements, or an undefined tensor when it knows none (the entry then says "tensor subclass:
  // not read"). Without a reader such tensors are labelled, never read. The Python module sets one.
  void set_local_tensor_reader(std::function<at::Tensor(const at::Tensor&)> local);
  // Options::headroom: the first frames that would overflow in fp16 / bf16, and counts.
  HeadroomSummary headroom() const;
  // Device (CUDA) reading so far: tensors, deferred frames, read-backs.
  DeviceCounters device_counters() const;
  // The statistics collections' records of the last closed step (Options::stats_collections).
  std::vector<StatRecord> collected_stats() const;
  // FP8 metrics of the last closed step, one per slot (Options::fp8 enabled).
  std::vector<Fp8SlotMetrics> fp8_metrics() const;
  // The most recent report, if any inf/nan was detected.
  std::optional<Report> last_report() const;
  // Frames currently kept (oldest first): never more than max_frames_to_save.
  std::vector<Frame> saved_frames() const;
  // The non-finite values tolerated so far by the place rule, per module and op (Options::strict).
  std::vector<ToleratedCount> tolerated() const;
  // For front ends that see a module's forward return (the Python module's forward hooks, a C++
  // model's own code): `module` (of the watched model) returned `outputs`. One that holds a value
  // the place rule tolerated inside the module is an error, detected here; thrown at the next safe
  // point (check()). Costs a lookup per tensor; a tensor is read only when it holds such a value.
  void returned(const torch::nn::Module& module, const std::vector<at::Tensor>& outputs);
  // A module's arguments (`returning` false) or result hold what HF's report shows as "not a
  // tensor": a ModelOutput, a dict, a list, a cache object. `tensors` are the tensors inside, each
  // named by its path ("output.logits", "output.past_key_values.layers[0].keys"); they are read as
  // frames of the module (op "call" or "return", FrameRecord's entries at most each) and judged by
  // the place rule as what the module was handed or returned. The Python module's hooks call it.
  void module_boundary(const torch::nn::Module& module, bool returning,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  // `module`'s compiled call (torch.compile's kernels: no op of theirs is seen) made `outputs`:
  // read as one frame of the module (op "compiled call"), judged as its own ops' results would be,
  // so one the module then returns is an error there. The Python module's compiled boundary calls it.
  void compiled_call_returned(const torch::nn::Module& module,
                              const std::vector<std::pair<std::string, at::Tensor>>& outputs);
  // The boundary tier (Options::exact false): `module`'s forward, handed `inputs` and returning
  // `outputs` (each named: "input[0]", "output.logits"), is one frame of the module (op "forward"),
  // read as it returns. A non-finite output is an error there unless the module was handed that
  // very tensor (a mask passed through) or allow_nonfinite allows it; the inputs are not judged
  // (a mask made for the module). `buffers`, the module's own that its forward may have written
  // without counting a version (batch norm's running statistics while training), are read as well:
  // one that holds an inf/nan is an entry of the frame, written by the module, and an error there.
  // Nothing happens in a batch that watches op by op.
  void module_returned(const torch::nn::Module& module, const std::vector<std::pair<std::string, at::Tensor>>& inputs,
                       const std::vector<std::pair<std::string, at::Tensor>>& outputs,
                       const std::vector<std::pair<std::string, at::Tensor>>& buffers = {});
  // Whether the open batch (or, between batches, the last) watches op by op.
  bool watching_ops() const;
  // In a batch that watches no op (Options::exact false): from the backward's end to the
  // optimizer's step (`on`, then off), the training loop's own ops on this thread (clipping,
  // unscaling) are watched op by op, as exact mode watches them: a gradient norm that overflows
  // from finite gradients leaves nothing a later read could see. May be called inside the
  // autograd engine's callbacks. Nothing happens in a batch that watches every op.
  void watch_loop_ops(bool on);
  // Writes the front end saw made outside any op it watched (the boundary tier: an optimizer's
  // step): `tensors`, named ("h.0.fc.weight", "h.0.fc.weight.exp_avg"), are read as one frame (op
  // `what`, outside the model) in which any inf/nan is an error. Nothing happens in a batch that
  // watches op by op (its ops made the writes and were judged).
  void check_written(const std::string& what, const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  // The largest magnitude in `tensors` as the watchdog last read them, where every one was read
  // whole on the CPU by the reads that bound an optimizer's states (the gradients after the
  // backward and wherever the training loop's watched ops rewrote them, what check_written read)
  // and has not been written since (its version is the one read); NaN where any was not, and
  // infinity where one held an inf or NaN. The Python module's optimizer bounds start from it.
  double read_magnitude(const std::vector<at::Tensor>& tensors) const;
  // Tensors a front end proved finite instead of reading them (the Python module's bound on the
  // parameters an optimizer's step wrote), none larger in magnitude than `bound`: read_magnitude
  // answers with the bound while a tensor's version is unchanged, and a module's frame holding such
  // a parameter reads it when a report shows the frame (or says it was written since). What was
  // read of them before is forgotten (a fused step counts no version). A bound that is not finite
  // proves nothing and is ignored.
  void proven_finite(const std::vector<at::Tensor>& tensors, double bound);
  // Names tensors that are not parameters (an optimizer's state: "h.0.fc.weight.exp_avg_sq"): the
  // entries of the ops that read or write them carry the name. Held weakly (a freed tensor's name
  // goes with it); naming a tensor again replaces its name. The Python module names an optimizer's
  // state after its steps.
  void name_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);
  // Whether a value is tolerated in the open batch now (returned() has something to look for).
  bool tolerating() const;
  // The batch's model returned `output` (its tensors, in tuples, lists and dicts): returned() of
  // the model itself. DebugUnderflowOverflow::forward calls it.
  void batch_returned(const c10::IValue& output);
  const Options& options() const;

  struct Impl;

 private:
  friend class BatchGuard;
  void end_batch(bool unwinding = false);  // unwinding: an exception ends the batch
  std::unique_ptr<Impl> impl_;
};

namespace detail {
template <class M>
std::shared_ptr<torch::nn::Module> watch_target(const torch::nn::ModuleHolder<M>& holder) {
  return holder.ptr();
}
template <class M>
std::shared_ptr<torch::nn::Module> watch_target(const std::shared_ptr<M>& ptr) {
  return ptr;
}
}  // namespace detail

// HF's name, for a C++-frontend model (ModuleHolder such as `MyNet`, or std::shared_ptr<MyNetImpl>):
// forward(args...) runs model->forward(args...) as one batch.
template <class Model>
class DebugUnderflowOverflow : public Watchdog {
 public:
  explicit DebugUnderflowOverflow(Model model, Options options = Options())
      : Watchdog(detail::watch_target(model), std::move(options)), model_(std::move(model)) {}

  template <class... Args>
  auto forward(Args&&... args) {
    auto step = batch();
    auto out = model_->forward(std::forward<Args>(args)...);
    if constexpr (std::is_constructible_v<c10::IValue, decltype(out)>) batch_returned(out);
    step.finish();
    return out;
  }
  template <class... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  Model& model() { return model_; }

 private:
  Model model_;
};

// For a TorchScript model: forward({x, y}) runs model.forward as one batch. Calls of
// model.forward made directly are batches too; their errors are thrown at the next safe point
// (forward, batch(), check()).
template <>
class DebugUnderflowOverflow<torch::jit::Module> : public Watchdog {
 public:
  explicit DebugUnderflowOverflow(torch::jit::Module& model, Options options = Options())
      : Watchdog(model, std::move(options)), model_(&model) {}

  template <class Inputs = std::vector<c10::IValue>>
  auto forward(Inputs inputs) {
    // A type that depends on Inputs, so the call compiles where torch::jit::Module is complete.
    using JitModule = std::conditional_t<sizeof(Inputs) != 0, torch::jit::Module, void>;
    auto step = batch();
    auto out = static_cast<JitModule*>(model_)->forward(std::move(inputs));
    batch_returned(out);
    step.finish();
    return out;
  }
  template <class Inputs = std::vector<c10::IValue>>
  auto operator()(Inputs inputs) {
    return forward<Inputs>(std::move(inputs));
  }

 private:
  torch::jit::Module* model_;  // the caller's module, which outlives this watchdog
};

}  // namespace sentinel

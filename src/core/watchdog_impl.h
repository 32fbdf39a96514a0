#pragma once
// The watchdog's state: one capture::Session per watched model.
#include <sentinel/errors.h>
#include <sentinel/options.h>
#include <sentinel/report.h>
#include <sentinel/watchdog.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "capture/op_call.h"
#include "capture/session.h"
#include "capture/thread_state.h"
#include "core/delivery.h"
#include "core/entry_reader.h"
#include "core/model_index.h"
#include "core/place_rule.h"
#include "core/rank_glue.h"
#include "core/uninitialized_memory.h"
#include "core/step_observers.h"
#include "frames/batch_state.h"
#include "frames/frame_ring.h"
#include "frames/string_table.h"
#include "overlap/spare_core.h"
#include "torchscript/fusion_guard.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

namespace c10 {
struct IValue;
}

namespace sentinel {

struct OpInfo {
  bool known = false;
  uint32_t display_name = 0;  // "aten::mul", as profilers show it (the cache key adds the overload)
  bool skip = false;            // a view: its output repeats its input's values
  // Its results alias its arguments by the schema, yet may be new memory (aten::to, reshape,
  // contiguous): a frame only when the call returned memory none of its arguments held.
  bool may_copy = false;
  bool uninitialized_results = false;  // the empty family: no frame, its results tracked as unwritten
  uint64_t tensor_args = ~0ull; // bit i: argument i is a Tensor, Tensor? or Tensor[]
  uint64_t overwritten_args = 0; // bit i: argument i is written without its old values being read
  // From the schema (-1: unknown). Boxed calls (the TorchScript interpreter) hand RecordFunction
  // the whole interpreter stack; the op's own arguments and results are its last entries.
  int num_args = -1;
  int num_returns = -1;
  bool pure = false;  // writes nothing but its results: its inputs may be read beside it
  bool writes = false;  // writes into an argument (in place, out=): a result sharing an argument's memory is a write
  bool collective = false;  // writes its tensors after it returns, unannounced (core/uninitialized_ops.h)
  // Bit i: argument i is written in place and is not a result (core::written_unreturned): read
  // again at the op's end, labelled by its name or its argument's, argument_names (interned).
  uint64_t written_unreturned = 0;
  // Of those, the bits written only when argument grad_scale_arg is given (a fused optimizer's
  // gradients, unscaled in place: core::gradients_written_when_unscaled).
  uint64_t written_when_unscaled = 0;
  int grad_scale_arg = -1;
  // Of those, the bits written only while argument running_statistics_flag is true (batch norm's
  // running statistics when training: core::running_statistics_written; -1: always).
  uint64_t running_statistics = 0;
  int running_statistics_flag = -1;
  std::vector<uint32_t> argument_names;
};

using core::GemmOperand;

struct Watchdog::Impl final : capture::Session {
  Impl(std::unique_ptr<core::ModelIndex> model_index, Options options);
  ~Impl() override;

  bool opens_batches_on_torchscript_forward() const override { return index && index->is_torchscript(); }
  void begin_auto_batch() override;
  void end_auto_batch() override;
  bool op_start(const capture::OpCall& op, frames::FrameRecord& f, capture::ThreadState& thread) override;
  void op_end(const capture::OpCall& op, frames::FrameRecord& f, capture::ThreadState& thread) override;
  bool backward_node_start(const capture::OpCall& node, frames::FrameRecord& f, capture::ThreadState& thread) override;
  void backward_op_end(const capture::OpCall& op, frames::FrameRecord& f, capture::ThreadState& thread) override;
  void backward_node_end(frames::FrameRecord& f, capture::ThreadState& thread) override;
  void frame_failed(frames::FrameRecord& f, const char* what, bool keep) noexcept override;
  void callback_failed(const char* what) noexcept override;
  // Checks every parameter's .grad: one backward frame per module, entries named by parameter.
  void check_parameter_gradients();

  // Explicit batches (batch(), forward()): false when one is already open on this thread.
  bool begin_explicit_batch();
  // `unwinding`: an exception (not the sentinel's) ends the batch; nothing is thrown then.
  void end_explicit_batch(bool unwinding = false);
  // What ending a batch does before the ranks meet: gradients, detection, the step's outcome.
  void close_explicit_batch();
  void throw_pending();
  bool has_pending();
  // Closes the open step (lock held): `observers` close theirs; an FP8 alarm waits in `delivery`.
  void close_step_locked();
  // Writes the trace files, hands the closed steps' statistics to the loggers, then runs the
  // action of a waiting FP8 alarm; call without the lock (a user's logger or callback may call
  // the watchdog).
  void deliver_step_outcome();

  // At a safe point: exchange with the other ranks in this batch's round of `phase` (without the
  // lock, which it takes), then report what the agreement says this rank must know.
  void exchange_ranks(ranks::Phase phase);
  // A trip about to be thrown that no exchange has carried: tell the others and hear them.
  void announce_trip();

  // trace_batch_nums with files: the traced batch's frames become a trace report, written
  // (sentinel_trace_batch<N>.*) when the batch ends, and again at the next batch's start if frames
  // came after it (a backward after a TorchScript batch). `next_batch`: one begins.
  void snapshot_trace_locked(bool next_batch);

  Frame to_frame(const frames::FrameRecord& f) const;
  // The ring's frames and the origin; `judged`: how the detection policy judged the trigger.
  Report build_report(const core::DetectionPolicy::Judgement* judged = nullptr) const;
  // A module's forward returned `outputs` (lock held): their frame, when one holds a value
  // tolerated inside the module, is judged by the place rule.
  void check_returned(uint32_t module_place, const std::vector<at::Tensor>& outputs,
                      std::unique_lock<std::mutex>& lock);
  // What a boundary frame holds: what a module was handed ("call"), what it returned ("return"),
  // or what its compiled call made ("compiled call": judged as the module's own op's results).
  enum class BoundaryFrame : uint8_t { Handed, Returned, Compiled, Module };
  // Watchdog::module_returned (lock held): a module's whole forward as one frame.
  void record_whole_module(const torch::nn::Module& module, uint32_t module_place,
                           const std::vector<std::pair<std::string, at::Tensor>>& inputs,
                           const std::vector<std::pair<std::string, at::Tensor>>& outputs,
                           const std::vector<std::pair<std::string, at::Tensor>>& buffers,
                           std::unique_lock<std::mutex>& lock);
  // Watchdog::check_written (lock held).
  void record_written(const std::string& what, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::unique_lock<std::mutex>& lock);
  // Watchdog::module_boundary, Watchdog::compiled_call_returned (lock held).
  void record_boundary(uint32_t module_place, BoundaryFrame kind,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors, std::unique_lock<std::mutex>& lock);
  // A frame of module `module_place` that is not an op's.
  frames::FrameRecord boundary_frame(uint32_t module_place, BoundaryFrame kind);
  // allow_nonfinite patterns that no module path matches are said, once, once the model is indexed.
  void warn_of_unmatched_allowances();

  Options opts;
  frames::StringTable strings;
  frames::PlaceTable places;
  std::unique_ptr<core::ModelIndex> index;
  frames::FrameRing ring;
  frames::BatchState batches;
  std::vector<OpInfo> op_infos;  // by op-name id
  // Forward ops of the current (or last) batch by autograd sequence number, so that a backward
  // node can name the op and module it differentiates.
  struct ForwardOp {
    uint32_t place;
    uint32_t op;
    uint8_t attribution;
  };
  std::unordered_map<int64_t, ForwardOp> forward_ops;
  // Tensors the front end named (Watchdog::name_tensors), by storage. Weak: a storage made later at
  // a freed one's address is not taken for it. Several tensors may lie in one storage (FSDP's
  // gradient shards are views of one reduce-scatter output): each is named by its bytes in it.
  struct NamedPart {
    int64_t begin = 0, end = 0;  // bytes into the storage
    uint32_t name = 0;
  };
  struct NamedStorage {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    std::vector<NamedPart> parts;
  };
  std::unordered_map<uintptr_t, NamedStorage> named_storages;
  size_t named_storages_kept = 0;  // its size after freed storages were last dropped
  // The name given to `t`'s storage, 0 when none (lock held).
  uint32_t storage_name(const at::Tensor& t) const;
  // The magnitude each tensor had when last read by a step's reads that bound an optimizer's
  // states (Watchdog::read_magnitude): the gradients after the backward and as the loop's watched
  // ops rewrote them (unscaling, clipping), what an optimizer wrote. Weak, as named_storages; a
  // record holds while the tensor's version is the one read.
  struct ReadMagnitude {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
    uint32_t version = 0;
    double abs_max = 0.0;  // infinity: it held an inf or NaN
    // Not read but proven no larger than abs_max (Watchdog::proven_finite): the proof's number, 0
    // for a read.
    uint32_t proof = 0;
  };
  uint32_t proofs = 0;  // proofs made so far
  // The record of the tensor at `impl` while it lives and its version is the one recorded; nullptr
  // otherwise (lock held).
  const ReadMagnitude* magnitude_of(const c10::TensorImpl* impl) const;
  // Records `tensors` as proven no larger than `bound` in magnitude at their current versions, one
  // proof (lock held).
  void prove_finite(c10::ArrayRef<at::Tensor> tensors, double bound);
  // Whether `t` is proven finite at its current version: then `e` is its Proven entry (lock held).
  bool proven_entry(const at::Tensor& t, frames::EntryRecord& e) const;
  // A Proven entry's numbers, read as a report shows its frame, into `out` (lock held).
  void read_proven(const frames::EntryRecord& e, Entry& out) const;
  std::unordered_map<const c10::TensorImpl*, ReadMagnitude> read_magnitudes;
  size_t read_magnitudes_kept = 0;  // its size after freed tensors were last dropped
  bool keeping_magnitudes = false;  // check_parameter_gradients and record_written are reading
  struct KeepingMagnitudes {  // keeping_magnitudes, for a scope
    explicit KeepingMagnitudes(Impl& impl) : impl(impl) { impl.keeping_magnitudes = true; }
    ~KeepingMagnitudes() { impl.keeping_magnitudes = false; }
    KeepingMagnitudes(const KeepingMagnitudes&) = delete;
    KeepingMagnitudes& operator=(const KeepingMagnitudes&) = delete;
    Impl& impl;
  };
  // Records (or, when `e` is not a whole read made now, forgets) `t`'s magnitude (lock held).
  void keep_magnitude(const at::Tensor& t, const frames::EntryRecord& e);
  // Records `t`'s magnitude at its current version, read (`proof` 0) or proven (lock held).
  void keep_magnitude_of(const at::Tensor& t, double abs_max, uint32_t proof);
  std::atomic<bool> backward_in_batch{false};  // the parameter gradients are worth a look at batch end
  // The batch open now has had its gradients checked: a whole training step, nothing of which
  // is left for after it (capture::pop_batch).
  std::atomic<bool> gradients_checked_in_batch{false};
  // The FP8 monitor, the statistics collections, the loggers, the dumps (src/core/step_observers.h).
  core::StepObservers observers;
  HeadroomSummary headroom_summary;              // Options::headroom
  std::vector<int8_t> gemm_by_op;                // by op-name id: -1 unknown, else the operand mask
  DeviceCounters device_counters;
  // Where each tensor is read: the CPU through the batch's cache, beside its op on a second thread
  // (Options::read_inputs_beside_ops), or on its device, whose frames wait for a read-back
  // (src/core/entry_reader.h).
  core::EntryReaders readers{core::ReadContext{opts, strings, places, observers, device_counters}};
  // TorchScript's fusers off while watched (Options::keep_torchscript_fusion).
  std::unique_ptr<torchscript::FusionOff> fusion_off;
  // The BLAS and ATen leave a core idle (src/overlap/spare_core.h), looked at as each batch
  // begins: only then are inputs read beside their ops.
  bool core_left_idle = false;
  // Watchdog::set_phase: said in the reports of the open batch (phase) and of those to come.
  std::string phase, next_phase;
  std::string op_key_text;  // op_start's "name.overload", spelled here op after op
  bool inside_compiled_code = false;  // set_inside_compiled_code: reads are not reused
  // torch.compile's backward nodes running (CompiledFunctionBackward): their kernels write in place
  // without version bumps, as the compiled forward's do.
  int compiled_backward_nodes = 0;
  bool reads_reusable() const { return !inside_compiled_code && compiled_backward_nodes == 0; }
  // Drops every read kept: what compiled code or a collective wrote without a version count is
  // read again.
  void forget_reads();
  // Forgets the reads of these tensors' memory (their storages, views included): what an op wrote
  // there without a version count (a fused optimizer, batch norm's running statistics).
  void forget_reads_of(const std::vector<at::Tensor>& written);
  bool compiler_running = false;      // set_compiler_running: ops make no frame
  // Whether the open batch watches op by op (Options::exact, or a feature that needs op frames in
  // it): a batch that does not installs no RecordFunction callback, and its modules are frames.
  bool ops_watched = true;
  bool watches_ops_in(int64_t batch) const;
  // Options::exact false needs a front end that sees every module's forward begin and end (the
  // Python module's hooks): elsewhere it is an OptionError, at the first batch.
  void require_module_boundaries() const;
  static constexpr const char* kModuleBoundariesOnlyInPython =
      "sentinel: exact: false watches module boundaries, which only the Python module's hooks see; the C++ API, "
      "TorchScript and the command line watch every op (leave exact at true)";
  bool boundary_batch_open = false;  // an explicit batch open that watches no op (not on the thread's list)
  bool loop_ops_watched = false;     // Watchdog::watch_loop_ops: the loop's window is open
  // Watchdog::set_every_forward_scoped: each module's forward runs inside its scope (the Python
  // module's hooks), so an op belongs to the innermost module running, whichever module's
  // parameters it reads (F.linear(x, self.proj.weight) is its caller's op).
  bool every_forward_scoped = false;
  // Watchdog::set_local_tensor_reader: the local tensor of a tensor subclass (a DTensor's shard).
  std::function<at::Tensor(const at::Tensor&)> local_tensor_of;
  // Memory the empty family made that nothing has written yet: its reads are labelled, not judged.
  core::UninitializedMemory uninitialized;
  // Memory a collective was handed in this batch (an all-gather's, a reduce-scatter's buffers):
  // an inf/nan first seen in it came from another rank. Weak, as named_storages.
  std::unordered_map<uintptr_t, c10::weak_intrusive_ptr<c10::StorageImpl>> collective_memory;
  // Whether `f` read its inf/nan in such memory, or copied it there (lock held).
  bool nonfinite_from_collective(const frames::FrameRecord& f) const;
  bool detecting_late = false;  // frames resolved after their op: no stacks to take

  // Many ranks: identity, per-rank files, the exchanges, this rank's trips as the others hear of
  // them (src/core/rank_glue.h; the exchanges at safe points: src/core/watchdog_ranks.cpp).
  core::RankGlue ranks;
  // The place rule inside `delivery` (null under Options::strict); set while `delivery` is made.
  core::PlaceRule* place_rule = nullptr;
  // Detection's rule, the actions, the error held for the next safe point, traces; report files
  // go to report_dir, or report_dir/rank<R> (src/core/delivery.h).
  core::Delivery delivery;

  mutable std::mutex mutex;
  // How other threads reach this session: closed (waiting for their callbacks) before the rest
  // of it is destroyed.
  std::shared_ptr<capture::SessionAnchor> anchor;

 private:
  const OpInfo& op_info(const capture::OpCall& op, uint32_t name_id);
  void add_input(frames::FrameRecord& f, const c10::IValue& v, int position, bool tensor_arg, bool probe_fp8,
                 bool gemm_operand, const core::ParamRef* param);
  void add_outputs(frames::FrameRecord& f, c10::ArrayRef<c10::IValue> outputs, bool& any_tensor);
  // The op's arguments as entries (parameters named, destinations it overwrites unread, factors
  // deferred, GEMM operands probed by the masks' bits).
  void add_arguments(frames::FrameRecord& f, c10::ArrayRef<c10::IValue> inputs, const OpInfo& info,
                     c10::ArrayRef<const core::ParamRef*> params, uint32_t fp8_operands, uint32_t gemm_operands,
                     uint32_t factors);
  // Each argument's parameter (nullptr: none), looked up once; returns the one naming the op's
  // module by parameter (the first, or for tied weights the running module's), nullptr if none.
  const core::ParamRef* find_params(c10::ArrayRef<c10::IValue> inputs, capture::ThreadState& ts,
                                    c10::SmallVectorImpl<const core::ParamRef*>& params);
  // A parameter entry of an op placed in `place` whose parameter another module holds: named by
  // its path from `place` ("proj.weight"), or in full outside it.
  uint32_t parameter_label(const core::ParamRef& p, uint32_t place);
  // src/core/watchdog_copies.cpp. At the end of an OpInfo::may_copy call: false when every result
  // lies in an argument's memory (a view: no frame); otherwise its arguments are read now.
  bool settle_copy_or_view(frames::FrameRecord& f, c10::ArrayRef<c10::IValue> outputs, capture::ThreadState& ts);
  // The results of an op of the empty family, tracked as unwritten.
  void note_uninitialized(c10::ArrayRef<c10::IValue> outputs);
  // Before an op's results are read: what it wrote of memory that held no values.
  void note_written_memory(const OpInfo& info, c10::ArrayRef<c10::IValue> outputs, const std::vector<c10::IValue>& held);
  // A collective writes every tensor it is handed.
  void note_collective_writes(c10::ArrayRef<c10::IValue> inputs);
  // The arguments of OpInfo::written_unreturned, held since the op's start, read as results
  // (src/core/written_arguments.cpp).
  void add_written_arguments(frames::FrameRecord& f, const std::vector<c10::IValue>& inputs, const OpInfo& info,
                             const std::vector<uint32_t>& versions_at_start, bool& any_tensor);
  // The factor of the training loop's in-place multiply (clipping's `_foreach_mul_` by its
  // coefficient) where it is finite and at most 1 in magnitude, |factor|; NaN otherwise.
  double shrinking_factor(const frames::FrameRecord& f, const std::vector<c10::IValue>& inputs) const;
  // Whether `t`, read finite at `version_before` and multiplied in place by a factor of magnitude
  // `factor` (at most 1), is proven finite and no larger: then `e` is its Proven entry.
  bool proven_scaled(const at::Tensor& t, uint32_t version_before, double factor, frames::EntryRecord& e);
  // Their version counters at the op's start.
  void note_written_versions(c10::ArrayRef<c10::IValue> inputs, const OpInfo& info, std::vector<uint32_t>& versions);
  uint32_t written_label(const at::Tensor& t, const core::ParamRef* param, const frames::FrameRecord& f,
                         const OpInfo& info, size_t position, int sub);
  // The place of an op inside module scopes; `module`: the innermost module's own place.
  uint32_t scope_place(capture::ThreadState& ts, uint32_t& module);
  // Options::strict's rule, or the place rule (kept in `place_rule`).
  std::unique_ptr<core::DetectionPolicy> detection_policy();

  void begin_batch_locked(std::unique_lock<std::mutex>& lock);
  void end_batch_locked(std::unique_lock<std::mutex>& lock);
  // Between batches: empties the statistics cache, or keeps the parameters' entries
  // (Options::reuse_unchanged_parameter_reads).
  void clear_stats_cache_locked();
  // `f`: the frame that tripped, when known (its op's arguments may be dumped).
  void trip(std::unique_lock<std::mutex>& lock, const frames::FrameRecord* f = nullptr);
  // Options::dumps.on_detection: the op now ending, if `f` is its frame; "" or the directory.
  std::string dump_tripping_op(const frames::FrameRecord& f, int64_t batch);
  // DumpOptions::on_detection with somewhere to write: each op's arguments are held until its end.
  bool dumps_on_trip() const { return opts.dumps().on_detection() && !delivery.files_dir().empty(); }
  // What every report of this watchdog carries: this rank's rank fields, its first inf/nan as the
  // other ranks will hear of it, and the open batch's phase.
  void stamp(Report& report);
  // Records the report (under Action::Throw, as the pending error), then runs its action without
  // the lock: prints it, writes its files, aborts or calls back. Unlocks.
  void deliver(Report report, std::unique_lock<std::mutex>& lock);
  // An exchange's news for this rank (lock held; may unlock to deliver).
  void act_on_agreement(const RankAgreement& agreement, std::unique_lock<std::mutex>& lock);
  // After a frame is complete: keep it, trace it or detect on it. Called with the lock held.
  void finish_frame(frames::FrameRecord& f, std::unique_lock<std::mutex>& lock);
  // Ring, trace or detection for a frame whose numbers are all known.
  void process_frame(frames::FrameRecord& f, std::unique_lock<std::mutex>& lock);
  void note_headroom(const frames::FrameRecord& f);

 public:
  // The entry of one tensor, by the reader `readers` picks for it (src/core/entry_reader.h):
  // on its device (deferred), beside its op, or on the CPU through the batch's cache. `gemm`
  // (optional) adds the FP8 probe of the frame's slot and the collections' menu to the same read.
  // `reuse_reads` false: read `t` even if its memory was read in this batch and looks unchanged
  // (the user's code, a collective, may have written it without LibTorch knowing).
  frames::EntryRecord read_entry(frames::FrameRecord& f, const at::Tensor& t, frames::Role role, int index, int sub,
                               bool headroom, const GemmOperand* gemm = nullptr, bool reuse_reads = true);
  // One op's list of tensors, before their entries are made: the CPU tensors read at once, split
  // between ATen's threads (frames::StatsCache::read_ahead); the device tensors' launches held
  // until the returned guard goes, then started together (DeviceReader::hold_launches).
  [[nodiscard]] core::HeldLaunches read_ahead(c10::ArrayRef<at::Tensor> tensors);
  // The operand mask of a GEMM op (core::gemm_operands), cached by op-name id.
  uint32_t gemm_mask(uint32_t op);
  // Inside compiled code, the arguments of a matrix product left unread until its result is
  // known (bit i: argument i; core::factors_of_product), when nothing else wants them read.
  uint32_t factors_to_defer(const frames::FrameRecord& f, c10::ArrayRef<c10::IValue> inputs, uint32_t gemm_operands);
  // The entry of a factor so deferred; the op's arguments are held until its end.
  void defer_factor(frames::FrameRecord& f, const at::Tensor& t, int position, const core::ParamRef* param);
  // At the op's end, with its results read: the deferred factors stay unread if the results are
  // read, non-empty and finite, else they are read now from `inputs` (the op's held arguments).
  void settle_factors(frames::FrameRecord& f, const std::vector<c10::IValue>& inputs);
  // Reads back what the device holds and runs the waiting frames through process_frame, in
  // order; stops at a trip that stops the run. Leaves the lock held.
  // `last_is_current`: the last waiting frame is the op now ending (its stacks are still live).
  void resolve_deferred(std::unique_lock<std::mutex>& lock, bool last_is_current = false);
  // Forgets the waiting frames and the slots in flight: their numbers cannot be read back.
  void drop_deferred();
  std::vector<frames::FrameRecord> resolved_frames;  // the last read-back's frames, kept for their memory
};

}  // namespace sentinel

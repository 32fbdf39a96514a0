// Watchdog lifetime, batches, and what happens at a trip (its delivery: src/core/delivery.h).
#include <sentinel/watchdog.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ostream>
#include <regex>

#include "capture/loop_window.h"
#include "capture/thread_state.h"
#include "core/watchdog_impl.h"
#include "options/nonfinite_allowance.h"
#include "report/stack_trace.h"

namespace sentinel {

Watchdog::Impl::Impl(std::unique_ptr<core::ModelIndex> model_index, Options options)
    : opts(std::move(options)),
      index(std::move(model_index)),
      ring(static_cast<size_t>(opts.max_frames_to_save())),
      batches(opts.trace_batch_nums(), opts.abort_after_batch_num()),
      observers(opts),
      ranks(opts.ranks()),
      delivery(opts, ranks.session().files_dir(opts.report_dir()), detection_policy()) {
  anchor = std::make_shared<capture::SessionAnchor>(this);
  capture::bind_to_this_thread(anchor, /*observe_ops=*/opts.exact());
}

void Watchdog::Impl::require_module_boundaries() const {
  if (opts.exact() || every_forward_scoped) return;
  throw OptionError(kModuleBoundariesOnlyInPython);
}

bool Watchdog::Impl::watches_ops_in(int64_t batch) const {
  // What reads op by op: a traced batch prints every op; the FP8 probe, the statistics, the
  // headroom counts and the dumps are of ops' tensors; strict stops at the first op that reads or
  // makes an inf/nan, inside a module as well.
  return opts.exact() || opts.strict() || batches.is_traced(batch) || opts.fp8().enabled() ||
         !opts.stats_collections().empty() || opts.headroom() || opts.dumps().enabled();
}

std::unique_ptr<core::DetectionPolicy> Watchdog::Impl::detection_policy() {
  if (opts.strict()) return std::make_unique<core::AnyNonFinite>();
  std::vector<options::NonfiniteAllowance> allow;
  for (const auto& text : opts.allow_nonfinite()) allow.push_back(options::parse_allowance(text));
  auto rule = std::make_unique<core::PlaceRule>(places, strings, std::move(allow));
  place_rule = rule.get();
  return rule;
}

void Watchdog::Impl::warn_of_unmatched_allowances() {
  std::vector<std::string> unmatched;
  for (const auto& text : opts.allow_nonfinite()) {
    const auto a = options::parse_allowance(text);
    const auto& paths = index->module_paths();
    if (std::none_of(paths.begin(), paths.end(), [&](const std::string& p) { return std::regex_match(p, a.module); })) {
      unmatched.push_back(fmt::format("'{}'", text));
    }
  }
  if (unmatched.empty()) return;
  opts.output() << fmt::format("sentinel: allow_nonfinite {} matches no module of this model: it allows nothing\n",
                               fmt::join(unmatched, ", "))
                << std::flush;
}

Watchdog::Impl::~Impl() {
  // From here on no callback enters this session, and those inside (on other threads) are out.
  anchor->close();
  // Nothing is thrown out of a destructor: what fails is said.
  auto say = [this](const char* what) noexcept {
    try {
      opts.output() << "sentinel: while the watchdog was destroyed: " << what << "\n" << std::flush;
    } catch (...) {
    }
  };
  try {
    std::unique_lock<std::mutex> lock(mutex);
    // What the device still holds (a NaN in the backward after the last batch) is reported, and
    // the last step's statistics and FP8 alarm (a step whose next batch never came) delivered.
    resolve_deferred(lock);
    if (!lock.owns_lock()) lock.lock();
    close_step_locked();
  } catch (const std::exception& e) {
    say(e.what());
  } catch (...) {
    say("an exception that is not a std::exception");
  }
  try {
    deliver_step_outcome();
    observers.flush_loggers();
  } catch (const std::exception& e) {
    say(e.what());
  } catch (...) {
    say("an exception that is not a std::exception");
  }
  try {
    // The other ranks stop waiting for this one; destroyed by an exception, it left mid-batch.
    ranks.session().leave(batches.current(), std::uncaught_exceptions() > 0);
  } catch (...) {
  }
  // A watchdog kept in a static or thread_local object outlives this thread's state: nothing of
  // it is left to unbind (unbind_from_this_thread checks).
  capture::unbind_from_this_thread(anchor.get());
}

void Watchdog::Impl::frame_failed(frames::FrameRecord& f, const char* what, bool keep) noexcept {
  try {
    std::unique_lock<std::mutex> lock(mutex);
    readers.beside.collect(f);
    if (f.error == 0) f.error = strings.intern(what);
    if (keep || f.finished || delivery.stopped() || !batches.open()) return;
    // The end failed: the frame is kept with what it holds, and detection runs on it.
    finish_frame(f, lock);
  } catch (...) {
    callback_failed(what);
  }
}

void Watchdog::Impl::callback_failed(const char* what) noexcept {
  try {
    opts.output() << "sentinel: an error inside a RecordFunction callback: " << what << "\n" << std::flush;
  } catch (...) {
  }
}

void Watchdog::Impl::begin_batch_locked(std::unique_lock<std::mutex>& lock) {
  resolve_deferred(lock);  // what is left of the last batch (a backward after it, a graph capture)
  snapshot_trace_locked(/*next_batch=*/true);
  phase = next_phase;  // (after the last batch's leftovers above were reported under its own)
  if (delivery.stopped()) return;
  close_step_locked();  // whatever the last step left open (a backward after its batch)
  if (index) index->refresh();
  clear_stats_cache_locked();
  compiled_backward_nodes = 0;  // (one whose backward threw never ended)
  core_left_idle = opts.read_inputs_beside_ops() && overlap::core_left_idle(overlap::core_use());
  forward_ops.clear();
  uninitialized.prune();  // (memory freed since is forgotten)
  collective_memory.clear();
  delivery.policy().begin_batch();
  backward_in_batch = false;
  gradients_checked_in_batch = false;
  ranks.backward_ran_in_batch = false;
  if (batches.begin()) {
    const ranks::RankSession& session = ranks.session();
    opts.output() << batch_header(batches.current(), session.distributed() ? session.identity().rank : -1) << std::flush;
  }
}

void Watchdog::Impl::clear_stats_cache_locked() {
  // Watched at module boundaries, a parameter is read after the optimizer's step that wrote it
  // (Watchdog::check_written, never from the cache): the next batch's frames show that read.
  if ((opts.reuse_unchanged_parameter_reads() || !opts.exact()) && index) {
    auto tensor_of = [](const auto& param) -> const at::Tensor& { return param.first; };
    readers.cpu.cache().clear_except(index->params(), tensor_of);
    readers.device.reads().clear_except(index->params(), tensor_of);
  } else {
    readers.cpu.cache().clear();
    readers.device.reads().clear();
  }
}

void Watchdog::Impl::end_batch_locked(std::unique_lock<std::mutex>& lock) {
  resolve_deferred(lock);  // the batch's deferred frames: detection before the batch is over
  snapshot_trace_locked(/*next_batch=*/false);
  const int64_t finished = batches.current();
  clear_stats_cache_locked();  // releases the version counters its entries hold
  // Inference (nothing recorded for autograd): the step ends with its batch. Training: it ends
  // after the backward (check_parameter_gradients) or when the next batch begins.
  if (forward_ops.empty()) close_step_locked();
  if (batches.end()) {
    delivery.hold_error(
        std::make_exception_ptr(AbortAfterBatch(finished, opts.abort_after_batch_num().value_or(finished))),
        /*stop=*/true);
  }
}

void Watchdog::Impl::snapshot_trace_locked(bool next_batch) {
  delivery.snapshot_trace([this](Report& r) { stamp(r); }, next_batch);
}

void Watchdog::Impl::begin_auto_batch() {
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!delivery.stopped()) begin_batch_locked(lock);
  }
  deliver_step_outcome();
}

void Watchdog::Impl::end_auto_batch() {
  {
    std::unique_lock<std::mutex> lock(mutex);
    end_batch_locked(lock);
  }
  deliver_step_outcome();
  exchange_ranks(ranks::Phase::BatchEnd);
}

bool Watchdog::Impl::begin_explicit_batch() {
  // forward() inside batch(): one batch
  if (boundary_batch_open || capture::batch_open_here(anchor.get())) return false;
  require_module_boundaries();
  {
    std::unique_lock<std::mutex> lock(mutex);
    begin_batch_locked(lock);
    ops_watched = watches_ops_in(batches.current());
    if (ops_watched) capture::push_batch(anchor);
    else boundary_batch_open = true;
  }
  deliver_step_outcome();
  return true;
}

void Watchdog::Impl::end_explicit_batch(bool unwinding) {
  if (!unwinding) {
    close_explicit_batch();
    exchange_ranks(ranks::Phase::BatchEnd);
    return;
  }
  // An exception of the user's own unwinds this batch. Nothing may be thrown over it (that would
  // end the program), so what fails here is said, not thrown. And this rank will not reach the
  // collectives the others are heading for: it says so instead of exchanging, so they stop at once.
  try {
    close_explicit_batch();
  } catch (const std::exception& error) {
    opts.output() << "sentinel: ending batch " << batches.current() << " while an exception unwound it failed: "
                  << error.what() << "\n"
                  << std::flush;
  } catch (...) {
  }
  ranks.session().leave(batches.current(), /*aborted=*/true);
}

void Watchdog::Impl::close_explicit_batch() {
  // A training step inside the batch: its parameters' gradients are checked once, here (which
  // also closes its FP8 step).
  if (backward_in_batch) {
    // After the user's own code (a gradient all-reduce): what is non-finite now came from there.
    ranks.grads_at_batch_end = true;
    check_parameter_gradients();
    ranks.grads_at_batch_end = false;
  }
  if (!boundary_batch_open) capture::pop_batch(anchor.get(), gradients_checked_in_batch.load());
  else if (loop_ops_watched) capture::close_loop_window(anchor.get());
  boundary_batch_open = loop_ops_watched = false;
  {
    std::unique_lock<std::mutex> lock(mutex);
    end_batch_locked(lock);
  }
  deliver_step_outcome();
}

void Watchdog::Impl::close_step_locked() {
  if (auto alarm = observers.close_step(places, delivery.files_dir())) delivery.hold_alarm(std::move(*alarm));
}

void Watchdog::Impl::deliver_step_outcome() {
  // May run inside a RecordFunction callback (TorchScript batches): what the user's callback
  // does must not be recorded as the model's ops.
  capture::NotRecorded not_recorded;
  std::optional<Report> trace, alarm;
  {
    std::lock_guard<std::mutex> lock(mutex);
    trace = delivery.take_trace();
  }
  if (trace) delivery.write_trace(*trace);
  observers.log_stats();  // before an alarm whose action may abort
  {
    std::lock_guard<std::mutex> lock(mutex);
    alarm = delivery.take_alarm();
  }
  if (!alarm) return;
  const std::string text = render_text(*alarm);
  const Action action = opts.fp8().alarm_action();
  if (action == Action::Throw) {
    std::lock_guard<std::mutex> lock(mutex);
    delivery.hold_error(std::make_exception_ptr(Fp8AlarmError(*alarm, text)), /*stop=*/false);
  }
  delivery.act(*alarm, text, action, "FP8 alarm");
}

bool Watchdog::Impl::has_pending() {
  std::lock_guard<std::mutex> lock(mutex);
  return delivery.has_pending();
}

void Watchdog::Impl::throw_pending() {
  // A safe point where something tripped: the other ranks hear of it before it is thrown.
  if (has_pending()) announce_trip();
  std::exception_ptr e;
  int64_t batch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    e = delivery.take_pending();
    batch = batches.current();
  }
  if (!e) return;
  ranks.session().leave(batch);  // exchanges this rank will miss take its last record instead of waiting
  std::rethrow_exception(e);
}

// Called with the lock held and the detecting frame just pushed.
void Watchdog::Impl::trip(std::unique_lock<std::mutex>& lock, const frames::FrameRecord* f) {
  Report report = build_report(&delivery.last_judgement());
  report.fp8_metrics = observers.last_fp8_metrics();
  if (f) report.dump_dir = dump_tripping_op(*f, report.batch_number);
  // Only now, at detection, is the cost of walking the stacks paid.
  report.deferred = detecting_late;
  if (!detecting_late) {
    report.stack = report::user_call_stack();
    if (index->is_torchscript()) report.torchscript_stack = report::torchscript_call_stack();
    report.python_stack = report::python_call_stack();
  }
  ranks.nonfinite_from_collective = f && nonfinite_from_collective(*f);
  stamp(report);
  deliver(std::move(report), lock);
}

void Watchdog::Impl::deliver(Report report, std::unique_lock<std::mutex>& lock) {
  const std::string text = delivery.record(report);
  lock.unlock();  // files and user callbacks run without the lock
  const bool missing = report.kind == "ranks_missing";
  delivery.act(report, text, opts.action(), missing ? "ranks did not answer" : "inf/nan detected",
               [&] { ranks.session().leave(report.batch_number); });
}

}  // namespace sentinel

// Watchdog lifetime, batches, and what happens at a trip.
#include <sentinel/watchdog.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "capture/thread_state.h"
#include "core/watchdog_impl.h"
#include "report/report_files.h"
#include "report/stack_trace.h"
#include "stats/tensor_stats.h"

namespace sentinel {

Watchdog::Impl::Impl(std::unique_ptr<core::ModelIndex> model_index, Options options)
    : opts(std::move(options)),
      index(std::move(model_index)),
      ring(static_cast<size_t>(opts.max_frames_to_save())),
      batches(opts.trace_batch_nums(), opts.abort_after_batch_num()),
      fp8(collect::fp8_options_for(opts)),
      collector(opts.stats_collections()),
      dumper(opts.dumps(), opts.log_dir()),
      ranks(std::make_unique<ranks::RankSession>(opts.ranks())),
      files_dir(ranks->files_dir(opts.report_dir())) {
  anchor = std::make_shared<capture::SessionAnchor>(this);
  capture::bind_to_this_thread(anchor);
}

void Watchdog::Impl::attach_collections() {
  const auto& modules = index->module_paths();
  collector.check_layers(modules);
  if (fp8.enabled()) {
    // A layer selection that selects nothing is a mistake (a typo, another model's names): said
    // now rather than discovered after a long run with no metrics.
    const std::regex layers(fp8.options().layers(), std::regex::ECMAScript);
    if (std::none_of(modules.begin(), modules.end(), [&](const std::string& p) { return std::regex_match(p, layers); })) {
      throw OptionError(fmt::format("sentinel: fp8 layers '{}' match none of the model's {} modules",
                                    fp8.options().layers(), modules.size()));
    }
  }
  if (!collector.enabled() && opts.custom_loggers().empty() && !dumper.enabled()) return;
  std::vector<std::string> lines = collector.describe(modules);
  if (dumper.enabled()) {
    lines.push_back(fmt::format("save_tensor: layers '{}' freq {} start_step {} end_step {} into {} (max_bytes {})",
                                opts.dumps().layers(), opts.dumps().freq(), opts.dumps().start_step(),
                                opts.dumps().end_step(), dumper.dir(), opts.dumps().max_bytes()));
  }
  const auto& id = ranks->identity();
  loggers = std::make_unique<loggers::LoggerSet>(opts, id.rank, id.world_size, lines);
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
    close_fp8_step_locked();
  } catch (const std::exception& e) {
    say(e.what());
  } catch (...) {
    say("an exception that is not a std::exception");
  }
  try {
    deliver_step_outcome();
    if (loggers) loggers->flush(opts.output());
  } catch (const std::exception& e) {
    say(e.what());
  } catch (...) {
    say("an exception that is not a std::exception");
  }
  try {
    // The other ranks stop waiting for this one; destroyed by an exception, it left mid-batch.
    ranks->leave(batches.current(), std::uncaught_exceptions() > 0);
  } catch (...) {
  }
  // A watchdog kept in a static or thread_local object outlives this thread's state: nothing of
  // it is left to unbind (unbind_from_this_thread checks).
  capture::unbind_from_this_thread(anchor.get());
}

void Watchdog::Impl::frame_failed(frames::FrameRecord& f, const char* what, bool keep) noexcept {
  try {
    std::unique_lock<std::mutex> lock(mutex);
    collect_side_reads(f);
    if (f.error == 0) f.error = strings.intern(what);
    if (keep || f.finished || stopped || !batches.open()) return;
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
  snapshot_trace_locked();
  trace_frames.clear();
  trace_frames_written = 0;
  if (stopped) return;
  close_fp8_step_locked();  // whatever the last step left open (a backward after its batch)
  if (index) index->refresh();
  clear_stats_cache_locked();
  core_left_idle = opts.read_inputs_beside_ops() && overlap::core_left_idle(overlap::core_use());
  forward_ops.clear();
  backward_in_batch = false;
  backward_ran_in_batch = false;
  if (batches.begin()) {
    opts.output() << batch_header(batches.current(), ranks->distributed() ? ranks->identity().rank : -1)
                  << std::flush;
  }
}

void Watchdog::Impl::clear_stats_cache_locked() {
  if (opts.reuse_unchanged_parameter_reads() && index) {
    auto tensor_of = [](const auto& param) -> const at::Tensor& { return param.first; };
    stats_cache.clear_except(index->params(), tensor_of);
    device_reads.clear_except(index->params(), tensor_of);
  } else {
    stats_cache.clear();
    device_reads.clear();
  }
}

void Watchdog::Impl::end_batch_locked(std::unique_lock<std::mutex>& lock) {
  resolve_deferred(lock);  // the batch's deferred frames: detection before the batch is over
  snapshot_trace_locked();
  const int64_t finished = batches.current();
  clear_stats_cache_locked();  // releases the weak references
  // Inference (nothing recorded for autograd): the step ends with its batch. Training: it ends
  // after the backward (check_parameter_gradients) or when the next batch begins.
  if (forward_ops.empty()) close_fp8_step_locked();
  if (batches.end() && !pending) {
    pending = std::make_exception_ptr(AbortAfterBatch(finished, opts.abort_after_batch_num().value_or(finished)));
    stopped = true;
  }
}

void Watchdog::Impl::snapshot_trace_locked() {
  if (trace_frames.size() <= trace_frames_written) return;
  Report r;
  r.kind = "trace";
  r.batch_number = trace_frames.front().batch_number;
  r.frames = trace_frames;
  stamp_rank(r);
  trace_frames_written = trace_frames.size();
  pending_trace = std::move(r);
}

void Watchdog::Impl::write_pending_trace() {
  std::optional<Report> trace;
  {
    std::lock_guard<std::mutex> lock(mutex);
    std::swap(trace, pending_trace);
  }
  if (!trace) return;
  const std::string error = report::write_report_files(files_dir, *trace, render_text(*trace));
  if (!error.empty()) opts.output() << "sentinel: " << error << "\n" << std::flush;
}

void Watchdog::Impl::begin_auto_batch() {
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!stopped) begin_batch_locked(lock);
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
  if (capture::batch_open_here(anchor.get())) return false;  // forward() inside batch(): one batch
  {
    std::unique_lock<std::mutex> lock(mutex);
    begin_batch_locked(lock);
    capture::push_batch(anchor);
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
  ranks->leave(batches.current(), /*aborted=*/true);
}

void Watchdog::Impl::close_explicit_batch() {
  // A training step inside the batch: its parameters' gradients are checked once, here (which
  // also closes its FP8 step).
  if (backward_in_batch) {
    // After the user's own code (a gradient all-reduce): what is non-finite now came from there.
    grads_at_batch_end = true;
    check_parameter_gradients();
    grads_at_batch_end = false;
  }
  capture::pop_batch(anchor.get());
  {
    std::unique_lock<std::mutex> lock(mutex);
    end_batch_locked(lock);
  }
  deliver_step_outcome();
}

void Watchdog::Impl::close_fp8_step_locked() {
  std::vector<Fp8SlotMetrics> step_metrics;  // of this step only (last_fp8_metrics may be older)
  if (fp8.enabled() && fp8.step_open()) {
    std::vector<Fp8Alarm> alarms;
    last_fp8_metrics = step_metrics = fp8.end_step(alarms);
    if (!files_dir.empty()) {
      std::string error = report::append_fp8_metrics(files_dir, last_fp8_metrics);
      if (!error.empty()) opts.output() << "sentinel: " << error << "\n" << std::flush;
    }
    if (!alarms.empty() && !pending_alarm) {
      Report r;
      r.kind = "fp8_alarm";
      r.batch_number = alarms.front().metrics.step;
      r.fp8_alarms = std::move(alarms);
      r.fp8_metrics = last_fp8_metrics;
      pending_alarm = std::move(r);
    }
  }
  if (collector.step_open()) {
    last_stats = collector.end_step(step_metrics, places);
    pending_stats.insert(pending_stats.end(), last_stats.begin(), last_stats.end());
  }
}

void Watchdog::Impl::deliver_stats() {
  std::lock_guard<std::mutex> one_at_a_time(logging_mutex);  // a logger is never called concurrently
  std::vector<StatRecord> records;
  {
    std::lock_guard<std::mutex> lock(mutex);
    records.swap(pending_stats);
  }
  if (loggers && !records.empty()) loggers->log(records, opts.output());
}

void Watchdog::Impl::deliver_step_outcome() {
  // May run inside a RecordFunction callback (TorchScript batches): what the user's callback
  // does must not be recorded as the model's ops.
  capture::NotRecorded not_recorded;
  write_pending_trace();
  deliver_stats();  // before an alarm whose action may abort
  std::optional<Report> alarm;
  const Action action = opts.fp8().alarm_action();
  {
    std::lock_guard<std::mutex> lock(mutex);
    std::swap(alarm, pending_alarm);
    if (!alarm) return;
  }
  const std::string text = render_text(*alarm);
  if (action == Action::Throw) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!pending) pending = std::make_exception_ptr(Fp8AlarmError(*alarm, text));
  }
  std::ostream& out = opts.output();
  if (action != Action::Callback) out << text << std::flush;
  if (!files_dir.empty()) {
    std::string error = report::write_report_files(files_dir, *alarm, text);
    if (!error.empty()) out << "sentinel: " << error << "\n" << std::flush;
  }
  if (action == Action::Abort) {
    std::cerr << "sentinel: FP8 alarm, aborting (Action::Abort)\n" << std::flush;
    std::abort();
  }
  if (action == Action::Callback && opts.callback()) {
    try {
      opts.callback()(*alarm);
    } catch (const std::exception& e) {
      out << "sentinel: the report callback threw: " << e.what() << "\n" << std::flush;
    } catch (...) {
      out << "sentinel: the report callback threw a non-standard exception\n" << std::flush;
    }
  }
}

bool Watchdog::Impl::has_pending() {
  std::lock_guard<std::mutex> lock(mutex);
  return pending != nullptr;
}

void Watchdog::Impl::throw_pending() {
  const bool due = has_pending();
  // A safe point where something tripped: the other ranks hear of it before it is thrown.
  if (due) announce_trip();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mutex);
    std::swap(e, pending);
    pending_is_report = false;
    stopped = false;
  }
  if (!e) return;
  int64_t batch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch = batches.current();
  }
  ranks->leave(batch);  // exchanges this rank will miss take its last record instead of waiting
  std::rethrow_exception(e);
}

// Called with the lock held and the detecting frame just pushed.
void Watchdog::Impl::trip(std::unique_lock<std::mutex>& lock, const frames::FrameRecord* f) {
  Report report = build_report();
  report.fp8_metrics = last_fp8_metrics;
  if (f) report.dump_dir = dump_tripping_op(*f, report.batch_number);
  // Only now, at detection, is the cost of walking the stacks paid.
  report.deferred = detecting_late;
  if (!detecting_late) {
    report.stack = report::user_call_stack();
    if (index->is_torchscript()) report.torchscript_stack = report::torchscript_call_stack();
    report.python_stack = report::python_call_stack();
  }
  stamp_rank(report);
  deliver(std::move(report), lock);
}

void Watchdog::Impl::deliver(Report report, std::unique_lock<std::mutex>& lock) {
  reported_batch = report.batch_number;
  last_report = report;
  const std::string text = render_text(report);
  const Action action = opts.action();
  if (action == Action::Throw) {
    pending = report.kind == "ranks_missing" ? std::make_exception_ptr(RanksMissingError(report, text))
                                             : std::make_exception_ptr(NonFiniteError(report, text));
    pending_is_report = true;
    stopped = true;
  }
  lock.unlock();  // files and user callbacks run without the lock

  std::ostream& out = opts.output();
  if (action != Action::Callback) out << text << std::flush;
  if (!files_dir.empty()) {
    std::string error = report::write_report_files(files_dir, report, text);
    if (!error.empty()) out << "sentinel: " << error << " (the report above is complete)\n" << std::flush;
  }
  if (action == Action::Abort) {
    std::cerr << "sentinel: " << (report.kind == "ranks_missing" ? "ranks did not answer" : "inf/nan detected")
              << ", aborting (Action::Abort)\n"
              << std::flush;
    ranks->leave(report.batch_number);
    std::abort();
  }
  if (action == Action::Callback && opts.callback()) {
    try {
      opts.callback()(report);
    } catch (const std::exception& e) {
      out << "sentinel: the report callback threw: " << e.what() << "\n" << std::flush;
    } catch (...) {
      out << "sentinel: the report callback threw a non-standard exception\n" << std::flush;
    }
  }
}

}  // namespace sentinel

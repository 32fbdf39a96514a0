#include "core/delivery.h"

#include <sentinel/errors.h>

#include <cstdlib>
#include <iostream>

#include "frames/frame_record.h"
#include "report/report_files.h"

namespace sentinel::core {

DetectionPolicy::Judgement AnyNonFinite::judge(const frames::FrameRecord& f) {
  Judgement j;
  j.error = !f.finite();
  return j;
}

Delivery::Delivery(const Options& opts, std::string files_dir, std::unique_ptr<DetectionPolicy> policy)
    : opts_(opts), files_dir_(std::move(files_dir)), policy_(std::move(policy)) {}

bool Delivery::trips(const frames::FrameRecord& f) {
  DetectionPolicy::Judgement j = policy_->judge(f);  // every frame: the policy learns from all of them
  if (!j.error || f.batch_number == reported_batch_) return false;
  judgement_ = std::move(j);
  return true;
}

std::string Delivery::record(Report report) {
  reported_batch_ = report.batch_number;
  std::string text = render_text(report);
  if (opts_.action() == Action::Throw) {
    pending_ = report.kind == "ranks_missing" ? std::make_exception_ptr(RanksMissingError(report, text))
                                             : std::make_exception_ptr(NonFiniteError(report, text));
    pending_is_report_ = true;
    stopped_ = true;
  }
  last_report_ = std::move(report);
  return text;
}

std::optional<std::pair<Report, std::string>> Delivery::amend_last_report(const RankAgreement& agreement) {
  if (!last_report_ || last_report_->kind != "nonfinite") return std::nullopt;
  Report& r = *last_report_;
  r.ranks = agreement;
  std::string text = render_text(r);
  if (pending_is_report()) pending_ = std::make_exception_ptr(NonFiniteError(r, text));
  return std::make_pair(r, std::move(text));
}

void Delivery::hold_error(std::exception_ptr error, bool stop) {
  if (pending_) return;
  pending_ = std::move(error);
  pending_is_report_ = false;
  stopped_ = stopped_ || stop;
}

std::exception_ptr Delivery::take_pending() {
  std::exception_ptr e;
  std::swap(e, pending_);
  pending_is_report_ = false;
  stopped_ = false;
  return e;
}

void Delivery::hold_alarm(Report alarm) {
  if (!pending_alarm_) pending_alarm_ = std::move(alarm);
}

std::optional<Report> Delivery::take_alarm() {
  std::optional<Report> alarm;
  std::swap(alarm, pending_alarm_);
  return alarm;
}

void Delivery::trace_frame(const Frame& frame) {
  if (!files_dir_.empty()) trace_frames_.push_back(frame);
}

void Delivery::snapshot_trace(const std::function<void(Report&)>& stamp, bool next_batch) {
  if (trace_frames_.size() > trace_frames_written_) {
    Report r;
    r.kind = "trace";
    r.batch_number = trace_frames_.front().batch_number;
    r.frames = trace_frames_;
    stamp(r);
    trace_frames_written_ = trace_frames_.size();
    pending_trace_ = std::move(r);
  }
  if (next_batch) {
    trace_frames_.clear();
    trace_frames_written_ = 0;
  }
}

std::optional<Report> Delivery::take_trace() {
  std::optional<Report> trace;
  std::swap(trace, pending_trace_);
  return trace;
}

void Delivery::act(const Report& report, const std::string& text, Action action, const char* abort_what,
                   const std::function<void()>& before_abort) const {
  std::ostream& out = opts_.output();
  if (action != Action::Callback) out << text << std::flush;
  if (!files_dir_.empty()) {
    const std::string error = report::write_report_files(files_dir_, report, text);
    if (!error.empty()) {
      out << "sentinel: " << error << (action != Action::Callback ? " (the report above is complete)" : "") << "\n"
          << std::flush;
    }
  }
  if (action == Action::Abort) {
    std::cerr << "sentinel: " << abort_what << ", aborting (Action::Abort)\n" << std::flush;
    if (before_abort) before_abort();
    std::abort();
  }
  if (action == Action::Callback && opts_.callback()) {
    try {
      opts_.callback()(report);
    } catch (const std::exception& e) {
      out << "sentinel: the report callback threw: " << e.what() << "\n" << std::flush;
    } catch (...) {
      out << "sentinel: the report callback threw a non-standard exception\n" << std::flush;
    }
  }
}

void Delivery::write_trace(const Report& trace) const {
  const std::string error = report::write_report_files(files_dir_, trace, render_text(trace));
  if (!error.empty()) opts_.output() << "sentinel: " << error << "\n" << std::flush;
}

}  // namespace sentinel::core

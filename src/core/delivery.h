#pragma once
// What the watchdog does with what it finds: the rule that makes a frame an error, the one dispatch
// of a report by its action (printed, written, aborted on, called back, or held as the error the
// next safe point throws), the error waiting for that safe point, and the traced batch's frames as
// a trace report. Not locked itself: the watchdog calls the "lock held" members under its lock and
// `act`/`write_trace` without it (files and the user's callback must not run under it).
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sentinel::frames {
struct FrameRecord;
}

namespace sentinel::core {

// When a finished frame (its numbers all known) holds an error to report. Sees every frame of an
// untraced batch, in op order, so that it may learn from the frames that hold none.
class DetectionPolicy {
 public:
  struct Judgement {
    bool error = false;
    Escape escape = Escape::None;  // how a value tolerated where it was made left that place
    std::shared_ptr<const frames::FrameRecord> made_by;  // the op that made it, when it was tolerated first
  };
  virtual ~DetectionPolicy() = default;
  virtual Judgement judge(const frames::FrameRecord& f) = 0;
  // A batch begins: what was learned of the last one's tensors no longer holds.
  virtual void begin_batch() {}
  // The values tolerated so far (none when every inf/nan is an error).
  virtual std::vector<ToleratedCount> tolerated() const { return {}; }
};

// Every op strictly (Options::strict): any inf/nan an op reads or makes is an error.
class AnyNonFinite final : public DetectionPolicy {
 public:
  Judgement judge(const frames::FrameRecord& f) override;
};

class Delivery {
 public:
  // `files_dir`: where report files go ("" for none); `opts` outlives this.
  Delivery(const Options& opts, std::string files_dir,
           std::unique_ptr<DetectionPolicy> policy = std::make_unique<AnyNonFinite>());

  const std::string& files_dir() const { return files_dir_; }

  // ---- with the lock held ----

  // Whether `f` is reported: an error by the policy, in a batch that has reported none yet (Warn
  // and Callback report the first of each batch and run on). The policy's judgement of the last
  // frame that tripped is kept for its report.
  bool trips(const frames::FrameRecord& f);
  const DetectionPolicy::Judgement& last_judgement() const { return judgement_; }
  DetectionPolicy& policy() { return *policy_; }
  const DetectionPolicy& policy() const { return *policy_; }
  // A detection's report becomes the last report and, under Action::Throw, the pending error
  // (recording stops until it is thrown). Returns its text, for `act`.
  std::string record(Report report);
  // The last report gains what the ranks agreed: re-rendered, and re-made as the pending error
  // when that carries it. The updated report and its text, or nothing when there is no report.
  std::optional<std::pair<Report, std::string>> amend_last_report(const RankAgreement& agreement);
  // An error for the next safe point unless one waits already (AbortAfterBatch, an FP8 alarm);
  // `stop`: record nothing more until it is thrown.
  void hold_error(std::exception_ptr error, bool stop);
  bool stopped() const { return stopped_; }
  bool has_pending() const { return pending_ != nullptr; }
  // True while the pending error is a report's (a report is on its way to the user).
  bool pending_is_report() const { return pending_ != nullptr && pending_is_report_; }
  // The pending error, handed over; recording resumes.
  std::exception_ptr take_pending();
  const std::optional<Report>& last_report() const { return last_report_; }

  // An FP8 alarm awaiting its action (the first of several is kept), taken without the lock.
  void hold_alarm(Report alarm);
  std::optional<Report> take_alarm();

  // The traced batch's frames, kept for its trace files when there is a directory for them.
  void trace_frame(const Frame& frame);
  // The traced frames not yet written become the trace report to write (`stamp` adds the rank);
  // `next_batch`: the frames kept so far are forgotten once taken (a new batch begins).
  void snapshot_trace(const std::function<void(Report&)>& stamp, bool next_batch);
  std::optional<Report> take_trace();

  // ---- without the lock ----

  // A report's action, in order: printed (not under Callback), written into files_dir, the program
  // aborted (Abort: `abort_what` said on stderr after `before_abort`), or the callback called
  // (Callback; what it throws is said, not thrown). Throw's error was held by `record`.
  void act(const Report& report, const std::string& text, Action action, const char* abort_what,
           const std::function<void()>& before_abort = {}) const;
  // Writes a trace report's files; a failure is said.
  void write_trace(const Report& trace) const;

 private:
  const Options& opts_;
  std::string files_dir_;
  std::unique_ptr<DetectionPolicy> policy_;
  DetectionPolicy::Judgement judgement_;
  std::exception_ptr pending_;      // thrown at the next safe point
  bool pending_is_report_ = false;  // `pending_` carries last_report_ (updated by an exchange)
  bool stopped_ = false;            // a trip or an abort is pending: record nothing more
  int64_t reported_batch_ = -1;
  std::optional<Report> last_report_;
  std::optional<Report> pending_alarm_;
  std::vector<Frame> trace_frames_;
  size_t trace_frames_written_ = 0;
  std::optional<Report> pending_trace_;
};

}  // namespace sentinel::core

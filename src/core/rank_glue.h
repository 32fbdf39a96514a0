#pragma once
// The watchdog among many ranks, without the watchdog: this rank's session (identity, files, the
// exchanges of src/ranks/), how this rank's first inf/nan is told to the others (made here, or
// received from another rank through a collective), and what an exchange's agreement asks of this
// rank. The watchdog calls it at its safe points and carries out the outcome.
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "ranks/rank_session.h"

namespace sentinel::core {

class RankGlue {
 public:
  // Throws OptionError for a malformed or inconsistent rank identity.
  explicit RankGlue(const RankOptions& options) : session_(std::make_unique<ranks::RankSession>(options)) {}

  ranks::RankSession& session() { return *session_; }
  const ranks::RankSession& session() const { return *session_; }

  // What attributes a trip to another rank: the parameter gradients are being checked at batch
  // end, after the user's own code (a gradient all-reduce) ran; a backward ran in this batch.
  std::atomic<bool> grads_at_batch_end{false};
  bool backward_ran_in_batch = false;
  // The trip's op read its inf/nan in memory a collective wrote (FSDP's all-gather), or copied it
  // there (the collective finishing its write).
  bool nonfinite_from_collective = false;

  // This rank's fields of `report` and, for a first inf/nan among many ranks, the event the others
  // will hear: made here, or received (a collective's output, gradients changed by the all-reduce,
  // an input already bad after the backward), its origin line saying so.
  void stamp(Report& report);

  // What an exchange's agreement asks of this rank.
  struct Outcome {
    enum class Kind {
      Nothing,  // no news, or news already acted on
      Say,      // a line to print: trouble, but nobody to stop for
      Amend,    // this rank's report, already written, gains what the others said
      Stop,     // a report of kind `report_kind` with `origin`: another rank saw inf/nan first,
                // or ranks did not answer
    };
    Kind kind = Kind::Nothing;
    RankAgreement agreement;  // with this rank's own trip merged in
    std::string line;         // Say
    std::string report_kind;  // Stop: "peer_nonfinite" or "ranks_missing"
    std::string origin;       // Stop
  };
  // `report_written`: this rank reported its own inf/nan ("nonfinite") already; `report_pending`:
  // a report of this rank is on its way to the user (held for the next safe point).
  Outcome weigh(const RankAgreement& agreed, bool report_written, bool report_pending);

 private:
  std::unique_ptr<ranks::RankSession> session_;
  std::optional<RankAgreement> reported_;  // the last agreement acted on
};

}  // namespace sentinel::core

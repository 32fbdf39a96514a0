#pragma once
// One watchdog's place among the ranks: who it is, where its files go, and the exchanges.
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ranks/rank_record.h"

namespace sentinel {
namespace ranks {

struct Identity {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string source;  // "one process", "RANK and WORLD_SIZE", "RankOptions", "the process group"
};

// RankOptions first, then the channel's process group, then torchrun's RANK and WORLD_SIZE;
// throws sentinel::OptionError naming a malformed or inconsistent value.
Identity resolve_identity(const RankOptions& options, const RankChannel* channel);

class RankSession {
 public:
  explicit RankSession(const RankOptions& options);
  const Identity& identity() const { return id_; }
  bool distributed() const { return id_.world_size > 1; }
  bool exchanging() const { return distributed() && exchange_; }
  // <report_dir>/rank<R> for many ranks, else report_dir itself.
  std::string files_dir(const std::string& report_dir) const;

  // This rank's first inf/nan (the one the others need; later ones are not sent).
  void note_trip(const RankEvent& event);
  bool tripped() const;
  // Publishes this rank's record for `batch` and gathers the others' (blocks up to the timeout);
  // std::nullopt when this batch's exchange has already taken place (at most one per batch).
  // Never throws: a failing channel is reported in RankAgreement::problem and not used again.
  // Threads may call it at once: one exchanges, the others find it done.
  std::optional<RankAgreement> exchange(int64_t batch);
  // This rank stops answering after `batch` (an error goes to the user, or `aborted`: an
  // exception not the sentinel's unwinds that batch): its record stands in for it in the rounds
  // it misses.
  void leave(int64_t batch, bool aborted = false) noexcept;
  double timeout_seconds() const { return timeout_seconds_; }

 private:
  Identity id_;
  bool exchange_ = true;
  double timeout_seconds_ = 5;
  std::shared_ptr<RankChannel> channel_;
  // The channel is used by one thread at a time; the state below is read and written under its
  // own lock, so that an op thread noting a trip never waits for an exchange in progress.
  std::mutex channel_mutex_;
  mutable std::mutex state_mutex_;
  std::string failure_;  // why the channel is no longer used
  RankRecord self_;
  int64_t last_round_ = -1;
  bool left_ = false;
};

}  // namespace ranks
}  // namespace sentinel

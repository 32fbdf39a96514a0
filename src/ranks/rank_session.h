#pragma once
// One watchdog's place among the ranks: who it is, where its files go, and the exchanges.
#include <sentinel/options.h>
#include <sentinel/report.h>

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ranks/rank_channel.h"
#include "ranks/rank_record.h"

namespace sentinel {
namespace ranks {

struct Identity {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::string source;  // "one process", "RANK and WORLD_SIZE", "RankOptions", "the process group"
  int64_t local_rank = -1;  // LOCAL_RANK (which device on this host), -1 if not set
  std::string host;         // this host's name
};

// RankOptions first, then the channel's process group, then torchrun's RANK and WORLD_SIZE;
// throws sentinel::OptionError naming a malformed or inconsistent value.
Identity resolve_identity(const RankOptions& options, const RankChannel* channel);

// Where the ranks meet in a batch: each is a round of its own, taken by every rank once per batch.
enum class Phase { Backward, BatchEnd };

class RankSession {
 public:
  explicit RankSession(const RankOptions& options);
  const Identity& identity() const { return id_; }
  bool distributed() const { return id_.world_size > 1; }
  // Not in a child forked from the rank: the child is not the rank, which runs on, and the
  // channel is the rank's (a store connection, a process group's threads).
  bool exchanging() const { return distributed() && exchange_ && getpid() == process_; }
  // <report_dir>/rank<R> for many ranks, else report_dir itself.
  std::string files_dir(const std::string& report_dir) const;

  // This rank's first inf/nan (the one the others need; later ones are not sent).
  void note_trip(const RankEvent& event);
  std::optional<RankEvent> own_trip() const;
  // This rank tripped and no exchange has carried it yet.
  bool untold_trip() const;
  // Publishes this rank's record for (`batch`, `phase`) and gathers the others' (blocks while they
  // are alive, see RankWait); std::nullopt when that round has already taken place. Never throws:
  // a failing channel is reported in RankAgreement::problem and not used again. Threads may call
  // it at once: one exchanges, the others find it done.
  std::optional<RankAgreement> exchange(int64_t batch, Phase phase);
  // This rank tripped since its last exchange and stops before the next one (check(), the start
  // of a batch): it leaves its record for the others' next round and gathers what they say there.
  std::optional<RankAgreement> announce(int64_t batch);
  // This rank stops answering after `batch` (an error goes to the user, or `aborted`: an
  // exception not the sentinel's unwinds that batch): its record stands in for it in the rounds
  // it misses.
  void leave(int64_t batch, bool aborted = false) noexcept;
  // The batch count was set back (Trainer numbers a step by its global step after an evaluation's
  // forwards counted on): the rounds to come are named apart from the ones already taken, which
  // every rank does alike.
  void renumber();
  double timeout_seconds() const { return timeout_seconds_; }

 private:
  RankAgreement agreement_from(int64_t batch, const RankRecord& self,
                               const std::vector<std::optional<std::string>>& texts) const;
  RankAgreement channel_failed(const std::exception& e, const RankRecord& self);
  std::string round_name(int64_t batch, const char* phase) const;

  Identity id_;
  bool exchange_ = true;
  double timeout_seconds_ = 5;
  RankWait wait_{};
  std::shared_ptr<RankChannel> channel_;
  int64_t process_;  // the rank's process id
  // The channel is used by one thread at a time; the state below is read and written under its
  // own lock, so that an op thread noting a trip never waits for an exchange in progress.
  std::mutex channel_mutex_;
  mutable std::mutex state_mutex_;
  std::string failure_;  // why the channel is no longer used
  RankRecord self_;
  int64_t last_batch_[2] = {-1, -1};  // by Phase
  int64_t numbering_ = 0;             // renumber() calls so far
  bool told_ = false;                 // an exchange has carried self_.tripped
  bool left_ = false;
};

}  // namespace ranks
}  // namespace sentinel

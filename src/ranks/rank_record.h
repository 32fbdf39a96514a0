#pragma once
// The record each rank publishes at an exchange, and the agreement every rank derives from the
// records: the same on every rank, since every rank orders the same records the same way.
#include <sentinel/report.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sentinel {
namespace ranks {

struct RankRecord {
  int64_t rank = 0;
  bool left = false;                // the rank has stopped answering (its error went to the user)
  bool aborted = false;             // ... because an exception unwound its batch (not the sentinel's)
  int64_t last_round = -1;          // ... after this round: later rounds go on without it
  std::optional<RankEvent> tripped; // its first inf/nan, if it saw one
};

// Text, one `key=value` per line; values have no newlines. Strings are cut to keep a record
// under kMaxRecordBytes (the fixed size of a collective's buffer).
constexpr size_t kMaxRecordBytes = 2048;
std::string encode(const RankRecord& record);
// std::nullopt for text that is not a record of this format.
std::optional<RankRecord> decode(const std::string& text);

// (batch, received, op index, rank): within a batch a rank that made an inf/nan comes before one
// that received it, then the op index (one sequence over the batch's forward and backward ops).
bool earlier(const RankEvent& a, const RankEvent& b);

// Every rank's view of the exchange of `round`: `records[r]` empty when rank r did not answer (or
// sent something unreadable: `unreadable` lists those). `self` is this rank's own record. A rank
// that left, clean, before this round or in the middle of it (an exception) is missing from it.
RankAgreement agree(int64_t round, const RankRecord& self, const std::vector<std::optional<RankRecord>>& records,
                    const std::vector<int64_t>& unreadable);

}  // namespace ranks
}  // namespace sentinel

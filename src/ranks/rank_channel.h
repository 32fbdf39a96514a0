#pragma once
// How the ranks' records travel. Implementations: the c10d store (store_channel.cpp) and an
// all-gather on a process group (group_channel.cpp).
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sentinel {

// The channel cannot be used at all (no store to connect to): unlike a failed exchange, this
// says nothing about the other ranks.
class ChannelUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How long to wait for a rank: a rank that shows no sign of life for `silence` is given up; one
// that is alive but slow (a checkpoint, an evaluation on rank 0) is waited for up to `longest`.
struct RankWait {
  std::chrono::milliseconds silence;
  std::chrono::milliseconds longest;
};

class RankChannel {
 public:
  virtual ~RankChannel() = default;
  // The rank and world size the channel itself knows (a process group), or -1.
  virtual int64_t rank() const { return -1; }
  virtual int64_t world_size() const { return -1; }
  // Called once, by the watchdog that uses the channel, before its first exchange.
  virtual void bind(int64_t rank, int64_t world_size) = 0;
  // Publishes this rank's record for `round`, then gathers every rank's record of that round (its
  // own included); an empty element: that rank did not answer. Throws std::exception when the
  // channel itself fails (the store cannot be reached, the collective fails).
  virtual std::vector<std::optional<std::string>> exchange(const std::string& round, const std::string& record,
                                                           RankWait wait) = 0;
  // Publishes nothing; gathers from each other rank its record of the first of `rounds` it
  // publishes (or its farewell). For a rank that stops between the rounds the others meet at.
  // Empty when the channel cannot do this (a collective needs every rank at once).
  virtual std::vector<std::optional<std::string>> gather_next(const std::vector<std::string>& rounds,
                                                              RankWait wait) {
    (void)rounds;
    (void)wait;
    return {};
  }
  // This rank stops answering: `record` stands for it in the rounds it will miss. Waits (up to
  // `wait.silence`) until the ranks that answered its last round have read it, since this
  // process may be the one that serves the store. Never throws.
  virtual void leave(const std::string& record, RankWait wait) noexcept {
    (void)record;
    (void)wait;
  }
  // What went wrong in the last exchange though it returned (some answers may be missing).
  virtual std::string problem() const { return ""; }
  // "the c10d store at 127.0.0.1:29500", for messages.
  virtual std::string describe() const = 0;
};

}  // namespace sentinel

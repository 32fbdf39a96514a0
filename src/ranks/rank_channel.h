#pragma once
// How the ranks' records travel. Implementations: the c10d store (store_channel.cpp) and an
// all-gather on a process group (group_channel.cpp).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <stdexcept>

namespace sentinel {

// The channel cannot be used at all (no store to connect to): unlike a failed exchange, this
// says nothing about the other ranks.
class ChannelUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
  // own included) within `timeout`; an empty element: that rank did not answer. Throws
  // std::exception when the channel itself fails (the store cannot be reached, the collective fails).
  virtual std::vector<std::optional<std::string>> exchange(int64_t round, const std::string& record,
                                                           std::chrono::milliseconds timeout) = 0;
  // This rank stops answering: `record` stands for it in the rounds it will miss. Never blocks
  // for long and never throws.
  virtual void leave(const std::string& record) noexcept { (void)record; }
  // What went wrong in the last exchange though it returned (some answers may be missing).
  virtual std::string problem() const { return ""; }
  // "the c10d store at 127.0.0.1:29500", for messages.
  virtual std::string describe() const = 0;
};

}  // namespace sentinel

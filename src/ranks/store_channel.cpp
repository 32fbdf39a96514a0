// Records through the c10d store: each rank sets its key and polls for the others', so a rank
// that never answers is named (and not waited for again) instead of failing the whole exchange.
#include <sentinel/errors.h>
#include <sentinel/ranks.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "ranks/rank_channel.h"
#include "ranks/store_channel.h"

namespace sentinel {
namespace ranks {

namespace {

using Clock = std::chrono::steady_clock;

// Two watchdogs of one rank on one store exchange under different keys; SPMD programs make them
// in the same order on every rank, so the n-th watchdog of each rank meets the n-th of the
// others. (Counted per store and rank: ranks simulated as threads of one process meet too.)
std::string next_scope(const void* store, int64_t rank) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int64_t>, int64_t> made;
  std::lock_guard<std::mutex> lock(mutex);
  return "w" + std::to_string(made[{store, rank}]++);
}

class StoreChannel final : public RankChannel {
 public:
  // `store` may be null: connect to the store at MASTER_ADDR:MASTER_PORT at the first exchange.
  explicit StoreChannel(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void bind(int64_t rank, int64_t world_size) override {
    if (!prefix_.empty()) {
      throw OptionError("sentinel: a RankChannel from store_channel() serves one watchdog; make one for each");
    }
    rank_ = rank;
    world_size_ = world_size;
    // The default channel's store is the one at MASTER_ADDR: the same for every watchdog. After an
    // elastic restart torchrun's store still holds the keys of the failed attempt: not ours.
    const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
    prefix_ = "sentinel/" + std::string(restart && *restart ? restart : "0") + "/" + next_scope(store_.get(), rank) + "/";
    gone_.assign(static_cast<size_t>(world_size), false);
    left_.assign(static_cast<size_t>(world_size), std::nullopt);
  }

  std::vector<std::optional<std::string>> exchange(int64_t round, const std::string& record,
                                                   std::chrono::milliseconds timeout) override {
    connect(timeout);
    store_->set(round_key(round, rank_), bytes(record));
    forget_old_rounds(round);

    std::vector<std::optional<std::string>> out(static_cast<size_t>(world_size_));
    out[static_cast<size_t>(rank_)] = record;
    std::vector<int64_t> waiting;
    for (int64_t r = 0; r < world_size_; ++r) {
      if (r != rank_) waiting.push_back(r);
    }
    // Usually every rank is already there: one round trip tells.
    std::vector<std::string> keys;
    for (int64_t r : waiting) keys.push_back(round_key(round, r));
    try {
      if (!keys.empty() && store_->check(keys)) {
        for (int64_t r : waiting) out[static_cast<size_t>(r)] = text(store_->get(round_key(round, r)));
        return out;
      }
      const auto deadline = Clock::now() + timeout;
      auto pause = std::chrono::microseconds(200);
      while (!waiting.empty()) {
        for (auto it = waiting.begin(); it != waiting.end();) {
          if (auto answer = poll(round, *it)) {
            out[static_cast<size_t>(*it)] = std::move(answer);
            it = waiting.erase(it);
          } else {
            ++it;
          }
        }
        // A rank that missed an earlier exchange is asked once, not waited for again.
        waiting.erase(std::remove_if(waiting.begin(), waiting.end(), [&](int64_t r) { return gone_[r]; }),
                      waiting.end());
        if (waiting.empty() || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
      }
    } catch (const std::exception& e) {
      // The store went away in the middle (its host, often rank 0, has exited): what was
      // gathered stands, and the rest did not answer.
      problem_ = std::string("the c10d store stopped answering: ") + e.what();
    }
    for (int64_t r : waiting) gone_[static_cast<size_t>(r)] = true;
    return out;
  }

  std::string problem() const override { return problem_; }

  void leave(const std::string& record) noexcept override {
    if (!store_) return;
    try {
      store_->set(prefix_ + "left/" + std::to_string(rank_), bytes(record));
    } catch (...) {
      // The others then name this rank as not answering: nothing is lost on this side.
    }
  }

  std::string describe() const override {
    return address_.empty() ? std::string("the c10d store given in RankOptions::channel")
                            : "the c10d store at " + address_;
  }

  void set_address(std::string a) { address_ = std::move(a); }

 private:
  static std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
  static std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
  std::string round_key(int64_t round, int64_t rank) const {
    return prefix_ + std::to_string(round) + "/" + std::to_string(rank);
  }

  std::optional<std::string> poll(int64_t round, int64_t r) {
    const std::string key = round_key(round, r);
    if (store_->check({key})) {
      gone_[static_cast<size_t>(r)] = false;
      return text(store_->get(key));
    }
    auto& left = left_[static_cast<size_t>(r)];
    if (!left) {
      const std::string leave_key = prefix_ + "left/" + std::to_string(r);
      if (store_->check({leave_key})) left = text(store_->get(leave_key));
    }
    return left;
  }

  // Each rank removes its own keys once no rank in lockstep can still need them.
  void forget_old_rounds(int64_t round) {
    published_.push_back(round);
    while (published_.size() > 16) {
      store_->deleteKey(round_key(published_.front(), rank_));
      published_.pop_front();
    }
  }

  void connect(std::chrono::milliseconds timeout) {
    if (!problem_.empty()) throw std::runtime_error(problem_);
    if (store_) return;
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (!addr || !*addr || !port || !*port) {
      throw ChannelUnavailable(
          "MASTER_ADDR and MASTER_PORT are not set: no c10d store to exchange through (pass one with "
          "RankOptions::channel(sentinel::store_channel(store)))");
    }
    int64_t p = 0;
    try {
      p = std::stoll(port);
    } catch (...) {
      p = -1;
    }
    if (p <= 0 || p > 65535) throw ChannelUnavailable(std::string("MASTER_PORT is not a port number: '") + port + "'");
    address_ = std::string(addr) + ":" + port;
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(p);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout = timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(addr, o);
    } catch (const std::exception& e) {
 throw ChannelUnavailable("cannot reach the c10d store at " + address_ + ": " + e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string address_;
  int64_t rank_ = 0, world_size_ = 1;
  std::string prefix_;
  std::vector<bool> gone_;
  std::vector<std::optional<std::string>> left_;
  std::deque<int64_t> published_;
  std::string problem_;
};

}  // namespace

std::shared_ptr<RankChannel> default_channel() {
  return std::make_shared<StoreChannel>(c10::intrusive_ptr<c10d::Store>());
}

}  // namespace ranks

std::shared_ptr<RankChannel> store_channel(c10::intrusive_ptr<c10d::Store> store) {
  if (!store) throw OptionError("sentinel::store_channel: the store is null");
  return std::make_shared<ranks::StoreChannel>(std::move(store));
}

}  // namespace sentinel

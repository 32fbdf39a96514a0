// Records through the c10d store. Each rank sets its key for the round and polls for the others';
// a heartbeat key tells a slow rank (waited for) from a dead one (given up after a short silence),
// so a rank that never answers is named instead of failing the whole exchange.
#include <sentinel/errors.h>
#include <sentinel/ranks.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "ranks/rank_channel.h"
#include "ranks/store_channel.h"

namespace sentinel {
namespace ranks {

namespace {

using Clock = std::chrono::steady_clock;

// Two watchdogs of one rank on one store exchange under different keys; SPMD programs make them
// in the same order on every rank, so the n-th watchdog of each rank meets the n-th of the
// others. (Counted per store object and rank: ranks simulated as threads of one process meet too.)
std::string next_scope(const void* store, int64_t rank) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int64_t>, int64_t> made;
  std::lock_guard<std::mutex> lock(mutex);
  return "w" + std::to_string(made[{store, rank}]++);
}

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

class StoreChannel final : public RankChannel {
 public:
  // `store` may be null: connect to the store at MASTER_ADDR:MASTER_PORT at the first exchange.
  explicit StoreChannel(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)), process_(getpid()) {}
  ~StoreChannel() override {
    if (getpid() != process_) {
      forget_in_forked_child();
    } else {
      stop_heartbeat();
    }
  }

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
    pulses_.assign(static_cast<size_t>(world_size), Pulse{});
  }

  std::vector<std::optional<std::string>> exchange(const std::string& round, const std::string& record,
                                                   RankWait wait) override {
    connect(wait.silence);
    start_heartbeat(wait.silence);
    problem_.clear();
    store_->set(round_key(round, rank_), bytes(record));
    forget_old_rounds(round);
    std::vector<std::optional<std::string>> out(static_cast<size_t>(world_size_));
    out[static_cast<size_t>(rank_)] = record;
    in_round_ = 1;
    gather({round}, wait, /*with_own_round=*/true, out);
    last_round_ = round;
    if (problem_.empty()) {
      try {
        store_->add(prefix_ + "read/" + round, 1);  // this rank has read the round (see leave)
      } catch (const std::exception&) {
      }
    }
    return out;
  }

  std::vector<std::optional<std::string>> gather_next(const std::vector<std::string>& rounds, RankWait wait) override {
    std::vector<std::optional<std::string>> out(static_cast<size_t>(world_size_));
    if (!store_) return out;
    problem_.clear();
    gather(rounds, wait, /*with_own_round=*/false, out);
    return out;
  }

  void leave(const std::string& record, RankWait wait) noexcept override {
    if (!store_) return;
    try {
      store_->set(prefix_ + "left/" + std::to_string(rank_), bytes(record));
      // If this process serves the store, leaving may take it away: first let the ranks that
      // answered the last round finish reading it.
      if (!last_round_.empty()) {
        const auto deadline = Clock::now() + wait.silence;
        while (store_->add(prefix_ + "read/" + last_round_, 0) < in_round_ && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
    } catch (...) {
      // The others then name this rank as not answering: nothing is lost on this side.
    }
    stop_heartbeat();
  }

  std::string problem() const override { return problem_; }

  std::string describe() const override {
    return address_.empty() ? std::string("the c10d store given in RankOptions::channel")
                            : "the c10d store at " + address_;
  }

 private:
  struct Pulse {
    std::string beat;           // the last heartbeat value seen
    Clock::time_point changed;  // when it was seen to change
    bool seen = false;          // a heartbeat was ever seen (else: not started yet)
  };

  std::string round_key(const std::string& round, int64_t rank) const {
    return prefix_ + round + "/" + std::to_string(rank);
  }

  // Fills out[r] for every other rank from the first of `rounds` it has published, or its
  // farewell, waiting while it is alive.
  void gather(const std::vector<std::string>& rounds, RankWait wait, bool with_own_round,
              std::vector<std::optional<std::string>>& out) {
    std::vector<int64_t> waiting;
    for (int64_t r = 0; r < world_size_; ++r) {
      if (r != rank_) waiting.push_back(r);
    }
    try {
      if (with_own_round && rounds.size() == 1) {
        // Usually every rank is already there: one round trip tells.
        std::vector<std::string> keys;
        for (int64_t r : waiting) keys.push_back(round_key(rounds[0], r));
        if (!keys.empty() && store_->check(keys)) {
          for (int64_t r : waiting) out[static_cast<size_t>(r)] = text(store_->get(round_key(rounds[0], r)));
          in_round_ += static_cast<int64_t>(waiting.size());
          return;
        }
      }
      const auto start = Clock::now();
      auto pause = std::chrono::microseconds(200);
      while (!waiting.empty()) {
        for (auto it = waiting.begin(); it != waiting.end();) {
          if (auto answer = poll(rounds, *it)) {
            out[static_cast<size_t>(*it)] = std::move(answer);
            it = waiting.erase(it);
          } else {
            ++it;
          }
        }
        const auto now = Clock::now();
        waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                     [&](int64_t r) { return given_up(r, start, now, wait); }),
                      waiting.end());
        if (waiting.empty()) break;
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
      }
    } catch (const std::exception& e) {
      // The store went away in the middle (its host, often rank 0, has exited): what was
      // gathered stands, and the rest did not answer.
      problem_ = std::string("the c10d store stopped answering: ") + e.what();
    }
  }

  std::optional<std::string> poll(const std::vector<std::string>& rounds, int64_t r) {
    for (const auto& round : rounds) {
      const std::string key = round_key(round, r);
      if (store_->check({key})) {
        ++in_round_;
        return text(store_->get(key));
      }
    }
    const std::string leave_key = prefix_ + "left/" + std::to_string(r);
    if (store_->check({leave_key})) return text(store_->get(leave_key));
    return std::nullopt;
  }

  // A rank whose heartbeat has not moved for `silence` is dead; one that never beat (not started
  // yet) and one that beats (alive, slow) are waited for up to `longest`.
  bool given_up(int64_t r, Clock::time_point start, Clock::time_point now, RankWait wait) {
    Pulse& p = pulses_[static_cast<size_t>(r)];
    const std::string key = prefix_ + "hb/" + std::to_string(r);
    if (store_->check({key})) {
      std::string beat = text(store_->get(key));
      if (!p.seen || beat != p.beat) {
        p.beat = std::move(beat);
        p.changed = now;
        p.seen = true;
      }
    }
    if (now - start >= wait.longest) return true;
    return p.seen && now - p.changed >= wait.silence;
  }

  void start_heartbeat(std::chrono::milliseconds silence) {
    std::lock_guard<std::mutex> lock(beat_mutex_);
    if (beating_) return;
    beating_ = true;
    const auto period = std::clamp<std::chrono::milliseconds>(silence / 5, std::chrono::milliseconds(20),
                                                              std::chrono::milliseconds(1000));
    heart_ = std::thread([this, period] {
      int64_t beat = 0;
      std::unique_lock<std::mutex> lock(beat_mutex_);
      while (beating_) {
        lock.unlock();
        try {
          store_->set(prefix_ + "hb/" + std::to_string(rank_), bytes(std::to_string(++beat)));
        } catch (...) {
          // A store that stopped answering: the others see this rank fall silent, as they should.
        }
        lock.lock();
        beat_cv_.wait_for(lock, period, [this] { return !beating_; });
      }
    });
  }

  void stop_heartbeat() noexcept {
    {
      std::lock_guard<std::mutex> lock(beat_mutex_);
      if (!beating_) return;
      beating_ = false;
    }
    beat_cv_.notify_all();
    if (heart_.joinable()) heart_.join();
  }

  // In a child forked from the rank, which has only the forking thread: the heartbeat's thread is
  // not there, and its mutex and condition variable may still be held or waited on by it, so
  // joining, locking, signalling or destroying them would wait forever. Fresh ones take their
  // place, the old ones not destroyed. The store stays the parent's: closing it here could end
  // the rank's connection or wait for a store server thread the child does not have.
  void forget_in_forked_child() noexcept {
    new (&heart_) std::thread;
    new (&beat_cv_) std::condition_variable;
    new (&beat_mutex_) std::mutex;
    beating_ = false;
    (void)store_.release();
  }

  // Each rank removes its own keys once no rank in lockstep can still need them.
  void forget_old_rounds(const std::string& round) {
    published_.push_back(round);
    while (published_.size() > 32) {
      store_->deleteKey(round_key(published_.front(), rank_));
      store_->deleteKey(prefix_ + "read/" + published_.front());
      published_.pop_front();
    }
  }

  void connect(std::chrono::milliseconds timeout) {
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
  std::vector<Pulse> pulses_;
  std::deque<std::string> published_;
  std::string last_round_;  // the last round this rank exchanged, and how many ranks took part in it
  int64_t in_round_ = 0;    // (answers from a farewell do not: those ranks will not read it)
  std::string problem_;
  std::mutex beat_mutex_;
  std::condition_variable beat_cv_;
  bool beating_ = false;
  std::thread heart_;
  int64_t process_;  // the rank's process id
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

#include "ranks/rank_session.h"

#include <sentinel/errors.h>

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "ranks/store_channel.h"

namespace sentinel {
namespace ranks {

namespace {

std::optional<int64_t> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  try {
    size_t used = 0;
    const int64_t x = std::stoll(v, &used);
    if (used == std::string(v).size()) return x;
  } catch (...) {
  }
  throw OptionError(std::string("sentinel: the environment variable ") + name + " must be an integer, got '" + v + "'");
}

}  // namespace

Identity resolve_identity(const RankOptions& options, const RankChannel* channel) {
  Identity id;
  id.source = "one process";
  if (channel && channel->world_size() > 0) {
    id.rank = channel->rank();
    id.world_size = channel->world_size();
    id.source = "the process group";
  } else if (auto world = env_int("WORLD_SIZE")) {
    const auto rank = env_int("RANK");
    if (*world < 1) throw OptionError("sentinel: WORLD_SIZE must be at least 1, got " + std::to_string(*world));
    if (*world > 1 && !rank) throw OptionError("sentinel: WORLD_SIZE is " + std::to_string(*world) + " but RANK is not set");
    id.world_size = *world;
    id.rank = rank.value_or(0);
    id.source = "RANK and WORLD_SIZE";
  }
  if (options.world_size() != -1) {
    id.world_size = options.world_size();
    id.source = "RankOptions";
  }
  if (options.rank() != -1) {
    id.rank = options.rank();
    id.source = "RankOptions";
  }
  id.local_rank = env_int("LOCAL_RANK").value_or(-1);
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) id.host = host;
  if (id.rank < 0 || id.rank >= id.world_size) {
    throw OptionError("sentinel: rank " + std::to_string(id.rank) + " (from " + id.source +
                      ") is not in [0, world size " + std::to_string(id.world_size) + ")");
  }
  return id;
}

RankSession::RankSession(const RankOptions& options)
    : exchange_(options.exchange()),
      timeout_seconds_(options.timeout_seconds()),
      channel_(options.channel()),
      process_(getpid()) {
  id_ = resolve_identity(options, channel_.get());
  wait_.silence = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds() * 1000));
  wait_.longest = std::chrono::milliseconds(static_cast<int64_t>(options.max_wait_seconds() * 1000));
  self_.rank = id_.rank;
  if (exchanging() && !channel_) channel_ = default_channel();
  if (exchanging()) channel_->bind(id_.rank, id_.world_size);
}

std::string RankSession::files_dir(const std::string& report_dir) const {
  if (report_dir.empty() || !distributed()) return report_dir;
  return (std::filesystem::path(report_dir) / ("rank" + std::to_string(id_.rank))).string();
}

void RankSession::note_trip(const RankEvent& event) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (!self_.tripped) self_.tripped = event;
}

std::optional<RankEvent> RankSession::own_trip() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return self_.tripped;
}

bool RankSession::untold_trip() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return exchanging() && self_.tripped && !told_ && failure_.empty();
}

RankAgreement RankSession::agreement_from(int64_t batch, const RankRecord& self,
                                          const std::vector<std::optional<std::string>>& texts) const {
  std::vector<std::optional<RankRecord>> records(static_cast<size_t>(id_.world_size));
  std::vector<int64_t> unreadable;
  for (int64_t r = 0; r < id_.world_size && r < static_cast<int64_t>(texts.size()); ++r) {
    if (!texts[r] || r == id_.rank) continue;
    auto rec = decode(*texts[r]);
    if (rec && rec->rank == r) {
      records[r] = std::move(rec);
    } else {
      unreadable.push_back(r);
    }
  }
  RankAgreement agreed = agree(batch, self, records, unreadable);
  agreed.host = id_.host;
  agreed.local_rank = id_.local_rank;
  const std::string trouble = channel_->problem();
  if (!trouble.empty()) agreed.problem += (agreed.problem.empty() ? "" : "; ") + trouble;
  return agreed;
}

RankAgreement RankSession::channel_failed(const std::exception& e, const RankRecord& self) {
  RankAgreement a;
  if (dynamic_cast<const ChannelUnavailable*>(&e)) {
    // Nothing says a rank failed: the ranks cannot talk at all. Say so once and watch alone.
    a.problem = std::string(e.what()) + " (no exchanges: this rank watches on its own)";
  } else {
    a.problem = "the exchange through " + channel_->describe() + " failed: " + e.what() +
                " (no further exchanges; this rank keeps watching on its own)";
    // Which ranks would have answered is unknown: name them all.
    for (int64_t r = 0; r < id_.world_size; ++r) {
      if (r != id_.rank) a.missing.push_back(r);
    }
    a.exchanged = true;
    a.role = self.tripped ? self.tripped->role : RankRole::Stopped;
  }
  a.host = id_.host;
  a.local_rank = id_.local_rank;
  std::lock_guard<std::mutex> lock(state_mutex_);
  failure_ = a.problem;
  return a;
}

std::optional<RankAgreement> RankSession::exchange(int64_t batch, Phase phase) {
  if (!exchanging()) return std::nullopt;
  std::lock_guard<std::mutex> channel_lock(channel_mutex_);
  RankRecord self;
  std::string round;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    int64_t& last = last_batch_[static_cast<int>(phase)];
    if (last >= batch || left_) return std::nullopt;
    last = batch;
    if (!failure_.empty()) return std::nullopt;  // said once, when it failed
    self = self_;
    if (self.tripped) told_ = true;
    round = round_name(batch, phase == Phase::Backward ? "b" : "e");
  }
  try {
    return agreement_from(batch, self, channel_->exchange(round, encode(self), wait_));
  } catch (const std::exception& e) {
    return channel_failed(e, self);
  }
}

std::optional<RankAgreement> RankSession::announce(int64_t batch) {
  if (!untold_trip()) return std::nullopt;
  RankRecord self;
  // The others hear of it at their next round, of this batch or the next, and answer there.
  std::vector<std::string> rounds;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    told_ = true;
    self = self_;
    for (int64_t b : {batch, batch + 1}) {
      for (const char* phase : {"b", "e"}) rounds.push_back(round_name(b, phase));
    }
  }
  leave(batch);
  std::lock_guard<std::mutex> channel_lock(channel_mutex_);
  try {
    auto texts = channel_->gather_next(rounds, wait_);
    if (texts.empty()) return std::nullopt;  // a collective cannot gather from one rank
    texts[static_cast<size_t>(id_.rank)] = encode(self);
    return agreement_from(batch, self, texts);
  } catch (const std::exception& e) {
    return channel_failed(e, self);
  }
}

void RankSession::renumber() {
  std::lock_guard<std::mutex> lock(state_mutex_);
  ++numbering_;
  last_batch_[0] = last_batch_[1] = -1;
}

std::string RankSession::round_name(int64_t batch, const char* phase) const {
  // The first numbering keeps the plain names ("3b", "3e").
  return numbering_ == 0 ? fmt::format("{}{}", batch, phase) : fmt::format("n{}.{}{}", numbering_, batch, phase);
}

void RankSession::leave(int64_t batch, bool aborted) noexcept {
  if (!exchanging()) return;
  RankRecord farewell;
  {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (left_ || !failure_.empty()) return;
    left_ = true;
    farewell = self_;
    farewell.last_round = batch;
  }
  farewell.left = true;
  farewell.aborted = aborted;
  try {
    std::lock_guard<std::mutex> channel_lock(channel_mutex_);
    channel_->leave(encode(farewell), wait_);
  } catch (...) {
  }
}

}  // namespace ranks
}  // namespace sentinel

// The ranks' exchange inside one process: records, ordering, identity, the store channel with
// answers, silence, farewells and garbage, the process-group channel on Gloo, and two watchdogs
// on two threads standing for two ranks. (tests/ranks runs real processes.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#if SENTINEL_HAVE_GLOO
#include "examples/gloo_group.h"
#endif

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ranks/rank_record.h"
#include "ranks/rank_session.h"
#include "support/forked_child.h"
#include "support/test_models.h"

namespace {

using sentinel::RankEvent;
using sentinel::RankRole;
using sentinel::ranks::RankRecord;

RankEvent event(int64_t rank, int64_t batch, sentinel::Direction d, int64_t op) {
  RankEvent e;
  e.rank = rank;
  e.batch_number = batch;
  e.direction = d;
  e.op_index = op;
  e.frame = "fc" + std::to_string(op) + " (Linear) aten::addmm";
  e.origin = "origin: op " + std::to_string(op);
  return e;
}

RankRecord record(int64_t rank, std::optional<RankEvent> e = std::nullopt) {
  RankRecord r;
  r.rank = rank;
  r.tripped = std::move(e);
  return r;
}

// Stores live as long as the test program: a store's address keys the watchdogs' scopes on it.
// A store in `file` is shared with forked children; one in memory is not.
c10::intrusive_ptr<c10d::Store> new_store(const std::string& file = "") {
  static std::vector<c10::intrusive_ptr<c10d::Store>> keep;
  if (file.empty()) {
    keep.push_back(c10::make_intrusive<c10d::HashStore>());
  } else {
    keep.push_back(c10::make_intrusive<c10d::FileStore>(file, -1));
  }
  return keep.back();
}

sentinel::RankOptions rank_options(int64_t rank, int64_t world, const c10::intrusive_ptr<c10d::Store>& store,
                                   double timeout = 5, double max_wait = 60) {
  return sentinel::RankOptions()
      .rank(rank)
      .world_size(world)
      .timeout_seconds(timeout)
      .max_wait_seconds(max_wait)
      .channel(sentinel::store_channel(store));
}

using sentinel::ranks::Phase;

struct EnvGuard {  // sets variables for one test and restores them
  explicit EnvGuard(std::vector<std::pair<std::string, std::string>> vars) {
    for (auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      if (v.empty()) unsetenv(k.c_str());
      else setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
};

TEST(RankRecord, RoundTripsAndRejectsWhatIsNotARecord) {
  RankEvent e = event(3, 7, sentinel::Direction::Backward, 42);
  e.role = RankRole::Received;
  e.frame = "line one\nline two";
  e.origin = std::string(5000, 'x');
  RankRecord r = record(3, e);
  const std::string text = sentinel::ranks::encode(r);
  EXPECT_LE(text.size(), sentinel::ranks::kMaxRecordBytes);
  auto back = sentinel::ranks::decode(text);
  ASSERT_TRUE(back && back->tripped);
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->tripped->rank, 3);
  EXPECT_EQ(back->tripped->batch_number, 7);
  EXPECT_EQ(back->tripped->direction, sentinel::Direction::Backward);
  EXPECT_EQ(back->tripped->op_index, 42);
  EXPECT_EQ(back->tripped->role, RankRole::Received);
  EXPECT_EQ(back->tripped->frame, "line one line two");
  EXPECT_FALSE(back->left);

  auto clean = sentinel::ranks::decode(sentinel::ranks::encode(record(1)));
  ASSERT_TRUE(clean);
  EXPECT_FALSE(clean->tripped);
  for (const char* bad : {"", "garbage", "sentinel-rank-record 1\nrank=x\n", "sentinel-rank-record 1\nleft=0\n",
                          "sentinel-rank-record 1\nrank=1\nbatch=2\n", "sentinel-rank-record 1\nrank=-4\n"}) {
    EXPECT_FALSE(sentinel::ranks::decode(bad)) << bad;
  }
}

TEST(RankAgreement, FirstIsOrderedByBatchMadeBeforeReceivedOpThenRank) {
  using D = sentinel::Direction;
  // Same batch: the op index (one sequence over forward and backward), then the rank; but a rank
  // that received its inf/nan comes after every rank that made one.
  RankEvent received = event(0, 2, D::Forward, 1);
  received.role = RankRole::Received;
  std::vector<std::optional<RankRecord>> records = {
      record(0, received), record(1, event(1, 2, D::Backward, 30)),
      record(2, event(2, 2, D::Forward, 30)), record(3, event(3, 3, D::Forward, 0))};
  auto a = sentinel::ranks::agree(0, *records[3], records, {});
  ASSERT_TRUE(a.first);
  EXPECT_EQ(a.first->rank, 1);
  EXPECT_EQ(a.tripped, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(a.missing.empty());
  EXPECT_EQ(a.role, RankRole::Made);
  // An earlier batch wins over everything in a later one.
  records[0] = record(0, event(0, 1, D::Backward, 99));
  EXPECT_EQ(sentinel::ranks::agree(0, *records[3], records, {}).first->rank, 0);
}

TEST(RankAgreement, SilentRanksAreMissingAndACleanRankIsStopped) {
  std::vector<std::optional<RankRecord>> records = {record(0), std::nullopt,
                                                    record(2, event(2, 5, sentinel::Direction::Forward, 3)),
                                                    std::nullopt};
  auto a = sentinel::ranks::agree(0, *records[0], records, {3});
  EXPECT_EQ(a.missing, (std::vector<int64_t>{1, 3}));
  EXPECT_NE(a.problem.find("unreadable records from rank 3"), std::string::npos) << a.problem;
  ASSERT_TRUE(a.first);
  EXPECT_EQ(a.first->rank, 2);
  EXPECT_EQ(a.role, RankRole::Stopped);
  // Nobody tripped, nobody missing: nothing to stop for.
  std::vector<std::optional<RankRecord>> calm = {record(0), record(1)};
  auto b = sentinel::ranks::agree(0, *calm[0], calm, {});
  EXPECT_FALSE(b.first);
  EXPECT_EQ(b.role, RankRole::Alone);
}

TEST(RankAgreement, ARankThatLeftIsMissingFromLaterRoundsOrAtOnceIfAnExceptionTookIt) {
  RankRecord gone = record(1);
  gone.left = true;
  gone.last_round = 4;
  auto back = sentinel::ranks::decode(sentinel::ranks::encode(gone));
  ASSERT_TRUE(back);
  EXPECT_TRUE(back->left);
  EXPECT_EQ(back->last_round, 4);
  std::vector<std::optional<RankRecord>> records = {record(0), *back};
  EXPECT_TRUE(sentinel::ranks::agree(4, *records[0], records, {}).missing.empty()) << "its last round";
  auto later = sentinel::ranks::agree(5, *records[0], records, {});
  EXPECT_EQ(later.missing, (std::vector<int64_t>{1}));
  EXPECT_NE(later.problem.find("rank 1 left after batch 4"), std::string::npos) << later.problem;
  EXPECT_EQ(later.role, RankRole::Stopped);
  records[1]->aborted = true;
  auto now = sentinel::ranks::agree(4, *records[0], records, {});
  EXPECT_EQ(now.missing, (std::vector<int64_t>{1}));
  EXPECT_NE(now.problem.find("exception unwound its batch 4"), std::string::npos) << now.problem;
  // One that left with an inf/nan answers with it, whenever asked.
  records[1]->tripped = event(1, 4, sentinel::Direction::Forward, 9);
  auto tripped = sentinel::ranks::agree(7, *records[0], records, {});
  EXPECT_TRUE(tripped.missing.empty());
  ASSERT_TRUE(tripped.first);
  EXPECT_EQ(tripped.first->rank, 1);
}

TEST(RankIdentity, FromTorchrunsVariablesOptionsAndErrorsNamingTheVariable) {
  {
    EnvGuard env({{"RANK", "2"}, {"WORLD_SIZE", "4"}});
    auto id = sentinel::ranks::resolve_identity(sentinel::RankOptions(), nullptr);
    EXPECT_EQ(id.rank, 2);
    EXPECT_EQ(id.world_size, 4);
    auto over = sentinel::ranks::resolve_identity(sentinel::RankOptions().rank(1).world_size(2), nullptr);
    EXPECT_EQ(over.rank, 1);
    EXPECT_EQ(over.world_size, 2);
  }
  {
    EnvGuard env({{"RANK", ""}, {"WORLD_SIZE", ""}});
    auto id = sentinel::ranks::resolve_identity(sentinel::RankOptions(), nullptr);
    EXPECT_EQ(id.rank, 0);
    EXPECT_EQ(id.world_size, 1);
  }
  auto error = [](std::vector<std::pair<std::string, std::string>> vars, sentinel::RankOptions o) -> std::string {
    EnvGuard env(std::move(vars));
    try {
      sentinel::ranks::resolve_identity(o, nullptr);
    } catch (const sentinel::OptionError& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_NE(error({{"RANK", "0"}, {"WORLD_SIZE", "two"}}, {}).find("WORLD_SIZE must be an integer, got 'two'"),
            std::string::npos);
  EXPECT_NE(error({{"RANK", ""}, {"WORLD_SIZE", "3"}}, {}).find("RANK is not set"), std::string::npos);
  EXPECT_NE(error({{"RANK", "5"}, {"WORLD_SIZE", "3"}}, {}).find("rank 5"), std::string::npos);
  EXPECT_NE(error({{"RANK", ""}, {"WORLD_SIZE", ""}}, sentinel::RankOptions().rank(3)).find("rank 3"),
            std::string::npos);
}

// Each rank of `world` on its own thread: `act(session)` returns what that rank agreed on.
std::vector<sentinel::RankAgreement> on_threads(int64_t world,
                                                const std::function<sentinel::RankAgreement(int64_t)>& act) {
  std::vector<sentinel::RankAgreement> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) threads.emplace_back([&, r] { out[r] = act(r); });
  for (auto& t : threads) t.join();
  return out;
}

TEST(StoreChannel, EveryRankAgreesOnTheFirstTripAndItsRole) {
  auto store = new_store();
  std::vector<std::unique_ptr<sentinel::ranks::RankSession>> s;
  for (int64_t r = 0; r < 3; ++r) s.push_back(std::make_unique<sentinel::ranks::RankSession>(rank_options(r, 3, store)));
  s[2]->note_trip(event(2, 4, sentinel::Direction::Forward, 11));
  s[1]->note_trip(event(1, 4, sentinel::Direction::Backward, 40));  // later in the batch's one op sequence
  for (int64_t round : {0, 1, 4}) {
    auto agreed = on_threads(3, [&](int64_t r) { return *s[r]->exchange(round, Phase::BatchEnd); });
    for (int64_t r = 0; r < 3; ++r) {
      const auto& a = agreed[r];
      EXPECT_TRUE(a.exchanged);
      EXPECT_TRUE(a.missing.empty()) << "rank " << r;
      ASSERT_TRUE(a.first) << "rank " << r;
      EXPECT_EQ(a.first->rank, 2);
      EXPECT_EQ(a.first->op_index, 11);
      EXPECT_EQ(a.tripped, (std::vector<int64_t>{1, 2}));
      EXPECT_EQ(a.role, r == 0 ? RankRole::Stopped : RankRole::Made);
      EXPECT_FALSE(s[r]->exchange(round, Phase::BatchEnd)) << "a second exchange in one round";
    }
  }
}

// Waits of seconds, not tenths: a live rank's thread may be descheduled for a good part of a second
// on a busy machine, and must not be taken for one that never started.
TEST(StoreChannel, ARankThatNeverStartsIsNamedAfterTheLongestWait) {
  auto store = new_store();
  sentinel::ranks::RankSession r0(rank_options(0, 3, store, 1, 3));
  sentinel::ranks::RankSession r1(rank_options(1, 3, store, 1, 3));
  sentinel::ranks::RankSession r2(rank_options(2, 3, store, 1, 3));  // never exchanges
  auto agreed = on_threads(2, [&](int64_t r) { return *(r == 0 ? r0 : r1).exchange(0, Phase::BatchEnd); });
  for (const auto& a : agreed) {
    EXPECT_EQ(a.missing, (std::vector<int64_t>{2}));
    EXPECT_FALSE(a.first);
    EXPECT_EQ(a.role, RankRole::Stopped);
  }
  // Rank 2 leaves with a trip: later rounds take its farewell as its answer.
  r2.note_trip(event(2, 0, sentinel::Direction::Forward, 5));
  r2.leave(0);
  agreed = on_threads(2, [&](int64_t r) { return *(r == 0 ? r0 : r1).exchange(1, Phase::BatchEnd); });
  for (const auto& a : agreed) {
    EXPECT_TRUE(a.missing.empty());
    ASSERT_TRUE(a.first);
    EXPECT_EQ(a.first->rank, 2);
  }
}

// A rank that is alive but late (rank 0 writing a checkpoint) is waited for, however long past the
// silence timeout; one whose heartbeat stops (its process died) is given up.
TEST(StoreChannel, ASlowRankIsWaitedForAndADeadOneIsNot) {
  auto store = new_store();
  sentinel::ranks::RankSession r0(rank_options(0, 3, store, 1, 60));
  sentinel::ranks::RankSession r1(rank_options(1, 3, store, 1, 60));
  auto r2 = std::make_unique<sentinel::ranks::RankSession>(rank_options(2, 3, store, 1, 60));
  on_threads(3, [&](int64_t r) { return *(r == 0 ? r0 : r == 1 ? r1 : *r2).exchange(0, Phase::BatchEnd); });
  auto agreed = on_threads(3, [&](int64_t r) {
    // Three silences late (a silence of one second: a heartbeat every 200 ms, so that a busy
    // machine that holds the heartbeat's thread back a while does not end a live rank).
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    return *(r == 0 ? r0 : r == 1 ? r1 : *r2).exchange(1, Phase::BatchEnd);
  });
  for (const auto& a : agreed) EXPECT_TRUE(a.missing.empty()) << "rank 1 was only slow: " << a.problem;
  // Rank 2 made its last exchange in round 0 and then died: its heartbeat stopped with it.
  r2.reset();
  agreed = on_threads(2, [&](int64_t r) { return *(r == 0 ? r0 : r1).exchange(2, Phase::BatchEnd); });
  for (const auto& a : agreed) EXPECT_EQ(a.missing, (std::vector<int64_t>{2}));
}

// A rank that trips and stops between two rounds tells the others, who hear it at their next
// round; it gathers their answers from there, so its own report names the first rank too.
TEST(StoreChannel, ATripAnnouncedBetweenRoundsReachesTheOthersAndTheirAnswersComeBack) {
  auto store = new_store();
  std::vector<std::unique_ptr<sentinel::ranks::RankSession>> s;
  for (int64_t r = 0; r < 3; ++r) s.push_back(std::make_unique<sentinel::ranks::RankSession>(rank_options(r, 3, store)));
  s[1]->note_trip(event(1, 4, sentinel::Direction::Forward, 7));
  EXPECT_TRUE(s[1]->untold_trip());
  auto agreed = on_threads(3, [&](int64_t r) {
    return r == 1 ? *s[r]->announce(4) : *s[r]->exchange(4, Phase::Backward);
  });
  EXPECT_FALSE(s[1]->untold_trip());
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_TRUE(agreed[r].missing.empty()) << "rank " << r << ": " << agreed[r].problem;
    ASSERT_TRUE(agreed[r].first) << "rank " << r;
    EXPECT_EQ(agreed[r].first->rank, 1);
    EXPECT_EQ(agreed[r].role, r == 1 ? RankRole::Made : RankRole::Stopped);
  }
}

TEST(StoreChannel, AnUnreadableRecordIsNamedNotTrusted) {
  auto store = new_store();
  sentinel::ranks::RankSession r0(rank_options(0, 2, store, 0.3));
  sentinel::ranks::RankSession r1(rank_options(1, 2, store, 0.3));
  const std::string junk = "not a record";
  store->set("sentinel/0/w0/0e/1", std::vector<uint8_t>(junk.begin(), junk.end()));
  auto a = *r0.exchange(0, Phase::BatchEnd);
  EXPECT_EQ(a.missing, (std::vector<int64_t>{1}));
  EXPECT_NE(a.problem.find("unreadable records from rank 1"), std::string::npos) << a.problem;
}

TEST(StoreChannel, OneChannelServesOneWatchdog) {
  auto channel = sentinel::store_channel(new_store());
  sentinel::ranks::RankSession first(sentinel::RankOptions().rank(0).world_size(2).channel(channel));
  EXPECT_THROW(sentinel::ranks::RankSession(sentinel::RankOptions().rank(1).world_size(2).channel(channel)),
               sentinel::OptionError);
}

TEST(StoreChannel, NoStoreToReachIsSaidOnceAndTheRankWatchesAlone) {
  EnvGuard env({{"MASTER_ADDR", ""}, {"MASTER_PORT", ""}});
  sentinel::ranks::RankSession s(sentinel::RankOptions().rank(0).world_size(2));
  auto a = *s.exchange(0, Phase::BatchEnd);
  EXPECT_FALSE(a.exchanged);
  EXPECT_NE(a.problem.find("MASTER_ADDR and MASTER_PORT are not set"), std::string::npos) << a.problem;
  EXPECT_TRUE(a.missing.empty());
  EXPECT_FALSE(s.exchange(1, Phase::BatchEnd)) << "said once, then silent";
}

// A child forked from a rank (a data worker, a tool run beside training) is not that rank: it
// must not exchange in the rank's name, and destroying what it inherited must neither tell the
// others that the rank left, nor wait for the heartbeat's thread, which the child does not have.
TEST(StoreChannel, AForkedChildNeitherSpeaksForTheRankNorWaitsForItsHeartbeat) {
  const auto file = std::filesystem::temp_directory_path() / ("sentinel_fork_store_" + std::to_string(getpid()));
  std::filesystem::remove(file);
  auto store = new_store(file.string());
  std::vector<std::unique_ptr<sentinel::ranks::RankSession>> s;
  for (int64_t r = 0; r < 2; ++r) s.push_back(std::make_unique<sentinel::ranks::RankSession>(rank_options(r, 2, store)));
  on_threads(2, [&](int64_t r) { return *s[r]->exchange(0, Phase::BatchEnd); });  // the heartbeats beat
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed";
  if (pid == 0) {  // a batch's end, then what the inherited watchdogs' destructors do
    if (s[0]->exchange(1, Phase::BatchEnd) || s[0]->announce(1)) _exit(2);
    s[1]->leave(0);
    s.clear();
    _exit(0);
  }
  sentinel_test::expect_child_exits_with_zero(pid, "the forked child exchanged in the rank's name");
  // Rank 0 looks first: a farewell the child had left for rank 1 would be its answer.
  auto agreed = on_threads(2, [&](int64_t r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return *s[r]->exchange(1, Phase::BatchEnd);
  });
  for (int64_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(agreed[r].exchanged) << "rank " << r << ": " << agreed[r].problem;
    EXPECT_TRUE(agreed[r].missing.empty()) << "rank " << r << " was told that a running rank left";
  }
  s.clear();
  std::filesystem::remove(file);
}

#if SENTINEL_HAVE_GLOO
TEST(GroupChannel, AllGatherOnGlooGivesTheSameAgreement) {
  auto store = new_store();
  std::vector<sentinel::RankAgreement> agreed(2);
  std::vector<int64_t> ranks_seen(2, -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto pg = sentinel_examples::gloo_group(store, r, 2, std::chrono::seconds(30));
      sentinel::ranks::RankSession s(sentinel::RankOptions().channel(sentinel::group_channel(pg)));
      ranks_seen[r] = s.identity().rank;
      if (r == 1) s.note_trip(event(1, 0, sentinel::Direction::Forward, 8));
      agreed[r] = *s.exchange(0, Phase::Backward);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ranks_seen, (std::vector<int64_t>{0, 1}));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(agreed[r].first) << agreed[r].problem;
    EXPECT_EQ(agreed[r].first->rank, 1);
    EXPECT_EQ(agreed[r].first->op_index, 8);
    EXPECT_EQ(agreed[r].role, r == 1 ? RankRole::Made : RankRole::Stopped);
  }
}
#endif

// Two watchdogs on two threads stand for two ranks: rank 1's batch overflows; at the batch's end
// both ranks exchange and both stop, each saying rank 1 was first, rank 1 with its own frames.
TEST(RankWatchdog, EveryRankStopsAndNamesTheFirstRankInItsReportAndFiles) {
  auto store = new_store();
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_ranks_watchdog";
  std::filesystem::remove_all(dir);
  std::vector<std::optional<sentinel::Report>> reports(2);
  std::vector<std::string> texts(2);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      torch::manual_seed(0);
      sentinel_test::Mlp model;
      std::ostringstream out;
      sentinel::Watchdog watch(model.ptr(), sentinel::Options()
                                                .output(out)
                                                .report_dir(dir.string())
                                                .max_frames_to_save(4)
                                                .ranks(rank_options(r, 2, store)));
      try {
        for (int step = 0; step < 3; ++step) {
          auto batch = watch.batch();
          auto x = torch::ones({2, 4});
          if (r == 1 && step == 1) x.fill_(std::numeric_limits<float>::infinity());
          model->forward(x);
          batch.finish();
        }
      } catch (const sentinel::NonFiniteError& e) {
        reports[r] = e.report();
      }
      texts[r] = out.str();
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(reports[r]) << "rank " << r << " did not stop:\n" << texts[r];
    const auto& rep = *reports[r];
    EXPECT_EQ(rep.rank, r);
    EXPECT_EQ(rep.world_size, 2);
    EXPECT_EQ(rep.batch_number, 1);
    ASSERT_TRUE(rep.ranks.first);
    EXPECT_EQ(rep.ranks.first->rank, 1);
    EXPECT_EQ(rep.ranks.first->batch_number, 1);
    EXPECT_EQ(rep.ranks.first->op_index, reports[1]->trigger().op_index);
    EXPECT_EQ(rep.ranks.first->direction, sentinel::Direction::Forward);
    EXPECT_EQ(rep.ranks.tripped, (std::vector<int64_t>{1}));
    EXPECT_EQ(rep.kind, r == 1 ? "nonfinite" : "peer_nonfinite");
    EXPECT_EQ(rep.ranks.role, r == 1 ? RankRole::Made : RankRole::Stopped);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    EXPECT_EQ(rep.ranks.host, host);
    EXPECT_EQ(rep.ranks.first->host, host);
    EXPECT_NE(texts[r].find("Ranks: this is rank " + std::to_string(r) + " of 2 (on " + host + ")."), std::string::npos)
        << texts[r];
    // Each rank's files in its own directory, and the files carry the agreement.
    const auto json_file = dir / ("rank" + std::to_string(r)) /
                           (r == 1 ? "sentinel_batch1.json" : "sentinel_peer_batch1.json");
    std::ifstream in(json_file);
    std::stringstream content;
    content << in.rdbuf();
    EXPECT_NE(content.str().find("\"first\": {"), std::string::npos) << json_file << "\n" << content.str();
  }
  EXPECT_NE(reports[0]->origin.find("on rank 1"), std::string::npos) << reports[0]->origin;
  EXPECT_FALSE(std::filesystem::exists(dir / "sentinel_batch1.json"));  // nothing shared between ranks
}

TEST(RankWatchdog, ARankAloneWithoutExchangeStillLabelsItsReportAndDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "sentinel_ranks_alone";
  std::filesystem::remove_all(dir);
  sentinel_test::Mlp model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options()
                                            .output(out)
                                            .report_dir(dir.string())
                                            .trace_batch_nums({0})
                                            .ranks(sentinel::RankOptions().rank(3).world_size(4).exchange(false)));
  { watch.batch().finish(); }
  auto batch = watch.batch();
  model->forward(torch::full({1, 4}, std::numeric_limits<float>::quiet_NaN()));
  EXPECT_THROW(batch.finish(), sentinel::NonFiniteError);
  EXPECT_NE(out.str().find("*** Starting batch number=0 on rank 3 ***"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("Detected inf/nan during batch_number=1 on rank 3"), std::string::npos);
  EXPECT_NE(out.str().find("The ranks have not exchanged"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir / "rank3" / "sentinel_batch1.json"));
}

}  // namespace

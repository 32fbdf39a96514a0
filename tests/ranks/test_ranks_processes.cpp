// Real processes: examples/ranks_data_parallel.cpp started as 2 and 4 ranks with the variables
// torchrun sets (Debian's torchrun cannot start), on localhost. One rank gets a bad batch or is
// killed in the middle of a step; every other rank must finish, with its own report, naming the
// rank that saw inf/nan first.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 29600 + static_cast<int>(getpid() % 1000);
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RankRun {
  fs::path dir;                 // the report directory the ranks share (each writes rank<R>/)
  std::vector<int> status;      // waitpid status per rank
  std::vector<std::string> log; // stdout + stderr per rank
  bool hung = false;

  bool exited_ok(int r) const { return WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0; }
  bool killed(int r) const { return WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL; }
  json report(int r, const std::string& name) const {
    const fs::path p = dir / ("rank" + std::to_string(r)) / name;
    if (!fs::exists(p)) return json();
    return json::parse(read_file(p), nullptr, false);
  }
};

// Starts `world` ranks of the example and waits for all (killing them all if they hang).
RankRun launch(const std::string& name, int world, const std::map<std::string, std::string>& knobs) {
  RankRun run;
  run.dir = fs::temp_directory_path() / ("sentinel_ranks_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(run.dir);
  fs::create_directories(run.dir);
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> pids;
  std::fflush(stdout);  // a child must not inherit, and print again, what is still buffered
  std::fflush(stderr);
  for (int r = 0; r < world; ++r) {
    const fs::path log = run.dir / ("log" + std::to_string(r) + ".txt");
    const pid_t pid = fork();
    if (pid == 0) {
      std::map<std::string, std::string> env = {
          {"RANK", std::to_string(r)},       {"LOCAL_RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"GROUP_RANK", "0"},               {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", port},             {"SENTINEL_EXAMPLE_REPORT_DIR", run.dir.string()}};
      for (const auto& [k, v] : knobs) env[k] = v;
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      if (!freopen(log.c_str(), "w", stdout) || !freopen(log.c_str(), "a", stderr)) _exit(127);
      execl(SENTINEL_RANKS_EXAMPLE, SENTINEL_RANKS_EXAMPLE, static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  run.status.assign(world, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (run.status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        run.status[r] = st;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      run.hung = true;
      for (int r = 0; r < world; ++r) {
        if (run.status[r] == -1) kill(pids[r], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) run.log.push_back(read_file(run.dir / ("log" + std::to_string(r) + ".txt")));
  return run;
}

std::string all_logs(const RankRun& run) {
  std::string out;
  for (size_t r = 0; r < run.log.size(); ++r) out += "---- rank " + std::to_string(r) + "\n" + run.log[r];
  return out;
}

// `sentinel ranks DIR`: its exit code and output.
std::pair<int, std::string> summarize(const fs::path& dir) {
  const std::string cmd = std::string(SENTINEL_CLI_PATH) + " ranks " + dir.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  const int st = p ? pclose(p) : -1;
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

// The bad rank made the inf/nan; every other rank stops at watch.backward(), before the all-reduce.
void expect_bad_rank_named_everywhere(int world, int bad) {
  const RankRun run = launch("bad" + std::to_string(world), world,
                             {{"SENTINEL_EXAMPLE_BAD_RANK", std::to_string(bad)}, {"SENTINEL_EXAMPLE_BAD_STEP", "2"}});
  ASSERT_FALSE(run.hung) << all_logs(run);
  const json made = run.report(bad, "sentinel_batch2.json");
  ASSERT_TRUE(made.is_object()) << all_logs(run);
  const json& trigger = made["frames"].back();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(run.exited_ok(r)) << "rank " << r << "\n" << all_logs(run);
    const json rep = run.report(r, r == bad ? "sentinel_batch2.json" : "sentinel_peer_batch2.json");
    ASSERT_TRUE(rep.is_object()) << "rank " << r << " wrote no report\n" << all_logs(run);
    EXPECT_EQ(rep["rank"], r);
    EXPECT_EQ(rep["world_size"], world);
    EXPECT_EQ(rep["kind"], r == bad ? "nonfinite" : "peer_nonfinite");
    const json& ranks = rep["ranks"];
    EXPECT_EQ(ranks["role"], r == bad ? "made" : "stopped") << rep.dump(1);
    ASSERT_TRUE(ranks["first"].is_object()) << rep.dump(1);
    EXPECT_EQ(ranks["first"]["rank"], bad);
    EXPECT_EQ(ranks["first"]["batch_number"], 2);
    EXPECT_EQ(ranks["first"]["direction"], "forward");
    EXPECT_EQ(ranks["first"]["op_index"], trigger["op_index"]);
    EXPECT_EQ(ranks["tripped"], json::array({bad}));
    EXPECT_TRUE(ranks["missing"].empty());
    EXPECT_EQ(ranks["local_rank"], r);  // LOCAL_RANK, as torchrun sets it
    EXPECT_EQ(ranks["first"]["local_rank"], bad);
    EXPECT_FALSE(ranks["first"]["host"].get<std::string>().empty());
    EXPECT_NE(run.log[r].find("Ranks: this is rank " + std::to_string(r) + " of " + std::to_string(world)),
              std::string::npos);
  }
  const auto [code, text] = summarize(run.dir);
  EXPECT_EQ(code, 3) << text;
  EXPECT_NE(text.find("First to see inf/nan: rank " + std::to_string(bad) + ", batch 2, forward"), std::string::npos)
      << text;
  fs::remove_all(run.dir);
}

TEST(RankProcesses, TwoRanksEveryRankStopsAndNamesTheRankWithTheBadBatch) { expect_bad_rank_named_everywhere(2, 1); }

TEST(RankProcesses, FourRanksEveryRankStopsAndNamesTheRankWithTheBadBatch) { expect_bad_rank_named_everywhere(4, 2); }

// HF's pattern: the batch is the forward alone, watch.backward() follows it (the batch's end
// exchange is already done), and rank 1's backward makes the nan. The ranks still meet at
// watch.backward(), so every rank stops before the all-reduce and names rank 1's backward.
TEST(RankProcesses, FourRanksABackwardTripAfterAForwardOnlyBatchStopsEveryRankBeforeTheAllReduce) {
  const RankRun run = launch("backward", 4,
                             {{"SENTINEL_EXAMPLE_BAD_RANK", "1"}, {"SENTINEL_EXAMPLE_BAD_BACKWARD", "1"},
                              {"SENTINEL_EXAMPLE_FORWARD_ONLY_BATCH", "1"}});
  ASSERT_FALSE(run.hung) << all_logs(run);
  const json made = run.report(1, "sentinel_batch2.json");
  ASSERT_TRUE(made.is_object()) << all_logs(run);
  EXPECT_EQ(made["frames"].back()["direction"], "backward");
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(run.exited_ok(r)) << "rank " << r << "\n" << all_logs(run);
    const json rep = run.report(r, r == 1 ? "sentinel_batch2.json" : "sentinel_peer_batch2.json");
    ASSERT_TRUE(rep.is_object()) << "rank " << r << "\n" << all_logs(run);
    ASSERT_TRUE(rep["ranks"]["first"].is_object()) << rep.dump(1);
    EXPECT_EQ(rep["ranks"]["first"]["rank"], 1);
    EXPECT_EQ(rep["ranks"]["first"]["direction"], "backward");
    EXPECT_EQ(rep["ranks"]["first"]["op_index"], made["frames"].back()["op_index"]);
    EXPECT_EQ(rep["ranks"]["role"], r == 1 ? "made" : "stopped");
  }
  fs::remove_all(run.dir);
}

// loss.backward() instead of watch.backward(): no exchange before the all-reduce, so the inf
// reaches every rank through it; they say they received it, and still name rank 3 as first.
TEST(RankProcesses, FourRanksOthersReceiveTheInfThroughTheAllReduceAndSaySo) {
  const RankRun run = launch("received", 4, {{"SENTINEL_EXAMPLE_BAD_RANK", "3"}, {"SENTINEL_EXAMPLE_PLAIN_BACKWARD", "1"}});
  ASSERT_FALSE(run.hung) << all_logs(run);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(run.exited_ok(r)) << "rank " << r << "\n" << all_logs(run);
    const json rep = run.report(r, "sentinel_batch2.json");
    ASSERT_TRUE(rep.is_object()) << "rank " << r << "\n" << all_logs(run);
    EXPECT_EQ(rep["kind"], "nonfinite");
    EXPECT_EQ(rep["ranks"]["role"], r == 3 ? "made" : "received") << rep.dump(1);
    ASSERT_TRUE(rep["ranks"]["first"].is_object());
    EXPECT_EQ(rep["ranks"]["first"]["rank"], 3);
    EXPECT_EQ(rep["ranks"]["tripped"], json::array({0, 1, 2, 3}));
    if (r != 3) {
      EXPECT_NE(rep["origin"].get<std::string>().find("received from another rank"), std::string::npos);
    }
  }
  fs::remove_all(run.dir);
}

// A rank dies in the middle of a step, no rank saw inf/nan: the others wait out the timeout and
// stop with a report naming the silent rank.
TEST(RankProcesses, TwoRanksAKilledRankLeavesTheOtherToFinishWithItsReport) {
  const RankRun run = launch("killed2", 2,
                             {{"SENTINEL_EXAMPLE_BAD_RANK", "-1"}, {"SENTINEL_EXAMPLE_KILL_RANK", "1"}, {"SENTINEL_EXAMPLE_TIMEOUT", "5"}});
  ASSERT_FALSE(run.hung) << all_logs(run);
  EXPECT_TRUE(run.killed(1)) << all_logs(run);
  EXPECT_TRUE(run.exited_ok(0)) << all_logs(run);
  const json rep = run.report(0, "sentinel_ranks_missing_batch2.json");
  ASSERT_TRUE(rep.is_object()) << all_logs(run);
  EXPECT_EQ(rep["kind"], "ranks_missing");
  EXPECT_EQ(rep["ranks"]["missing"], json::array({1}));
  EXPECT_TRUE(rep["ranks"]["first"].is_null());
  EXPECT_EQ(rep["ranks"]["role"], "stopped");
  EXPECT_FALSE(rep["frames"].empty());  // this rank's own last frames
  EXPECT_NE(run.log[0].find("Ranks that did not answer: 1"), std::string::npos) << run.log[0];
  const auto [code, text] = summarize(run.dir);
  EXPECT_EQ(code, 3) << text;
  EXPECT_NE(text.find("rank 1: no report"), std::string::npos) << text;
  fs::remove_all(run.dir);
}

// A rank's own code throws in the middle of a step (not an inf/nan): it says so as its batch
// unwinds, and the other ranks stop at once, before the all-reduce it will never join.
TEST(RankProcesses, FourRanksARankThatThrowsItsOwnErrorStopsTheOthersWithoutWaiting) {
  const RankRun run = launch("threw", 4,
                             {{"SENTINEL_EXAMPLE_BAD_RANK", "-1"}, {"SENTINEL_EXAMPLE_THROW_RANK", "2"}});
  ASSERT_FALSE(run.hung) << all_logs(run);
  EXPECT_TRUE(WIFEXITED(run.status[2]) && WEXITSTATUS(run.status[2]) == 2) << all_logs(run);
  EXPECT_NE(run.log[2].find("the data loader failed"), std::string::npos);
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(run.exited_ok(r)) << "rank " << r << "\n" << all_logs(run);
    const json rep = run.report(r, "sentinel_ranks_missing_batch2.json");
    ASSERT_TRUE(rep.is_object()) << "rank " << r << "\n" << all_logs(run);
    EXPECT_EQ(rep["ranks"]["missing"], json::array({2}));
    // Its farewell answered, not the timeout (which names no reason).
    EXPECT_NE(rep["ranks"]["problem"].get<std::string>().find("rank 2 left while an exception unwound its batch 2"),
              std::string::npos)
        << rep.dump(1);
  }
  fs::remove_all(run.dir);
}

// Four ranks: rank 1 has the bad batch, rank 3 dies in the same step. The living ranks agree on
// rank 1 and name rank 3 as silent.
TEST(RankProcesses, FourRanksABadRankAndAKilledRankAreBothNamed) {
  const RankRun run = launch("killed4", 4,
                             {{"SENTINEL_EXAMPLE_BAD_RANK", "1"}, {"SENTINEL_EXAMPLE_KILL_RANK", "3"}, {"SENTINEL_EXAMPLE_TIMEOUT", "6"}});
  ASSERT_FALSE(run.hung) << all_logs(run);
  EXPECT_TRUE(run.killed(3));
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(run.exited_ok(r)) << "rank " << r << "\n" << all_logs(run);
    const json rep = run.report(r, r == 1 ? "sentinel_batch2.json" : "sentinel_peer_batch2.json");
    ASSERT_TRUE(rep.is_object()) << "rank " << r << "\n" << all_logs(run);
    ASSERT_TRUE(rep["ranks"]["first"].is_object()) << rep.dump(1);
    EXPECT_EQ(rep["ranks"]["first"]["rank"], 1);
    EXPECT_EQ(rep["ranks"]["missing"], json::array({3})) << rep.dump(1);
  }
  fs::remove_all(run.dir);
}

}  // namespace

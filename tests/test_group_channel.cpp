// The process-group channel's wait on its all-gather, on a group whose collective the test
// controls: given up after the longest wait even where the backend's own wait returns at once (as
// NCCL's does), the collective's own error passed on, and a late collective answered.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "ranks/rank_record.h"
#include "ranks/rank_session.h"

namespace {

using sentinel::ranks::Phase;
using sentinel::ranks::RankRecord;

// How a collective looks from the host: isCompleted() polls; wait() returns at once, as NCCL's
// does without blocking waits (it only orders the stream), and notes whether the work was done.
class ScriptedWork : public c10d::Work {
 public:
  bool isCompleted() override { return completed.load(); }
  bool wait(std::chrono::milliseconds) override {
    if (!completed.load()) waited_before_completion = true;
    if (!error.empty()) throw std::runtime_error(error);
    return true;
  }
  std::atomic<bool> completed{false};
  std::atomic<bool> waited_before_completion{false};
  std::string error;
};

// Rank 0 of two; rank 1's part of the all-gather is whatever the test writes into it.
class ScriptedGroup : public c10d::ProcessGroup {
 public:
  ScriptedGroup() : c10d::ProcessGroup(0, 2) {}
  const std::string getBackendName() const override { return "scripted"; }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    gathered = outputs[0];  // the same tensors: what the channel reads
    gathered[0].copy_(inputs[0]);
    ++calls;  // after the tensors are in place: another thread may answer from here on
    return work;
  }
  c10::intrusive_ptr<ScriptedWork> work = c10::make_intrusive<ScriptedWork>();
  std::vector<at::Tensor> gathered;
  std::atomic<int> calls{0};
};

// Writes rank 1's record into its slot as the channel lays it out: a length, then the bytes.
void answer_for_rank_1(at::Tensor& slot, const RankRecord& record) {
  const std::string text = sentinel::ranks::encode(record);
  const auto n = static_cast<uint32_t>(text.size());
  auto* p = slot.data_ptr<uint8_t>();
  std::memcpy(p, &n, 4);
  std::memcpy(p + 4, text.data(), n);
}

std::unique_ptr<sentinel::ranks::RankSession> session_on(const c10::intrusive_ptr<ScriptedGroup>& group,
                                                         double max_wait) {
  return std::make_unique<sentinel::ranks::RankSession>(
      sentinel::RankOptions().max_wait_seconds(max_wait).channel(sentinel::group_channel(group)));
}

TEST(GroupChannel, ACollectiveThatNeverCompletesIsGivenUpAfterTheLongestWaitAndItsTensorsKept) {
  auto group = c10::make_intrusive<ScriptedGroup>();
  auto session = session_on(group, 0.2);
  const auto agreed = session->exchange(0, Phase::BatchEnd);
  ASSERT_TRUE(agreed);
  EXPECT_NE(agreed->problem.find("the all-gather did not complete in 0.2 s"), std::string::npos)
      << agreed->problem;
  EXPECT_EQ(agreed->missing, (std::vector<int64_t>{1}));
  EXPECT_FALSE(group->work->waited_before_completion) << "the host waited on an unfinished collective";
  // The backend may still write into the gathered tensors: the channel must still hold them.
  ASSERT_EQ(group->gathered.size(), 2u);
  for (const auto& t : group->gathered) EXPECT_GT(t.use_count(), 1u) << "a gathered tensor was freed";
  // The group's collectives are out of step now: no further all-gather on it.
  EXPECT_FALSE(session->exchange(1, Phase::BatchEnd));
  EXPECT_EQ(group->calls, 1);
}

TEST(GroupChannel, ACollectiveThatCompletesLateIsReadAfterItCompletes) {
  auto group = c10::make_intrusive<ScriptedGroup>();
  auto session = session_on(group, 30);
  RankRecord rank1;
  rank1.rank = 1;
  sentinel::RankEvent trip;
  trip.rank = 1;
  trip.op_index = 7;
  trip.frame = "fc7 (Linear) aten::addmm";
  rank1.tripped = trip;
  std::thread rank_1([&] {
    while (group->calls == 0) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    answer_for_rank_1(group->gathered[1], rank1);
    group->work->completed = true;
  });
  const auto agreed = session->exchange(0, Phase::BatchEnd);
  rank_1.join();
  ASSERT_TRUE(agreed);
  EXPECT_TRUE(agreed->problem.empty()) << agreed->problem;
  ASSERT_TRUE(agreed->first);
  EXPECT_EQ(agreed->first->rank, 1);
  EXPECT_EQ(agreed->first->op_index, 7);
  EXPECT_FALSE(group->work->waited_before_completion);
}

TEST(GroupChannel, ACollectiveThatFailsPassesItsOwnErrorOn) {
  auto group = c10::make_intrusive<ScriptedGroup>();
  group->work->error = "connection reset by rank 1";
  group->work->completed = true;
  auto session = session_on(group, 30);
  const auto agreed = session->exchange(0, Phase::BatchEnd);
  ASSERT_TRUE(agreed);
  EXPECT_NE(agreed->problem.find("connection reset by rank 1"), std::string::npos) << agreed->problem;
  EXPECT_FALSE(session->exchange(1, Phase::BatchEnd));
  EXPECT_EQ(group->calls, 1);
}

}  // namespace

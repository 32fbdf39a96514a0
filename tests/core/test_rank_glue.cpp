// The ranks' glue on its own: how a trip is told to the other ranks (made here or received), and
// what an exchange's agreement asks of this rank. A session of rank 1 of 2 that exchanges nothing
// stands in for a real group; no model and no Watchdog.
#include <gtest/gtest.h>

#include "core/rank_glue.h"

namespace {

using sentinel::Direction;
using sentinel::RankAgreement;
using sentinel::RankEvent;
using sentinel::RankRole;
using sentinel::Report;
using sentinel::core::RankGlue;
using Kind = RankGlue::Outcome::Kind;

sentinel::RankOptions rank_one_of_two() {
  return sentinel::RankOptions().rank(1).world_size(2).exchange(false);
}

Report trip(const std::string& op, bool produced_here, Direction direction = Direction::Forward) {
  Report r;
  r.batch_number = 4;
  sentinel::Frame f;
  f.batch_number = 4;
  f.module_path = "layers.0";
  f.module_class = "Block";
  f.op = op;
  f.direction = direction;
  f.op_index = 17;
  r.frames.push_back(f);
  r.produced_here = produced_here;
  r.origin = "origin: " + op + " in layers.0 produced the first inf/nan";
  return r;
}

TEST(RankGlue, AloneOnlyTheRankFieldsAreSetAndNothingIsNoted) {
  RankGlue glue{sentinel::RankOptions()};
  Report r = trip("aten::mul", true);
  const std::string origin = r.origin;
  glue.stamp(r);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.origin, origin);
  EXPECT_FALSE(glue.session().own_trip());
}

TEST(RankGlue, AnOpOfThisRankMadeIt) {
  RankGlue glue{rank_one_of_two()};
  Report r = trip("aten::mul", true);
  const std::string origin = r.origin;
  glue.stamp(r);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.origin, origin);
  EXPECT_EQ(r.ranks.role, RankRole::Made);
  const auto own = glue.session().own_trip();
  ASSERT_TRUE(own);
  EXPECT_EQ(own->role, RankRole::Made);
  EXPECT_EQ(own->frame, "layers.0 (Block) aten::mul");
  EXPECT_EQ(own->op_index, 17);
  EXPECT_EQ(own->batch_number, 4);
}

TEST(RankGlue, ACollectivesOutputFromFiniteInputsWasReceived) {
  RankGlue glue{rank_one_of_two()};
  Report r = trip("c10d::allreduce_", true);
  glue.stamp(r);
  EXPECT_EQ(r.ranks.role, RankRole::Received);
  EXPECT_EQ(r.origin,
            "origin: received from another rank - c10d::allreduce_ in layers.0 returned inf/nan from finite inputs "
            "on this rank");
  EXPECT_EQ(glue.session().own_trip()->origin, r.origin);
}

TEST(RankGlue, GradientsBadOnlyAtBatchEndCameThroughTheAllReduce) {
  RankGlue glue{rank_one_of_two()};
  glue.grads_at_batch_end = true;
  Report r = trip("AccumulateGrad", true, Direction::Backward);
  glue.stamp(r);
  EXPECT_EQ(r.ranks.role, RankRole::Received);
  EXPECT_NE(r.origin.find("the parameter gradients of layers.0 were finite when backward made them"),
            std::string::npos)
      << r.origin;
}

TEST(RankGlue, AnInputAlreadyBadAfterTheBackwardArrivedBetweenTheOps) {
  RankGlue glue{rank_one_of_two()};
  Report r = trip("aten::addmm", false);
  glue.stamp(r);
  EXPECT_EQ(r.ranks.role, RankRole::Made);  // no backward ran in this batch: nothing points elsewhere

  RankGlue after_backward{rank_one_of_two()};
  after_backward.backward_ran_in_batch = true;
  Report s = trip("aten::addmm", false);
  after_backward.stamp(s);
  EXPECT_EQ(s.ranks.role, RankRole::Received);
  EXPECT_EQ(s.origin,
            "origin: received from another rank - aten::addmm in layers.0 produced the first inf/nan; no op on this "
            "rank made it: it arrived through a collective once the backward ran (the gradients' all-reduce or "
            "reduce-scatter)");
}

RankEvent event_of_rank(int64_t rank) {
  RankEvent e;
  e.rank = rank;
  e.batch_number = 4;
  e.direction = Direction::Backward;
  e.op_index = 9;
  e.frame = "head (Linear) grad MmBackward0";
  return e;
}

TEST(RankGlue, AnotherRankFirstStopsThisOneOnceNamingIt) {
  RankGlue glue{rank_one_of_two()};
  RankAgreement a;
  a.exchanged = true;
  a.first = event_of_rank(0);
  a.tripped = {0};
  const auto outcome = glue.weigh(a, false, false);
  ASSERT_EQ(outcome.kind, Kind::Stop);
  EXPECT_EQ(outcome.report_kind, "peer_nonfinite");
  EXPECT_EQ(outcome.origin,
            "origin: on rank 0 - it saw inf/nan first, in batch 4, backward op 9: head (Linear) grad MmBackward0; "
            "this rank saw none and stops with it");
  EXPECT_EQ(glue.weigh(a, false, false).kind, Kind::Nothing);  // the same news again
}

TEST(RankGlue, RanksThatDidNotAnswerAreNamed) {
  RankGlue glue{rank_one_of_two()};
  RankAgreement a;
  a.exchanged = true;
  a.missing = {0, 3};
  const auto outcome = glue.weigh(a, false, false);
  ASSERT_EQ(outcome.kind, Kind::Stop);
  EXPECT_EQ(outcome.report_kind, "ranks_missing");
  EXPECT_EQ(outcome.origin.rfind("origin: unknown - ranks 0, 3 did not answer", 0), 0u) << outcome.origin;
}

TEST(RankGlue, ThisRanksOwnWrittenReportIsAmendedAndAPendingOneLeftAlone) {
  RankGlue glue{rank_one_of_two()};
  Report r = trip("aten::mul", true);
  glue.stamp(r);
  RankAgreement a;
  a.exchanged = true;
  a.first = event_of_rank(0);
  a.tripped = {0};
  const auto amend = glue.weigh(a, /*report_written=*/true, /*report_pending=*/true);
  ASSERT_EQ(amend.kind, Kind::Amend);
  // This rank's own trip, noted while the exchange ran, is merged in.
  EXPECT_EQ(amend.agreement.tripped, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(amend.agreement.role, RankRole::Made);

  RankGlue waiting{rank_one_of_two()};
  EXPECT_EQ(waiting.weigh(a, false, /*report_pending=*/true).kind, Kind::Nothing);
}

TEST(RankGlue, TroubleWithNobodyToStopForIsSaidOnce) {
  RankGlue glue{rank_one_of_two()};
  RankAgreement a;
  a.problem = "the store at localhost:29500 did not answer";
  auto outcome = glue.weigh(a, false, false);
  ASSERT_EQ(outcome.kind, Kind::Say);
  EXPECT_EQ(outcome.line, "sentinel: rank 1: the store at localhost:29500 did not answer\n");
  EXPECT_EQ(glue.weigh(a, false, false).kind, Kind::Nothing);
  a.exchanged = true;
  a.problem = "rank 0's record could not be read";
  outcome = glue.weigh(a, false, false);
  EXPECT_EQ(outcome.kind, Kind::Say);
  EXPECT_EQ(outcome.line, "sentinel: rank 1: rank 0's record could not be read\n");
}

}  // namespace

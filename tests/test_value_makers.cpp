// Who made a value, decided per call: a copy or a conversion is a frame and a view is not; memory
// from the empty family is not judged until written. Oracles: torch's own casts and storages.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <sstream>
#include <string>
#include <vector>

#include "support/find_entry.h"

namespace {

// Runs `body` as one batch of a watchdog over `model`; returns the frames the batch saved.
template <typename Body>
std::vector<sentinel::Frame> frames_of(const std::shared_ptr<torch::nn::Module>& model, Body&& body) {
  std::ostringstream out;
  sentinel::Watchdog w(model, sentinel::Options().output(out));
  {
    auto batch = w.batch();
    body();
    batch.finish();
  }
  return w.saved_frames();
}

std::vector<std::string> ops_of(const std::vector<sentinel::Frame>& frames) {
  std::vector<std::string> ops;
  for (const auto& f : frames) ops.push_back(f.op);
  return ops;
}

bool has_op(const std::vector<sentinel::Frame>& frames, const std::string& op) {
  for (const auto& f : frames) {
    if (f.op == op) return true;
  }
  return false;
}

TEST(ValueMakers, AViewMakesNoFrameAndACopyOfTheSameAliasAnnotatedOpDoes) {
  auto model = std::make_shared<torch::nn::Module>();
  const auto x = torch::randn({4, 6});
  // A contiguous reshape is a view: it shares the argument's storage (torch's own answer).
  ASSERT_TRUE(x.reshape({6, 4}).storage().is_alias_of(x.storage()));
  ASSERT_FALSE(x.t().reshape({24}).storage().is_alias_of(x.storage()));
  auto views = frames_of(model, [&] { (void)(x.reshape({6, 4}).t().contiguous().t() * 2); });
  EXPECT_FALSE(has_op(views, "aten::reshape")) << ::testing::PrintToString(ops_of(views));
  EXPECT_FALSE(has_op(views, "aten::t"));
  EXPECT_TRUE(has_op(views, "aten::contiguous"));  // a transposed tensor made contiguous: new memory
  auto copies = frames_of(model, [&] { (void)(x.t().reshape({24}) * 2); });
  ASSERT_TRUE(has_op(copies, "aten::reshape")) << ::testing::PrintToString(ops_of(copies));
  for (const auto& f : copies) {
    if (f.op != "aten::reshape") continue;
    const auto* in = sentinel_test::find_entry(f, "input[0]");
    const auto* out = sentinel_test::find_entry(f, "output");
    ASSERT_NE(in, nullptr);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(in->stats.count, 24);
    EXPECT_EQ(out->stats.count, 24);
    EXPECT_DOUBLE_EQ(out->stats.abs_max, x.abs().max().item<double>());
  }
  // A cast to the dtype the tensor has returns it: no frame; to another dtype: a frame.
  auto same = frames_of(model, [&] { (void)(x.to(torch::kFloat) * 2); });
  EXPECT_FALSE(has_op(same, "aten::to"));
  auto cast = frames_of(model, [&] { (void)(x.to(torch::kBFloat16) * 2); });
  EXPECT_TRUE(has_op(cast, "aten::to"));
}

TEST(ValueMakers, AnOverflowingCastIsTheOriginWithItsDtypesAndCount) {
  auto model = std::make_shared<torch::nn::Module>();
  const auto x = torch::linspace(0, 1e5, 10);
  // torch's own cast: the values beyond float16's range become inf.
  const int64_t overflowing = torch::isinf(x.to(torch::kHalf)).sum().item<int64_t>();
  ASSERT_GT(overflowing, 1);
  std::ostringstream out;
  sentinel::Watchdog w(model, sentinel::Options().output(out));
  try {
    auto batch = w.batch();
    (void)x.to(torch::kHalf).sum();
    batch.finish();
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& e) {
    const auto& r = e.report();
    EXPECT_EQ(r.trigger().op, "aten::to");
    EXPECT_TRUE(r.produced_here);
    EXPECT_NE(r.origin.find("a conversion of input[0] float32 → float16: " + std::to_string(overflowing) + " values above 65504"),
              std::string::npos)
        << r.origin;
  }
}

TEST(ValueMakers, MemoryFromEmptyIsNotJudgedUntilWritten) {
  // Deterministic algorithms fill `empty` with NaN; put back as they were however the test ends.
  struct Deterministic {
    bool was = at::globalContext().deterministicAlgorithms();
    Deterministic() { at::globalContext().setDeterministicAlgorithms(true, false); }
    ~Deterministic() { at::globalContext().setDeterministicAlgorithms(was, false); }
  } deterministic;
  auto model = std::make_shared<torch::nn::Module>();
  std::ostringstream out;
  sentinel::Watchdog w(model, sentinel::Options().output(out));
  const auto x = torch::randn({8});
  const auto never = torch::zeros({8}, torch::kBool);
  ASSERT_TRUE(torch::isnan(torch::empty({8})).all().item<bool>());
  {
    auto batch = w.batch();
    auto buffer = torch::empty({8});
    // Read, not used: the branch not taken. Its NaN is garbage, never an error.
    const auto kept = torch::where(never, buffer, x);
    EXPECT_TRUE(torch::equal(kept, x));
    buffer.copy_(x);  // written in full: judged from here on
    (void)(buffer * 2);
    batch.finish();
  }
  EXPECT_FALSE(w.last_report().has_value());
  const auto frames = w.saved_frames();
  ASSERT_GE(frames.size(), 2u) << ::testing::PrintToString(ops_of(frames));
  ASSERT_EQ(frames[0].op, "aten::where");
  const auto* unread = sentinel_test::find_entry(frames[0], "input[1]");
  ASSERT_NE(unread, nullptr);
  EXPECT_EQ(unread->kind, sentinel::EntryKind::Skipped);
  EXPECT_EQ(unread->skip_reason, "uninitialized: not read");
  const auto* read = sentinel_test::find_entry(frames.back(), "input[0]");
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(read->kind, sentinel::EntryKind::Tensor);
  EXPECT_DOUBLE_EQ(read->stats.abs_max, x.abs().max().item<double>());
}

}  // namespace

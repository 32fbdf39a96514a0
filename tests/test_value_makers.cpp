// Who made a value, decided per call: a copy or a conversion is a frame and a view is not; memory
// from the empty family is not judged until written; PyTorch's machinery (FSDP's scopes) tolerates
// nothing it makes; tensors named in one storage keep their names. Oracles: torch's own casts and
// storages.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <optional>
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

struct Owner : torch::nn::Module {
  Owner() { child = register_module("child", torch::nn::Linear(2, 2)); }
  torch::nn::Linear child{nullptr};
};

// Concatenates float32 values into a float16 buffer inside a scope of `scope_name`, in the model's
// forward; returns the report, if any.
std::optional<sentinel::Report> gather_into_float16(const char* scope_name, bool machinery, const at::Tensor& a,
                                                    const at::Tensor& b) {
  auto model = std::make_shared<Owner>();
  std::ostringstream out;
  sentinel::Watchdog w(model, sentinel::Options().output(out));
  try {
    auto batch = w.batch();
    {
      auto s = sentinel::scope(*model);
      const auto gather = [&] {
        auto buffer = torch::empty({a.numel() + b.numel()}, torch::kHalf);
        at::cat_out(buffer, {a, b});
      };
      if (machinery) {
        RECORD_USER_SCOPE(scope_name);
        gather();
      } else {
        auto g = sentinel::scope(scope_name);
        gather();
      }
    }
    batch.finish();
  } catch (const sentinel::NonFiniteError& e) {
    return e.report();
  }
  return std::nullopt;
}

TEST(ValueMakers, ACastInPyTorchsMachineryIsAnErrorAtOnceNamingTheArgumentsItConverted) {
  const auto a = torch::linspace(0, 1e5, 6), b = torch::full({2}, 7e4);
  // torch's own cast of the concatenation: what float16 cannot hold becomes inf.
  const int64_t overflowing = torch::isinf(torch::cat({a, b}).to(torch::kHalf)).sum().item<int64_t>();
  ASSERT_GT(overflowing, 2);
  // Inside a module's own named scope, an inf that stays there is the module's to tolerate...
  // (Its buffer comes from `empty` there: memory the module made, as any result of its ops.)
  const auto tolerated = gather_into_float16("gate", false, a, b);
  EXPECT_FALSE(tolerated.has_value()) << tolerated->origin;
  // ...inside FSDP's, which moves the model's values and makes none, it is an error at once.
  const auto r = gather_into_float16("FSDP::post_backward_reduce", true, a, b);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->trigger().op.rfind("aten::cat", 0), 0u) << r->trigger().op;
  EXPECT_NE(r->trigger().module_path.find("FSDP::post_backward_reduce"), std::string::npos);
  EXPECT_TRUE(r->produced_here);
  EXPECT_NE(r->origin.find("a conversion of input[0][0], input[0][1] float32 → float16: " + std::to_string(overflowing) +
                           " values above 65504"),
            std::string::npos)
      << r->origin;
}

TEST(ValueMakers, TensorsNamedInOneStorageAreEachNamedByTheirBytes) {
  // FSDP's gradient shards are views of one buffer: each keeps its own name, and a view inside
  // one of them takes that one's.
  auto model = std::make_shared<torch::nn::Module>();
  std::ostringstream out;
  sentinel::Watchdog w(model, sentinel::Options().output(out));
  const auto flat = torch::randn({10});
  const auto first = flat.narrow(0, 0, 4), second = flat.narrow(0, 4, 6);
  ASSERT_TRUE(first.storage().is_alias_of(second.storage()));
  w.name_tensors({{"a.grad", first}, {"b.grad", second}});
  {
    auto batch = w.batch();
    (void)(second * 2);
    (void)(first * 3);
    (void)(flat.narrow(0, 5, 2) * 4);
    batch.finish();
  }
  const auto frames = w.saved_frames();
  ASSERT_EQ(frames.size(), 3u) << ::testing::PrintToString(ops_of(frames));
  EXPECT_NE(sentinel_test::find_entry(frames[0], "b.grad"), nullptr);
  EXPECT_NE(sentinel_test::find_entry(frames[1], "a.grad"), nullptr);
  EXPECT_NE(sentinel_test::find_entry(frames[2], "b.grad"), nullptr);
}

}  // namespace

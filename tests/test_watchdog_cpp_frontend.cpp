// Detection, attribution and batches for C++-frontend models.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/scope_stack.h>
#include <sentinel/sentinel.h>

#include <fmt/format.h>

#include <limits>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "support/find_entry.h"
#include "support/test_models.h"

namespace {

using namespace sentinel_test;

TEST(CppFrontend, CleanBatchesCountFromZeroAndResultsAreUnchanged) {
  torch::manual_seed(0);
  Mlp model;
  auto x = small_input();
  auto expected = model->forward(x);
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  for (int i = 0; i < 3; ++i) {
    auto y = debug.forward(x);
    EXPECT_TRUE(torch::equal(y, expected));  // bit for bit
  }
  EXPECT_EQ(debug.batch_number(), 3);
  EXPECT_FALSE(debug.last_report().has_value());
  EXPECT_EQ(out.str(), "");
}

TEST(CppFrontend, OverflowInALinearIsFoundAtThatOpWithParameterNames) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  debug.forward(small_input());
  {
    torch::NoGradGuard g;
    model->fc2->weight.fill_(3e38f);
  }
  try {
    debug.forward(small_input());
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& e) {
    const auto& r = e.report();
    EXPECT_EQ(r.batch_number, 1);
    const auto& f = r.trigger();
    EXPECT_EQ(f.module_path, "fc2");
    EXPECT_EQ(f.module_class, "Linear");
    EXPECT_EQ(f.op, "aten::addmm");
    EXPECT_EQ(f.attribution, sentinel::Attribution::Parameter);
    EXPECT_TRUE(r.produced_here);
    ASSERT_NE(find_entry(f, "weight"), nullptr);
    ASSERT_NE(find_entry(f, "bias"), nullptr);
    ASSERT_NE(find_entry(f, "output"), nullptr);
    EXPECT_GT(find_entry(f, "output")->stats.pos_inf + find_entry(f, "output")->stats.neg_inf, 0);
    EXPECT_NE(std::string(e.what()).find("Detected inf/nan during batch_number=1"), std::string::npos);
    EXPECT_NE(out.str().find("Detected inf/nan during batch_number=1"), std::string::npos);  // printed at once
  }
  // The error was delivered: the watchdog goes on for the next batch.
  {
    torch::NoGradGuard g;
    model->fc2->weight.fill_(0.1f);
  }
  EXPECT_NO_THROW(debug.forward(small_input()));
  EXPECT_EQ(debug.batch_number(), 3);
}

// The index follows the model's tree between batches: a module replaced, and a parameter moved to
// other memory by set_() (found through its storage, as addmm gets weight.t()), are named as the
// model holds them when the batch runs.
TEST(CppFrontend, ModulesAndParametersChangedBetweenBatchesAreNamedAsTheyNowAre) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto expect_weight_named = [&](int64_t batch) {
    try {
      debug.forward(small_input());
      FAIL() << "expected NonFiniteError in batch " << batch;
    } catch (const sentinel::NonFiniteError& e) {
      const auto& f = e.report().trigger();
      EXPECT_EQ(e.report().batch_number, batch);
      EXPECT_EQ(f.module_path, "fc2");
      EXPECT_EQ(f.attribution, sentinel::Attribution::Parameter);
      const auto* weight = find_entry(f, "weight");
      ASSERT_NE(weight, nullptr);
      EXPECT_GT(weight->stats.pos_inf, 0);
    }
  };
  debug.forward(small_input());
  debug.forward(small_input());  // (a batch that finds the tree unchanged)
  {
    torch::NoGradGuard g;
    torch::nn::Linear fresh(8, 3);
    fresh->weight.fill_(std::numeric_limits<float>::infinity());
    model->fc2 = model->replace_module("fc2", fresh);
  }
  expect_weight_named(2);
  {
    torch::NoGradGuard g;
    model->fc2->weight.set_(torch::full({3, 8}, std::numeric_limits<float>::infinity()));
  }
  expect_weight_named(3);
}

// The place rule: the inf exp makes inside the first Block's scope is tolerated there, and is an
// error when the next Block's Linear reads it; the report ends at that read and names exp.
TEST(CppFrontend, InfMadeBetweenSubModulesIsFoundAtTheOpThroughTheModuleScope) {
  torch::manual_seed(0);
  TwoBlocks model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  try {
    debug.forward(small_input(2, 4, 5000.0));
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& e) {
    const sentinel::Report& r = e.report();
    ASSERT_TRUE(r.origin_frame);
    const auto& f = *r.origin_frame;
    EXPECT_EQ(f.op, "aten::exp");
    EXPECT_EQ(f.module_path, "encoder.0");  // named_modules()' name for the first Block
    EXPECT_EQ(f.module_class, "Block");
    EXPECT_EQ(f.attribution, sentinel::Attribution::UserScope);
    EXPECT_TRUE(f.inputs_finite);
    EXPECT_EQ(r.escape, sentinel::Escape::Read);
    EXPECT_EQ(r.trigger().module_path, "encoder.1.a");
    EXPECT_EQ(r.trigger().op, "aten::addmm");
    EXPECT_NE(r.origin.find("aten::exp in encoder.0 (Block) produced the first inf/nan"), std::string::npos)
        << r.origin;
    EXPECT_NE(r.origin.find("until aten::addmm in encoder.1.a (Linear) read it"), std::string::npos) << r.origin;
    // Strict, it stops at exp itself.
    sentinel::DebugUnderflowOverflow strict(model, sentinel::Options().output(out).strict(true));
    try {
      strict.forward(small_input(2, 4, 5000.0));
      ADD_FAILURE() << "expected NonFiniteError";
    } catch (const sentinel::NonFiniteError& s) {
      EXPECT_EQ(s.report().trigger().op, "aten::exp");
      EXPECT_TRUE(s.report().produced_here);
      EXPECT_FALSE(s.report().origin_frame);
    }
  }
}

// What a front end hands as a module's named arguments and result (a ModelOutput's fields, a
// cache's layers): read in `call` and `return` frames of that module under their paths, split
// over frames when there are more than a frame holds, and judged by the place rule: a value
// tolerated inside the module, returned in it, is an error at that return.
TEST(CppFrontend, NamedArgumentsAndResultsAreReadInFramesOfTheirModuleAndJudged) {
  TwoBlocks model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(100));
  const auto& block = *model->encoder->ptr(0);
  std::vector<std::pair<std::string, at::Tensor>> cache;
  for (int i = 0; i < 20; ++i) cache.emplace_back(fmt::format("output.layers[{}].keys", i), torch::full({3}, i + 0.5));
  {
    auto step = watch.batch();
    watch.module_boundary(block, /*returning=*/false, {{"input[1].mask", torch::tensor({-2.0, 0.25})}});
    watch.module_boundary(block, /*returning=*/true, cache);
    step.finish();
  }
  std::vector<const sentinel::Frame*> named;
  const auto frames = watch.saved_frames();
  for (const auto& f : frames) {
    if (f.op == "call" || f.op == "return") named.push_back(&f);
  }
  ASSERT_EQ(named.size(), 3u);  // one call; 20 results over two frames of 16 entries at most
  EXPECT_EQ(named[0]->op, "call");
  EXPECT_EQ(named[0]->module_path, "encoder.0");
  ASSERT_EQ(named[0]->entries.size(), 1u);
  EXPECT_EQ(named[0]->entries[0].label, "input[1].mask");
  EXPECT_EQ(named[0]->entries[0].role, sentinel::EntryRole::Input);
  EXPECT_EQ(named[0]->entries[0].stats.abs_min, 0.25);
  EXPECT_EQ(named[0]->entries[0].stats.abs_max, 2.0);
  EXPECT_EQ(named[1]->entries.size() + named[2]->entries.size(), 20u);
  EXPECT_EQ(named[2]->entries.back().label, "output.layers[19].keys");
  EXPECT_EQ(named[2]->entries.back().stats.abs_max, 19.5);
  // exp overflows inside encoder.0 (tolerated there); the block hands it back inside its result.
  try {
    auto step = watch.batch();
    sentinel::enter_scope(block);
    const auto inf = torch::exp(torch::full({2}, 1000.0));
    watch.module_boundary(block, /*returning=*/true, {{"output.hidden", inf}});
    sentinel::leave_scope(block);
    step.finish();
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_EQ(e.report().trigger().op, "return");
    EXPECT_EQ(e.report().trigger().entries.at(0).label, "output.hidden");
    EXPECT_EQ(e.report().escape, sentinel::Escape::Returned);
    ASSERT_TRUE(e.report().origin_frame);
    EXPECT_EQ(e.report().origin_frame->op, "aten::exp");
  }
}

// A run resumed from a checkpoint numbers on from its step: set between batches, refused inside
// one and below 0.
TEST(CppFrontend, TheNextBatchNumberIsSetBetweenBatches) {
  Mlp model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(10));
  watch.set_batch_number(5);
  EXPECT_EQ(watch.batch_number(), 5);
  {
    auto step = watch.batch();
    model->forward(small_input());
    EXPECT_THROW(watch.set_batch_number(9), std::logic_error);
    step.finish();
  }
  EXPECT_EQ(watch.batch_number(), 6);
  EXPECT_EQ(watch.saved_frames().back().batch_number, 5);
  EXPECT_THROW(watch.set_batch_number(-1), std::invalid_argument);
}

// A phase labels the reports of the batches opened after it is set; the open batch keeps its own.
TEST(CppFrontend, APhaseLabelsTheReportsOfTheBatchesOpenedAfterIt) {
  Mlp model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  {
    auto step = watch.batch();
    watch.set_phase("evaluation");  // for the next batch
    model->forward(small_input());
    step.finish();
  }
  auto bad = small_input();
  bad[0][0] = std::numeric_limits<float>::infinity();
  auto step = watch.batch();
  watch.set_phase("training");  // for the batch after this one
  model->forward(bad);
  EXPECT_THROW(step.finish(), sentinel::NonFiniteError);
  ASSERT_TRUE(watch.last_report());
  EXPECT_EQ(watch.last_report()->phase, "evaluation");
  EXPECT_NE(out.str().find("Detected inf/nan during batch_number=1 (evaluation)\n"), std::string::npos) << out.str();
}

// As a front end whose module calls begin and end in two callbacks uses the stack (the Python
// module's hooks): ops between enter and leave are the module's; leaving a module also leaves
// those entered after it and never left (an exception went through them).
TEST(CppFrontend, ScopesEnteredAndLeftInTwoCallsNameTheOpsBetween) {
  torch::manual_seed(0);
  TwoBlocks model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(8));
  auto* first = model->encoder[0].get();
  auto* second = model->encoder[1].get();
  auto module_of_a_mul = [&] {
    auto guard = watch.batch();
    const auto y = small_input() * 2;  // the last op of the batch
    (void)y;
    guard.finish();
    return watch.saved_frames().back().module_path;
  };
  sentinel::enter_scope(*first);
  EXPECT_EQ(module_of_a_mul(), "encoder.0");
  sentinel::enter_scope(*second);
  EXPECT_EQ(module_of_a_mul(), "encoder.1");
  EXPECT_TRUE(sentinel::leave_scope(*first));  // and the second, entered after it
  EXPECT_EQ(module_of_a_mul(), "");
  EXPECT_FALSE(sentinel::leave_scope(*second));
  EXPECT_EQ(module_of_a_mul(), "");
}

TEST(CppFrontend, BadParameterIsReportedAsPassedThroughFromThatParameter) {
  torch::manual_seed(0);
  Mlp model;
  {
    torch::NoGradGuard g;
    model->fc1->weight[0][1] = std::numeric_limits<float>::infinity();
  }
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  try {
    debug.forward(small_input());
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    const auto& r = e.report();
    EXPECT_FALSE(r.produced_here);
    EXPECT_EQ(r.trigger().module_path, "fc1");
    EXPECT_EQ(find_entry(r.trigger(), "weight")->stats.pos_inf, 1);
    EXPECT_NE(r.origin.find("parameter fc1.weight"), std::string::npos) << r.origin;
  }
}

TEST(CppFrontend, BadInputBatchIsReportedAsPassedThroughFromTheInput) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto x = small_input();
  x[1][2] = std::nanf("");
  try {
    debug.forward(x);
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    const auto& r = e.report();
    EXPECT_FALSE(r.produced_here);
    EXPECT_EQ(r.trigger().op_index, 0);
    EXPECT_NE(r.origin.find("the batch's input"), std::string::npos) << r.origin;
    const auto* in = find_entry(r.trigger(), "input[1]");
    ASSERT_NE(in, nullptr);
    EXPECT_EQ(in->stats.nan, 1);
  }
}

TEST(CppFrontend, BatchGuardThrowsAtFinishAndCoversATrainingStep) {
  torch::manual_seed(0);
  Mlp model;
  torch::optim::SGD opt(model->parameters(), 0.01);
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  for (int step = 0; step < 3; ++step) {
    auto guard = watch.batch();
    opt.zero_grad();
    auto loss = model->forward(small_input()).pow(2).sum();
    loss.backward();
    opt.step();
    guard.finish();
  }
  EXPECT_EQ(watch.batch_number(), 3);
  // The last step's frames: its forward, its backward nodes and its parameters' gradients, all
  // numbered as the step's batch.
  std::set<sentinel::Direction> directions;
  for (const auto& f : watch.saved_frames()) {
    EXPECT_EQ(f.batch_number, 2);
    directions.insert(f.direction);
  }
  EXPECT_EQ(directions.size(), 2u);

  auto guard = watch.batch();
  auto x = small_input();
  x[0][0] = std::numeric_limits<float>::infinity();
  model->forward(x);  // detected here, delivered at the safe point below
  EXPECT_THROW(guard.finish(), sentinel::NonFiniteError);
}

TEST(CppFrontend, BatchGuardDestructorDeliversButNeverWhileUnwinding) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  auto bad = small_input();
  bad[0][0] = std::nanf("");
  EXPECT_THROW(
      {
        auto guard = watch.batch();
        model->forward(bad);
      },
      sentinel::NonFiniteError);
  // Another exception in flight: the guard ends the batch quietly, the error waits for check().
  EXPECT_THROW(
      {
        auto guard = watch.batch();
        model->forward(bad);
        throw std::runtime_error("user error");
      },
      std::runtime_error);
  EXPECT_THROW(watch.check(), sentinel::NonFiniteError);
  EXPECT_NO_THROW(watch.check());
}

TEST(CppFrontend, SharedPtrModelsWorkToo) {
  torch::manual_seed(0);
  auto model = std::make_shared<MlpImpl>();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  debug.forward(small_input());
  auto frames = debug.saved_frames();
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames.front().module_path, "fc1");
}

// Overloads differ in arity: aten::sum has one argument and aten::sum.dim_IntList four; a
// cache keyed by the bare name would cut one's inputs to the other's count.
struct OverloadsImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    auto total = x.sum();            // aten::sum
    auto rows = x.sum(1);            // aten::sum.dim_IntList
    auto best = std::get<0>(x.max(1));  // aten::max.dim: two results
    return rows + total + best;
  }
};
TORCH_MODULE(Overloads);

TEST(CppFrontend, OverloadsOfOneOpKeepTheirOwnArgumentsAndResults) {
  Overloads model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto x = small_input();
  debug.forward(x);
  debug.forward(x);  // the second batch reuses every cached op description
  int sums = 0;
  for (const auto& f : debug.saved_frames()) {
    if (f.batch_number != 1) continue;
    if (f.op == "aten::sum") {  // both overloads show the name profilers show
      ++sums;
      ASSERT_NE(find_entry(f, "input[0]"), nullptr) << f.op;
      EXPECT_EQ(find_entry(f, "input[0]")->stats.count, x.numel()) << f.op;
    }
    if (f.op == "aten::max") {
      EXPECT_NE(find_entry(f, "output[0]"), nullptr);
      EXPECT_NE(find_entry(f, "output[1]"), nullptr);
    }
  }
  EXPECT_EQ(sums, 2);
}

TEST(CppFrontend, ManyInputsNeverCrowdOutTheOutput) {
  struct CatImpl : torch::nn::Module {
    torch::Tensor forward(std::vector<torch::Tensor> parts) { return torch::cat(parts) * 2; }
  };
  auto model = std::make_shared<CatImpl>();
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out).max_frames_to_save(3));
  std::vector<torch::Tensor> parts(20, torch::ones({2}));
  debug.forward(parts);
  const auto frames = debug.saved_frames();
  const auto& cat = frames.front();
  ASSERT_EQ(cat.op, "aten::cat");
  EXPECT_NE(find_entry(cat, "output"), nullptr);
  EXPECT_EQ(find_entry(cat, "output")->stats.count, 40);
  EXPECT_GT(cat.entries_omitted, 0);
  parts[17] = torch::full({2}, std::nanf(""));
  try {
    debug.forward(parts);
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    // Past the frame's room, the nan's entry takes the place of a finite one.
    EXPECT_EQ(e.report().trigger().op, "aten::cat");
    EXPECT_GT(e.report().trigger().entries_omitted, 0);
    const sentinel::Entry* shown = find_entry(e.report().trigger(), "input[0][17]");
    ASSERT_NE(shown, nullptr);
    EXPECT_EQ(shown->stats.nan, 2);
    EXPECT_NE(find_entry(e.report().trigger(), "output"), nullptr);
  }
}

TEST(CppFrontend, OpsOutsideABatchAreNotWatched) {
  torch::manual_seed(0);
  Mlp model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  auto bad = small_input();
  bad[0][0] = std::nanf("");
  EXPECT_NO_THROW(model->forward(bad));  // not through the watchdog, no batch open
  EXPECT_TRUE(debug.saved_frames().empty());
  EXPECT_NO_THROW(debug.check());
}

}  // namespace

// The place rule on its own, over frames written by hand (what each op read and made, and in
// which memory): which non-finite values it tolerates, where it stops, and what it names as the
// op that made the value. No model and no Watchdog.
#include <gtest/gtest.h>

#include <sentinel/report.h>

#include <limits>
#include <stdexcept>

#include "core/place_rule.h"
#include "frames/frame_record.h"
#include "frames/string_table.h"
#include "options/nonfinite_allowance.h"

namespace {

using sentinel::Direction;
using sentinel::Escape;
using sentinel::TensorStats;
using sentinel::core::PlaceRule;
using sentinel::frames::EntryRecord;
using sentinel::frames::FrameRecord;
using sentinel::frames::PlaceTable;
using sentinel::frames::Role;
using sentinel::frames::StringTable;
using sentinel::options::NonfiniteAllowance;
using sentinel::options::parse_allowance;

TensorStats stats(int64_t neg_inf = 0, int64_t pos_inf = 0, int64_t nan = 0) {
  TensorStats s;
  s.count = 8;
  s.neg_inf = neg_inf;
  s.pos_inf = pos_inf;
  s.nan = nan;
  s.abs_max = 1.0;
  s.abs_min = 0.0;
  return s;
}

class PlaceRuleTest : public ::testing::Test {
 protected:
  PlaceRuleTest() {
    root = places.intern("", "GPT");
    block = places.intern("h.0", "Block");
    attn = places.intern("h.0.attn", "Attention");
    inner = places.intern("h.0.attn.core", "Core");
    mlp = places.intern("h.0.mlp", "MLP");
  }

  // An op of `place` reading `inputs` and making `outputs` ({storage, stats} each).
  FrameRecord op(uint32_t place, const char* name, std::initializer_list<std::pair<uintptr_t, TensorStats>> inputs,
                 std::initializer_list<std::pair<uintptr_t, TensorStats>> outputs) {
    FrameRecord f;
    f.reset();
    f.batch_number = batch;
    f.op_index = next_op++;
    f.op = f.op_key = strings.intern(name);
    f.place = f.module_place = place;
    f.direction = static_cast<uint8_t>(Direction::Forward);
    f.in_model = true;
    const std::string op_name = name;
    f.writes_arguments = op_name.back() == '_';  // as ATen spells its in-place ops
    int i = 0;
    for (const auto& [storage, s] : inputs) f.add(entry(Role::Input, i++, storage, s));
    for (const auto& [storage, s] : outputs) f.add(entry(Role::Output, -1, storage, s));
    return f;
  }

  static EntryRecord entry(Role role, int index, uintptr_t storage, const TensorStats& s) {
    EntryRecord e;
    e.role = role;
    e.index = static_cast<int16_t>(index);
    e.storage = storage;
    e.stats = s;
    return e;
  }

  PlaceRule rule(std::vector<NonfiniteAllowance> allow = {}) { return PlaceRule(places, strings, std::move(allow)); }

  StringTable strings;
  PlaceTable places;
  uint32_t root, block, attn, inner, mlp;
  int64_t batch = 0;
  int64_t next_op = 0;
};

TEST_F(PlaceRuleTest, AMaskReadInsideItsModuleAndTheModulesWithinIsTolerated) {
  PlaceRule r = rule();
  // masked_fill makes -inf in memory 10 (attn); softmax (attn) and an op of attn.core read it.
  EXPECT_FALSE(r.judge(op(attn, "aten::masked_fill", {{1, stats()}}, {{10, stats(4)}})).error);
  EXPECT_FALSE(r.judge(op(inner, "aten::add", {{10, stats(4)}}, {{11, stats(4)}})).error);
  EXPECT_FALSE(r.judge(op(attn, "aten::softmax", {{10, stats(4)}}, {{12, stats()}})).error);
  const auto counts = r.tolerated();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].module_path, "h.0.attn");
  EXPECT_EQ(counts[0].op, "aten::masked_fill");
  EXPECT_EQ(counts[0].neg_inf, 4);
  EXPECT_EQ(counts[0].frames, 1);
  EXPECT_EQ(counts[1].module_path, "h.0.attn.core");
  EXPECT_FALSE(counts[0].allowed);
}

TEST_F(PlaceRuleTest, AValueReadByAnotherModuleIsAnErrorNamingTheOpThatMadeIt) {
  PlaceRule r = rule();
  EXPECT_FALSE(r.judge(op(mlp, "aten::addmm", {{1, stats()}}, {{20, stats(0, 3)}})).error);
  const auto j = r.judge(op(block, "aten::add", {{20, stats(0, 3)}, {2, stats()}}, {{21, stats(0, 3)}}));
  ASSERT_TRUE(j.error);
  EXPECT_EQ(j.escape, Escape::Read);
  ASSERT_TRUE(j.made_by);
  EXPECT_EQ(j.made_by->place, mlp);
  EXPECT_EQ(strings.at(j.made_by->op), "aten::addmm");
  // The parent module is not inside the module that made it; nor is a sibling.
  EXPECT_FALSE(r.within(block, mlp));
  EXPECT_FALSE(r.within(attn, mlp));
  EXPECT_TRUE(r.within(inner, block));
  EXPECT_TRUE(r.within(mlp, root));
}

TEST_F(PlaceRuleTest, TheOpThatFirstMadeTheValueStaysTheOriginAsItPassesThroughItsModule) {
  PlaceRule r = rule();
  r.judge(op(attn, "aten::masked_fill", {{1, stats()}}, {{10, stats(2)}}));
  r.judge(op(attn, "aten::add", {{10, stats(2)}}, {{11, stats(2)}}));
  const auto j = r.judge(op(mlp, "aten::mul", {{11, stats(2)}}, {{12, stats(2)}}));
  ASSERT_TRUE(j.error);
  ASSERT_TRUE(j.made_by);
  EXPECT_EQ(strings.at(j.made_by->op), "aten::masked_fill");
}

TEST_F(PlaceRuleTest, AValueOfUnknownMakingIsAnErrorWhereItIsRead) {
  PlaceRule r = rule();
  // Memory 5 was never made non-finite by an op the rule saw: the batch's input, a parameter.
  const auto j = r.judge(op(attn, "aten::mul", {{5, stats(0, 1)}}, {{6, stats(0, 1)}}));
  EXPECT_TRUE(j.error);
  EXPECT_EQ(j.escape, Escape::None);
  EXPECT_FALSE(j.made_by);
  // A frame whose non-finite input was not kept among its entries cannot be placed either.
  FrameRecord f = op(attn, "aten::cat", {{1, stats()}}, {{7, stats()}});
  f.inputs_finite = false;
  EXPECT_TRUE(r.judge(f).error);
}

TEST_F(PlaceRuleTest, BackwardNodesAndOpsOutsideTheModelAreStrict) {
  PlaceRule r = rule();
  FrameRecord loss = op(root, "aten::log", {{1, stats()}}, {{2, stats(1)}});
  loss.in_model = false;
  EXPECT_TRUE(r.judge(loss).error);
  FrameRecord node = op(mlp, "MulBackward0", {{1, stats()}}, {{2, stats(0, 0, 1)}});
  node.direction = static_cast<uint8_t>(Direction::Backward);
  EXPECT_TRUE(r.judge(node).error);
}

TEST_F(PlaceRuleTest, WritingIntoATensorItsModuleDidNotMakeIsAnError) {
  PlaceRule r = rule();
  // attn makes memory 30 and writes -inf into it in place: its own tensor.
  r.judge(op(attn, "aten::empty_like", {{1, stats()}}, {{30, stats()}}));
  EXPECT_FALSE(r.judge(op(attn, "aten::masked_fill_", {{30, stats()}}, {{30, stats(2)}})).error);
  // A child writing into it is writing into a tensor it did not make.
  r.judge(op(attn, "aten::zeros", {}, {{31, stats()}}));
  const auto into_parents = r.judge(op(inner, "aten::fill_", {{31, stats()}}, {{31, stats(0, 1)}}));
  EXPECT_TRUE(into_parents.error);
  EXPECT_EQ(into_parents.escape, Escape::Written);
  // A parameter (memory no op of the batch made) written with inf.
  const auto into_param = r.judge(op(mlp, "aten::mul_", {{40, stats()}}, {{40, stats(0, 8)}}));
  EXPECT_TRUE(into_param.error);
  EXPECT_EQ(into_param.escape, Escape::Written);
}

TEST_F(PlaceRuleTest, AnArgumentHandedBackUnwrittenStaysTheValueOfTheModuleThatMadeIt) {
  PlaceRule r = rule();
  r.judge(op(attn, "aten::masked_fill", {{1, stats()}}, {{10, stats(2)}}));
  // dropout in eval mode (attn.core) returns its input: no write into attn's tensor ...
  EXPECT_FALSE(r.judge(op(inner, "aten::dropout", {{10, stats(2)}}, {{10, stats(2)}})).error);
  // ... and the value is still attn's, which reads it on.
  EXPECT_FALSE(r.judge(op(attn, "aten::softmax", {{10, stats(2)}}, {{11, stats()}})).error);
  EXPECT_TRUE(r.holds_tolerated(10, attn));
  EXPECT_FALSE(r.holds_tolerated(10, inner));
}

TEST_F(PlaceRuleTest, AModuleReturningAValueMadeInsideItIsAnError) {
  PlaceRule r = rule();
  r.judge(op(inner, "aten::log", {{1, stats()}}, {{50, stats(3)}}));
  EXPECT_TRUE(r.holds_any());
  EXPECT_TRUE(r.holds_tolerated(50, inner));
  EXPECT_TRUE(r.holds_tolerated(50, attn));   // made inside attn too
  EXPECT_FALSE(r.holds_tolerated(50, mlp));   // not mlp's
  EXPECT_FALSE(r.holds_tolerated(51, inner)); // other memory
  FrameRecord ret = op(inner, "return", {}, {{50, stats(3)}});
  ret.is_return = true;
  const auto j = r.judge(ret);
  ASSERT_TRUE(j.error);
  EXPECT_EQ(j.escape, Escape::Returned);
  ASSERT_TRUE(j.made_by);
  EXPECT_EQ(strings.at(j.made_by->op), "aten::log");
  // A finite result later made in the same memory holds nothing tolerated.
  r.judge(op(inner, "aten::exp", {{1, stats()}}, {{50, stats()}}));
  EXPECT_FALSE(r.holds_tolerated(50, inner));
}

TEST_F(PlaceRuleTest, ANewBatchForgetsWhatTheLastOneMade) {
  PlaceRule r = rule();
  r.judge(op(attn, "aten::masked_fill", {{1, stats()}}, {{10, stats(1)}}));
  r.begin_batch();
  batch = 1;
  EXPECT_FALSE(r.holds_any());
  EXPECT_TRUE(r.judge(op(attn, "aten::softmax", {{10, stats(1)}}, {{11, stats()}})).error);
  EXPECT_EQ(r.tolerated().size(), 1u);  // the counts stay
}

TEST_F(PlaceRuleTest, AnAllowancePatternToleratesWhatItNamesAndOnlyThat) {
  // mlp's -inf read by attn would be an error; the pattern allows that read, of -inf only.
  PlaceRule strict_kinds = rule({parse_allowance("h\\.0\\.attn aten::add input[0] -inf")});
  strict_kinds.judge(op(mlp, "aten::exp", {{1, stats()}}, {{70, stats(2)}}));
  strict_kinds.judge(op(mlp, "aten::exp", {{1, stats()}}, {{71, stats(0, 2)}}));
  EXPECT_FALSE(strict_kinds.judge(op(attn, "aten::add", {{70, stats(2)}}, {{72, stats(2)}})).error);
  EXPECT_TRUE(strict_kinds.judge(op(attn, "aten::add", {{71, stats(0, 2)}}, {{73, stats(0, 2)}})).error);  // +inf
  EXPECT_TRUE(strict_kinds.judge(op(attn, "aten::mul", {{70, stats(2)}}, {{74, stats(2)}})).error);      // another op
  bool allowed_row = false;
  for (const auto& c : strict_kinds.tolerated()) {
    allowed_row = allowed_row || (c.allowed && c.module_path == "h.0.attn");
  }
  EXPECT_TRUE(allowed_row);
}

TEST_F(PlaceRuleTest, AReturnAnAllowancePatternLetsThroughBelongsToTheCallerFromThen) {
  PlaceRule r = rule({parse_allowance("h\\.0\\.attn\\.core return output")});
  r.judge(op(inner, "aten::full", {}, {{80, stats(6)}}));
  FrameRecord ret = op(inner, "return", {}, {{80, stats(6)}});
  ret.is_return = true;
  EXPECT_FALSE(r.judge(ret).error);
  // attn, the caller, reads it on; mlp, beside it, may not; attn returning it is an error again.
  EXPECT_FALSE(r.judge(op(attn, "aten::add", {{80, stats(6)}}, {{81, stats(6)}})).error);
  EXPECT_TRUE(r.holds_tolerated(80, attn));
  EXPECT_FALSE(r.holds_tolerated(80, inner));
  EXPECT_TRUE(r.judge(op(mlp, "aten::add", {{80, stats(6)}}, {{82, stats(6)}})).error);
}

TEST(NonfiniteAllowance, PatternsParseOrSayWhatIsWrong) {
  const auto a = parse_allowance("enc\\..* aten::add input[1] -inf,nan");
  EXPECT_EQ(a.op, "aten::add");
  EXPECT_EQ(a.argument, "input[1]");
  EXPECT_TRUE(a.neg_inf && a.nan && !a.pos_inf);
  const auto any = parse_allowance(".*");
  EXPECT_EQ(any.op, "*");
  EXPECT_TRUE(any.neg_inf && !any.pos_inf && !any.nan);  // -inf by default
  auto message = [](const std::string& text) {
    try {
      parse_allowance(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("enc( aten::add").find("does not parse"), std::string::npos);
  EXPECT_NE(message("enc aten::add input[0] -inf huh").find("at most 4"), std::string::npos);
  EXPECT_NE(message("enc aten::add input[0] +nan").find("kind '+nan'"), std::string::npos);
  EXPECT_NE(message("   ").find("is empty"), std::string::npos);
}

// Inside compiled code a value no op made was made by the compiled kernels: an extern op that
// reads it and makes nothing non-finite of it is where it ends (tolerated, counted with the
// argument's elements); one that passes it on, or reads it from a parameter, or outside compiled
// code, is an error there; and an op whose result was not read says nothing of where it ends.
TEST_F(PlaceRuleTest, WhatCompiledKernelsMakeEndsAtTheExternOpThatAbsorbsItOrIsAnErrorThere) {
  auto compiled = [](FrameRecord f) {
    f.in_compiled_code = true;
    return f;
  };
  PlaceRule r = rule();
  EXPECT_FALSE(r.judge(compiled(op(root, "aten::_scaled_dot_product_flash_attention_for_cpu",
                                   {{1, stats()}, {30, stats(15)}, {29, stats(15)}}, {{31, stats()}})))
                   .error);
  const auto counts = r.tolerated();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].op, "aten::_scaled_dot_product_flash_attention_for_cpu");
  EXPECT_EQ(counts[0].frames, 1);
  EXPECT_EQ(counts[0].neg_inf, 30);
  EXPECT_FALSE(r.judge(compiled(op(root, "aten::bmm", {{1, stats()}, {30, stats(15)}}, {{32, stats()}}))).error);
  EXPECT_TRUE(r.judge(compiled(op(root, "aten::bmm", {{30, stats(0, 0, 2)}}, {{33, stats(0, 0, 2)}}))).error);
  EXPECT_TRUE(r.judge(op(root, "aten::bmm", {{1, stats()}, {30, stats(15)}}, {{34, stats()}})).error);
  FrameRecord unread = compiled(op(root, "aten::bmm", {{30, stats(15)}}, {}));
  EXPECT_TRUE(r.judge(unread).error);
  FrameRecord param = compiled(op(mlp, "aten::addmm", {{1, stats()}}, {{35, stats()}}));
  param.add(entry(Role::Param, -1, 36, stats(0, 1)));
  EXPECT_TRUE(r.judge(param).error);
}

}  // namespace

// Compiled code (torch.compile's kernels, set by the Python front end around a compiled call):
// what its ATen ops are read for, and what is not kept across it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/scope_stack.h>
#include <sentinel/sentinel.h>

#include <limits>
#include <sstream>
#include <string>

#include "support/test_models.h"

namespace {

using namespace sentinel_test;

// A compiled call (torch.compile's kernels: no op of theirs is seen) writes its buffers in place
// without bumping their version counters: inside it, a tensor read before is read again. What it
// made is read as one frame of its module, judged as what the module's own ops made: returned
// from the module, it is an error there, with that frame as its origin.
TEST(CompiledCode, ACompiledCallsWritesAreReadAgainAndItsResultIsTheModulesOwn) {
  TwoBlocks model;
  const auto& block = *model->encoder->ptr(0);
  std::ostringstream out;
  {
    sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
    const at::Tensor buffer = torch::ones({4});
    auto step = watch.batch();
    sentinel::enter_scope(block);
    torch::relu(buffer);  // read, and its numbers kept for the batch
    watch.set_inside_compiled_code(true);
    buffer.data_ptr<float>()[2] = std::numeric_limits<float>::infinity();  // a kernel's write: no version bump
    try {
      torch::relu(buffer);
      sentinel::leave_scope(block);
      step.finish();
      FAIL() << "expected NonFiniteError: the second relu read a kept, stale read";
    } catch (const sentinel::NonFiniteError& e) {
      EXPECT_EQ(e.report().trigger().op, "aten::relu");
      EXPECT_EQ(e.report().trigger().entries.at(0).stats.pos_inf, 1);
    }
  }
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  try {
    auto step = watch.batch();
    sentinel::enter_scope(block);
    const at::Tensor made = torch::full({3}, std::numeric_limits<float>::quiet_NaN());
    watch.compiled_call_returned(block, {{"output", made}});
    watch.returned(block, {made});
    sentinel::leave_scope(block);
    step.finish();
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_EQ(e.report().escape, sentinel::Escape::Returned);
    ASSERT_TRUE(e.report().origin_frame);
    EXPECT_EQ(e.report().origin_frame->op, "compiled call");
    EXPECT_EQ(e.report().origin_frame->module_path, "encoder.0");
    EXPECT_EQ(e.report().origin_frame->entries.at(0).stats.nan, 3);
  }
}

const std::string kProductFinite = "not read: its product is finite";

// Inside compiled code a matrix product's factors are read only when its result is not finite:
// every element of a factor reaches the result, so a finite result proves them finite.
TEST(CompiledCode, AProductsFactorsAreReadOnlyWhenItsResultIsNotFinite) {
  TwoBlocks model;
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).max_frames_to_save(10));
  const at::Tensor a = torch::ones({4, 3}), b = torch::full({3, 2}, 2.0), bias = torch::ones({2});
  {
    auto step = watch.batch();
    watch.set_inside_compiled_code(true);
    torch::mm(a, b);
    torch::addmm(bias, a, b);
    torch::addmm(bias, a, b, /*beta=*/0.5);  // a scaled bias: every factor is read
    torch::relu(a);                          // not a product
    watch.set_inside_compiled_code(false);
    torch::mm(a, b);  // eager: read as always
    step.finish();
  }
  const auto frames = watch.saved_frames();
  ASSERT_EQ(frames.size(), 5u);
  for (int i : {0, 1}) {
    SCOPED_TRACE(frames[i].op);
    for (const auto& e : frames[i].entries) {
      if (e.role == sentinel::EntryRole::Output) {
        EXPECT_EQ(e.kind, sentinel::EntryKind::Tensor);
        EXPECT_EQ(e.stats.count, 8);
      } else {
        EXPECT_EQ(e.kind, sentinel::EntryKind::Skipped);
        EXPECT_EQ(e.skip_reason, kProductFinite);
      }
    }
  }
  for (int i : {2, 3, 4}) {
    SCOPED_TRACE(frames[i].op);
    for (const auto& e : frames[i].entries) {
      if (e.kind == sentinel::EntryKind::Tensor || e.kind == sentinel::EntryKind::Skipped) {
        EXPECT_EQ(e.kind, sentinel::EntryKind::Tensor) << e.label << ": " << e.skip_reason;
      }
    }
  }

  // A factor holding an inf: the result is not finite, the factors are read at the op's end and
  // the frame shows them as if read at its start.
  at::Tensor poisoned = b.clone();
  poisoned[1][0] = std::numeric_limits<float>::infinity();
  try {
    auto step = watch.batch();
    watch.set_inside_compiled_code(true);
    torch::mm(a, poisoned);
    step.finish();
    FAIL() << "expected NonFiniteError";
  } catch (const sentinel::NonFiniteError& e) {
    const sentinel::Frame& trigger = e.report().trigger();
    EXPECT_EQ(trigger.op, "aten::mm");
    ASSERT_GE(trigger.entries.size(), 3u);
    EXPECT_EQ(trigger.entries[0].kind, sentinel::EntryKind::Tensor);
    EXPECT_EQ(trigger.entries[0].stats.abs_max, 1.0);
    EXPECT_EQ(trigger.entries[1].kind, sentinel::EntryKind::Tensor);
    EXPECT_EQ(trigger.entries[1].stats.pos_inf, 1);
  }
}

// A product whose result is empty proves nothing (mat2 with no columns): its factors are read.
// So are they where something else wants their numbers (the headroom counts).
TEST(CompiledCode, AnEmptyProductOrAnotherReaderHasItsFactorsRead) {
  TwoBlocks model;
  std::ostringstream out;
  const at::Tensor a = torch::ones({4, 3}), none = torch::ones({3, 0});
  at::Tensor poisoned = a.clone();
  poisoned[0][0] = std::numeric_limits<float>::quiet_NaN();
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out));
  try {
    auto step = watch.batch();
    watch.set_inside_compiled_code(true);
    torch::mm(poisoned, none);
    step.finish();
    FAIL() << "expected NonFiniteError: the NaN of a factor of an empty product";
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_EQ(e.report().trigger().entries.at(0).stats.nan, 1);
  }
  sentinel::Watchdog counting(model.ptr(), sentinel::Options().output(out).headroom(true).max_frames_to_save(4));
  {
    auto step = counting.batch();
    counting.set_inside_compiled_code(true);
    torch::mm(a, a.t());
    step.finish();
  }
  const auto frames = counting.saved_frames();
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].entries.at(0).kind, sentinel::EntryKind::Tensor);
  EXPECT_TRUE(frames[0].entries.at(0).has_headroom);
}

}  // namespace

// The per-batch statistics cache must never return stale numbers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sentinel/sentinel.h>

#include <functional>
#include <sstream>
#include <vector>

#include "frames/stats_cache.h"
#include "support/test_models.h"

namespace {

using sentinel::TensorStats;
using sentinel::frames::StatsCache;

TEST(StatsCache, ViewsCoveringTheSameMemoryShareOneRead) {
  StatsCache cache;
  auto w = torch::randn({64, 32});
  TensorStats a, b, c;
  cache.compute(w, a);
  cache.compute(w.t(), b);             // same block of memory, other strides
  cache.compute(w.view({32, 64}), c);  // same block, other shape
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(a.abs_max, b.abs_max);
  EXPECT_EQ(a.abs_min, c.abs_min);
  TensorStats row;
  cache.compute(w[3], row);  // a part of it: a different block, read
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(row.count, 32);
}

TEST(StatsCache, InPlaceChangesAreSeen) {
  StatsCache cache;
  auto x = torch::ones({8});
  TensorStats s;
  cache.compute(x, s);
  EXPECT_TRUE(s.finite());
  x[3] = std::numeric_limits<float>::infinity();  // an in-place op: bumps the version counter
  cache.compute(x, s);
  EXPECT_EQ(s.pos_inf, 1);
  auto view = x.view({2, 4});
  view.mul_(0);  // through a view: views share the version counter
  cache.compute(x, s);
  EXPECT_EQ(s.zeros, 7);
  EXPECT_EQ(s.nan, 1);  // inf * 0
}

// x.variable_data() (what .data() gives) shares x's memory with a version counter of its own.
// A write through it bumps only that counter, to a number x's own counter may hold too.
TEST(StatsCache, AWriteThroughADataAliasIsSeenEvenWhereTheVersionNumbersAgree) {
  StatsCache cache;
  auto x = torch::ones({8});
  x.add_(0.0);  // x's counter: 1
  TensorStats s;
  cache.compute(x, s);
  auto alias = x.variable_data();  // its own counter: 0
  alias.mul_(5.0);                 // ... now 1, as x's
  ASSERT_EQ(alias.unsafeGetTensorImpl()->version_counter().current_version(),
            x.unsafeGetTensorImpl()->version_counter().current_version());
  cache.compute(alias, s);
  EXPECT_EQ(s.abs_max, alias.abs().max().item<float>());
  cache.compute(x, s);
  EXPECT_EQ(s.abs_max, x.abs().max().item<float>());
  EXPECT_EQ(cache.hits(), 0u);
}

// A kernel that writes where its schema does not say (batch norm's running statistics) leaves
// the version counter as it was: the watchdog then forgets the reads of that storage, views of
// it included, and only those.
TEST(StatsCache, ForgettingAStorageDropsItsViewsReadsAndKeepsTheOthers) {
  StatsCache cache;
  auto written = torch::ones({4, 8});
  auto other = torch::ones({16});
  TensorStats s;
  sentinel::stats::Readability r;
  cache.compute(written, s);
  cache.compute(written[1], s);  // a view: a key of its own, the same storage
  cache.compute(other, s);
  ASSERT_EQ(cache.size(), 3u);
  float* data = written.data_ptr<float>();  // an uncounted write, as such a kernel makes
  data[8] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(cache.find(written[1], s, r));  // still taken for the old values
  EXPECT_TRUE(s.finite());
  std::vector<const c10::StorageImpl*> storages{written.storage().unsafeGetStorageImpl()};
  cache.forget_storages(storages);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_FALSE(cache.find(written[1], s, r));
  EXPECT_TRUE(cache.find(other, s, r));
  cache.compute(written[1], s);
  EXPECT_EQ(s.pos_inf, 1);
}

TEST(StatsCache, FreedMemoryReusedByANewTensorIsNeverAHit) {
  StatsCache cache;
  for (int i = 0; i < 200; ++i) {  // past several sweeps of dead tensors' entries
    // Same size each time: the allocator would hand back the same address if it could.
    auto t = torch::full({1024}, static_cast<float>(i));
    TensorStats s;
    cache.compute(t, s);
    EXPECT_EQ(s.abs_max, i) << "iteration " << i;
  }
  EXPECT_EQ(cache.hits(), 0u);
}

// The entries of tensors that died are dropped as reads come in (their version counters, held by
// the entries, freed), while a live tensor's entry stays and serves it.
TEST(StatsCache, DeadTensorsEntriesAreDroppedAndLiveOnesKept) {
  StatsCache cache;
  auto kept = torch::randn({64});
  TensorStats s;
  cache.compute(kept, s);
  std::vector<torch::Tensor> alive;
  for (int i = 0; i < 1000; ++i) {
    auto t = torch::full({256}, static_cast<float>(i));
    cache.compute(t, s);
    if (i % 100 == 0) alive.push_back(t);  // these stay alive
  }
  // 1,011 reads; what is left is the live tensors and the dead ones read since the last sweep.
  EXPECT_LE(cache.size(), 1 + alive.size() + 1000 / 8);
  EXPECT_GE(cache.size(), 1 + alive.size());
  const size_t hits = cache.hits();
  cache.compute(kept, s);
  for (const auto& t : alive) cache.compute(t.view({16, 16}), s);
  EXPECT_EQ(cache.hits(), hits + 1 + alive.size());
  EXPECT_EQ(s.abs_max, 900.0);
}

TEST(StatsCache, GappedViewsAndInferenceTensorsAreReadEveryTime) {
  StatsCache cache;
  auto x = torch::randn({16, 16});
  TensorStats s;
  cache.compute(x.slice(1, 0, 16, 2), s);
  cache.compute(x.slice(1, 0, 16, 2), s);
  torch::Tensor inf_t;
  {
    c10::InferenceMode guard;
    inf_t = torch::ones({4});
  }
  cache.compute(inf_t, s);
  cache.compute(inf_t, s);
  EXPECT_EQ(cache.hits(), 0u);
  EXPECT_EQ(s.count, 4);
}

// In a watched model: a value made non-finite in place between two ops is caught at the op
// that reads it, even though the tensor was read (finite) earlier in the batch.
struct InPlaceImpl : torch::nn::Module {
  InPlaceImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(torch::Tensor x) {
    auto h = fc(x);
    auto g = torch::relu(h);
    h.select(1, 2).fill_(std::numeric_limits<float>::infinity());
    return h + g;
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(InPlace);

TEST(StatsCache, WatchdogSeesInPlaceDamageBetweenOps) {
  InPlace model;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(model, sentinel::Options().output(out));
  torch::NoGradGuard no_grad;
  try {
    debug.forward(sentinel_test::small_input());
    FAIL();
  } catch (const sentinel::NonFiniteError& e) {
    EXPECT_EQ(e.report().trigger().op, "aten::fill_");
    EXPECT_TRUE(e.report().produced_here);
  }
}

// Options::reuse_unchanged_parameter_reads: the Linear's weight in batch 1 as its frame shows it
// (abs max), `change` having run on the model between batch 0 and batch 1, and torch's own
// abs().max() of the weight of batch 1 (the oracle) and of batch 0.
struct WeightAbsMax {
  double shown = -1, batch1 = -1, batch0 = -1;
};
WeightAbsMax weight_abs_max_in_second_batch(bool reuse, const std::function<void(torch::nn::Linear&)>& change) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 3);
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 4});
  std::ostringstream out;
  sentinel::Watchdog watch(model.ptr(), sentinel::Options().output(out).reuse_unchanged_parameter_reads(reuse));
  WeightAbsMax w;
  for (int batch = 0; batch < 2; ++batch) {
    if (batch == 1) change(model);
    (batch == 0 ? w.batch0 : w.batch1) = model->weight.abs().max().item<double>();
    auto guard = watch.batch();
    model->forward(x);
    guard.finish();
  }
  for (const auto& frame : watch.saved_frames()) {
    if (frame.batch_number != 1) continue;
    for (const auto& e : frame.entries) {
      if (e.label == "weight") w.shown = e.stats.abs_max;
    }
  }
  return w;
}

TEST(StatsCache, KeptParameterReadsAreReusedOnlyWhenAskedAndOnlyWhileTheVersionHolds) {
  for (bool reuse : {false, true}) {
    SCOPED_TRACE(reuse ? "reuse" : "default");
    const WeightAbsMax same = weight_abs_max_in_second_batch(reuse, [](torch::nn::Linear&) {});
    ASSERT_GT(same.batch1, 0.0);
    EXPECT_EQ(same.shown, same.batch1);
    // An in-place op bumps the version counter: kept numbers are dropped and the weight read.
    const WeightAbsMax doubled = weight_abs_max_in_second_batch(reuse, [](torch::nn::Linear& m) { m->weight.mul_(2); });
    EXPECT_EQ(doubled.batch1, 2 * doubled.batch0);
    EXPECT_EQ(doubled.shown, doubled.batch1);
  }
  // A write LibTorch does not count: the default reads the weight again and sees it; the opt-in
  // keeps the numbers of batch 0 (the documented price of the option).
  auto written = [](torch::nn::Linear& m) { m->weight.data_ptr<float>()[0] = 100.0f; };
  const WeightAbsMax exact = weight_abs_max_in_second_batch(false, written);
  EXPECT_EQ(exact.batch1, 100.0);
  EXPECT_EQ(exact.shown, exact.batch1);
  const WeightAbsMax kept = weight_abs_max_in_second_batch(true, written);
  EXPECT_EQ(kept.batch1, 100.0);
  EXPECT_EQ(kept.shown, kept.batch0);
}

}  // namespace

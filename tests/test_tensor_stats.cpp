// The fused statistics pass against a float64 oracle built from torch's own conversions.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <algorithm>
#include <limits>
#include <random>

#include "stats/tensor_stats.h"
#include "stats/tensor_walk.h"
#include "support/simd_levels.h"

namespace {

using sentinel::TensorStats;
using sentinel::stats::Readability;
using sentinel_test::at_every_simd_level;

// Independent oracle: torch converts to float64, then a plain loop counts. Subnormal thresholds
// come from std::numeric_limits of the tensor's dtype (c10 provides them for Half and BFloat16).
TensorStats oracle(const torch::Tensor& t) {
  double tiny = 0;
  switch (t.scalar_type()) {
    case torch::kFloat: tiny = std::numeric_limits<float>::min(); break;
    case torch::kDouble: tiny = std::numeric_limits<double>::min(); break;
    case torch::kHalf: tiny = static_cast<double>(static_cast<float>(std::numeric_limits<c10::Half>::min())); break;
    case torch::kBFloat16:
      tiny = static_cast<double>(static_cast<float>(std::numeric_limits<c10::BFloat16>::min()));
      break;
    default: break;
  }
  TensorStats s;
  auto d = t.to(torch::kDouble).contiguous().reshape({-1});
  auto a = d.accessor<double, 1>();
  for (int64_t i = 0; i < d.numel(); ++i) {
    const double x = a[i];
    ++s.count;
    if (std::isnan(x)) { ++s.nan; continue; }
    if (std::isinf(x)) { x > 0 ? ++s.pos_inf : ++s.neg_inf; }
    if (x == 0) ++s.zeros;
    if (x != 0 && std::fabs(x) < tiny) ++s.subnormal;
    s.abs_min = std::min(s.abs_min, std::fabs(x));
    s.abs_max = std::max(s.abs_max, std::fabs(x));
  }
  return s;
}

// ATen's intra-op thread count as it was, once a test that sets it ends.
struct RestoreThreads {
  int threads = at::get_num_threads();
  ~RestoreThreads() { at::set_num_threads(threads); }
};

void expect_equal(const TensorStats& got, const TensorStats& want, const std::string& what) {
  EXPECT_EQ(got.count, want.count) << what;
  EXPECT_EQ(got.nan, want.nan) << what;
  EXPECT_EQ(got.pos_inf, want.pos_inf) << what;
  EXPECT_EQ(got.neg_inf, want.neg_inf) << what;
  EXPECT_EQ(got.zeros, want.zeros) << what;
  EXPECT_EQ(got.subnormal, want.subnormal) << what;
  if (want.count > want.nan) {
    EXPECT_EQ(got.abs_min, want.abs_min) << what;
    EXPECT_EQ(got.abs_max, want.abs_max) << what;
  }
}

// Values: random normals of several scales, then special values sprinkled in by index.
torch::Tensor make_values(torch::ScalarType dtype, std::vector<int64_t> shape, int variant) {
  auto t = torch::randn(shape, torch::kDouble) * std::pow(10.0, (variant % 5) - 2);
  auto flat = t.view({-1});
  const int64_t n = flat.numel();
  if (variant >= 2 && n > 0) {
    const double inf = std::numeric_limits<double>::infinity();
    const double specials[] = {0.0, -0.0, inf, -inf, std::nan(""), 1e-40, -3e-42, 5e-8, 1e-310, 3.4e38, 65504.0, 7e4};
    for (size_t k = 0; k < sizeof specials / sizeof specials[0]; ++k) {
      flat[static_cast<int64_t>((k * 7919 + variant) % n)] = specials[k];
    }
  }
  return t.to(dtype);  // torch's own cast decides what each special becomes in this dtype
}

struct Case {
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};

class StatsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(StatsOracle, MatchesFloat64ReferenceOnEveryLayout) {
  const auto& c = GetParam();
  at_every_simd_level([&] {
  torch::manual_seed(42);
  for (int variant = 0; variant < 6; ++variant) {
    auto base = make_values(c.dtype, c.shape, variant);
    std::vector<std::pair<std::string, torch::Tensor>> layouts = {{"contiguous", base}};
    if (base.dim() >= 2) {
      layouts.push_back({"transposed", base.transpose(0, 1)});
      layouts.push_back({"column slice", base.slice(1, 0, base.size(1), 2)});
      layouts.push_back({"expanded", base.select(0, 0).unsqueeze(0).expand({3, base.size(1)})});
    }
    if (base.dim() == 1 && base.numel() > 2) layouts.push_back({"strided", base.slice(0, 1, base.numel(), 3)});
    for (const auto& [name, t] : layouts) {
      TensorStats got;
      const auto r = sentinel::stats::compute(t, got);
      const std::string what = std::string(c10::toString(c.dtype)) + " " + name + " variant " + std::to_string(variant);
      if (t.numel() == 0) {
        EXPECT_EQ(r, Readability::Empty) << what;
        continue;
      }
      ASSERT_EQ(r, Readability::Read) << what;
      expect_equal(got, oracle(t), what);
    }
  }
  });
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{0}, {1}, {7}, {1000}, {3, 5}, {33, 17}, {4, 1025}, {2, 0}}) {
      out.push_back({dtype, shape});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(DtypesAndShapes, StatsOracle, ::testing::ValuesIn(cases()));

TEST(Stats, TensorsLargerThanOneBlockCombineExactly) {
  torch::manual_seed(7);
  auto t = torch::randn({3, (1 << 20) + 5});
  t[2][(1 << 20) + 3] = std::numeric_limits<float>::infinity();
  t[0][17] = 0.0f;
  TensorStats got;
  ASSERT_EQ(sentinel::stats::compute(t, got), Readability::Read);
  expect_equal(got, oracle(t), "large");
  ASSERT_EQ(sentinel::stats::compute(t.t(), got), Readability::Read);  // dense but transposed
  expect_equal(got, oracle(t), "large transposed");
}

// Views with gaps are gathered row by row into 4096-element buffers, and projected into the
// totals before 2^20 elements (32-bit counts): rows that straddle a buffer, and a view larger
// than a block, with specials at the edges of both.
TEST(Stats, ViewsWithGapsGatheredAcrossBuffersAndBlocks) {
  torch::manual_seed(3);
  const float tiny = std::numeric_limits<float>::min();
  // One head of a packed q/k/v projection: rows of 64 floats, 768 apart.
  auto qkv = torch::randn({4, 128, 3 * 4 * 64});
  qkv[0][63][256 + 64 + 63] = -std::numeric_limits<float>::infinity();  // last element of buffer 1
  qkv[1][0][256 + 64] = 0.0f;
  qkv[3][127][256 + 127] = tiny / 8;  // last element of the view
  auto head = qkv.view({4, 128, 3, 4, 64}).select(2, 1).transpose(1, 2);  // [4, 4, 128, 64]
  // A column slice of more than 2^20 elements: rows of 999 straddle every buffer.
  auto wide = torch::randn({1100, 2 * 999});
  auto columns = wide.slice(1, 0, 999);
  const int64_t block_edge = (int64_t{1} << 20) / 999;  // the row holding element 2^20
  wide[block_edge][(int64_t{1} << 20) % 999] = std::nanf("");
  wide[block_edge][(int64_t{1} << 20) % 999 - 1] = 3e38f;
  wide[5][998] = -0.0f;
  wide[1099][998] = tiny / 2;
  ASSERT_FALSE(head.is_non_overlapping_and_dense());
  ASSERT_GT(columns.numel(), int64_t{1} << 20);
  at_every_simd_level([&] {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
      for (const auto& [name, view] : {std::pair<std::string, torch::Tensor>{"head", head}, {"columns", columns}}) {
        // The same gaps in every dtype: the cast is of the base, then the same view is taken.
        auto base = (name == "head" ? qkv : wide).to(dtype);
        auto t = name == "head" ? base.view({4, 128, 3, 4, 64}).select(2, 1).transpose(1, 2) : base.slice(1, 0, 999);
        ASSERT_FALSE(t.is_non_overlapping_and_dense());
        TensorStats got;
        ASSERT_EQ(sentinel::stats::compute(t, got), Readability::Read);
        expect_equal(got, oracle(t), name + " " + c10::toString(dtype));
      }
    }
  });
}

// The float32 pass reads 4096-element chunks and counts zeros and subnormals only in chunks that
// hold some (counting in the first read after such a chunk, until a chunk holds none), and
// re-reads chunks holding inf or NaN: every order of those kinds of chunk, at every offset.
TEST(Stats, FloatChunksOfEveryKindInEveryOrder) {
  constexpr int64_t kChunk = 4096;
  const float tiny = std::numeric_limits<float>::min();
  enum Kind { Ordinary, HalfZeros, OneSubnormalLast, OnlyNegativeZero, AllZero, NanAndZeros, MinNormalExactly, Kinds };
  auto fill = [&](torch::Tensor chunk, int kind) {
    chunk.copy_(torch::randn({kChunk}) * 3);
    switch (kind) {
      case HalfZeros: chunk.clamp_min_(0); break;
      case OneSubnormalLast: chunk[kChunk - 1] = tiny / 4; break;
      case OnlyNegativeZero: chunk[100] = -0.0f; break;
      case AllZero: chunk.zero_(); break;
      case NanAndZeros: chunk.clamp_min_(0); chunk[kChunk / 2] = std::nanf(""); chunk[3] = -std::numeric_limits<float>::infinity(); break;
      case MinNormalExactly: chunk[7] = tiny; chunk[8] = -std::nextafter(tiny, 1.0f); break;
      default: break;
    }
  };
  torch::manual_seed(11);
  std::mt19937 order(5);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int> kinds;
    for (int k = 0; k < 2 * Kinds; ++k) kinds.push_back(k % Kinds);
    std::shuffle(kinds.begin(), kinds.end(), order);
    auto t = torch::empty({static_cast<int64_t>(kinds.size()) * kChunk + 37});
    for (size_t c = 0; c < kinds.size(); ++c) fill(t.slice(0, c * kChunk, (c + 1) * kChunk), kinds[c]);
    t.slice(0, kinds.size() * kChunk).copy_(torch::randn({37}));
    if (trial % 2) t[-2] = trial % 4 == 1 ? 0.0f : tiny / 2;  // zero or subnormal in the last partial chunk
    at_every_simd_level([&] {
      for (int64_t offset : {0, 1, 5, 8}) {  // views not aligned to a vector
        auto view = t.slice(0, offset);
        TensorStats got;
        ASSERT_EQ(sentinel::stats::compute(view, got), Readability::Read);
        expect_equal(got, oracle(view), "trial " + std::to_string(trial) + " offset " + std::to_string(offset));
      }
    });
  }
}

TEST(Stats, NegativeZeroIsPositiveZeroInAbsMin) {
  TensorStats s;
  sentinel::stats::compute(torch::tensor({-0.0f, 2.0f}), s);
  EXPECT_EQ(s.abs_min, 0.0);
  EXPECT_FALSE(std::signbit(s.abs_min));
  EXPECT_EQ(s.zeros, 1);
}

TEST(Stats, HfViewPropagatesNanLikeTorchMinMax) {
  TensorStats s;
  sentinel::stats::compute(torch::tensor({1.0f, std::nanf(""), 3.0f}), s);
  EXPECT_TRUE(std::isnan(s.hf_abs_min()));
  EXPECT_TRUE(std::isnan(s.hf_abs_max()));
  EXPECT_EQ(s.abs_max, 3.0);  // the finite range is kept for the JSON report
}

TEST(Stats, IntegerAndBoolTensorsGiveAbsMinMaxAsHfShowsThem) {
  TensorStats s;
  ASSERT_EQ(sentinel::stats::compute(torch::tensor({-5, 0, 3}, torch::kLong), s), Readability::Read);
  EXPECT_EQ(s.abs_min, 0.0);
  EXPECT_EQ(s.abs_max, 5.0);
  EXPECT_EQ(s.zeros, 1);
  EXPECT_TRUE(s.finite());
  ASSERT_EQ(sentinel::stats::compute(torch::tensor({true, false}), s), Readability::Read);
  EXPECT_EQ(s.abs_max, 1.0);
  ASSERT_EQ(sentinel::stats::compute(torch::tensor({-128, 127}, torch::kChar), s), Readability::Read);
  EXPECT_EQ(s.abs_max, 128.0);
}

TEST(Stats, UnreadableTensorsSayWhy) {
  TensorStats s;
  EXPECT_EQ(sentinel::stats::compute(torch::Tensor(), s), Readability::Undefined);
  EXPECT_EQ(sentinel::stats::compute(torch::ones({2, 2}).to_sparse(), s), Readability::Sparse);
  EXPECT_EQ(sentinel::stats::compute(torch::empty({3}, torch::device(torch::kMeta)), s), Readability::Meta);
  EXPECT_EQ(sentinel::stats::compute(torch::ones({2}, torch::kComplexFloat), s), Readability::Complex);
  EXPECT_EQ(sentinel::stats::compute(torch::quantize_per_tensor(torch::ones({2}), 0.1, 0, torch::kQInt8), s),
            Readability::Quantized);
  EXPECT_EQ(sentinel::stats::compute(torch::ones({0, 3}), s), Readability::Empty);
  EXPECT_STREQ(sentinel::stats::describe(Readability::Meta), "meta");
}

// A large dense tensor read in contiguous parts by ATen's intra-op threads: the parts must add up
// to the oracle's numbers, whatever the dtype, the number of threads (parts of unequal length) and
// wherever the specials fall (first and last element of each part), and the parts must really be
// read by several threads (a build without OpenMP would read them one after another).
TEST(Stats, LargeReadsSplitBetweenAtenThreadsAddUp) {
  const RestoreThreads restore;
  torch::manual_seed(13);
  const double inf = std::numeric_limits<double>::infinity();
  for (int threads : {2, 3}) {
    at::set_num_threads(threads);
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
      // Three MiB and a few elements: split into `threads` parts.
      const int64_t n = (int64_t{3} << 20) / c10::elementSize(dtype) + 77;
      auto base = torch::randn({n}, torch::kDouble);
      for (int p = 0; p <= threads; ++p) {  // around every part's start (aligned or not)
        const int64_t edge = std::min(n - 1, n * p / threads / 1024 * 1024);
        base[edge] = p % 2 ? inf : -inf;
        base[std::max<int64_t>(0, edge - 1)] = std::nan("");
        base[std::min(n - 1, edge + 1)] = 0.0;
      }
      base[n - 1] = 1e-41;  // a subnormal in float32 and bfloat16, a zero in half (torch casts it)
      base[3] = 1e30;
      auto t = base.to(dtype).reshape({n});
      at_every_simd_level([&] {
        for (const auto& [name, view] : {std::pair<std::string, torch::Tensor>{"contiguous", t},
                                         {"transposed", t.narrow(0, 0, n - 77).view({-1, 64}).t()}}) {
          const std::string what =
              std::string(c10::toString(dtype)) + " " + name + ", " + std::to_string(threads) + " threads";
          TensorStats got, alone;
          int threads_used = 0;
          ASSERT_EQ(sentinel::stats::compute_across_threads(view, got, &threads_used), Readability::Read) << what;
          expect_equal(got, oracle(view), what);
          ASSERT_EQ(sentinel::stats::compute(view, alone), Readability::Read);
          expect_equal(got, alone, what + " (against the one-thread read)");
          EXPECT_EQ(threads_used, threads) << what;
        }
      });
    }
  }
  // Small tensors stay on one thread.
  at::set_num_threads(2);
  int threads_used = 0;
  TensorStats s;
  sentinel::stats::compute_across_threads(torch::randn({1000}), s, &threads_used);
  EXPECT_EQ(threads_used, 1);
  // Tensors it cannot read, large or not, say why as compute() does.
  const std::vector<torch::Tensor> unreadable = {
      torch::Tensor(), torch::ones({2, 2}).to_sparse(), torch::empty({1 << 22}, torch::device(torch::kMeta)),
      torch::ones({1 << 20}, torch::kComplexFloat), torch::ones({0, 1 << 20})};
  for (const auto& t : unreadable) {
    TensorStats alone;
    EXPECT_EQ(sentinel::stats::compute_across_threads(t, s), sentinel::stats::compute(t, alone));
  }
}

// Views with gaps are read as rows in memory order, split between threads by rows.
TEST(Stats, ViewsWithGapsSplitBetweenAtenThreadsAddUp) {
  const RestoreThreads restore;
  torch::manual_seed(19);
  const double inf = std::numeric_limits<double>::infinity();
  const double specials[] = {inf, -inf, std::nan(""), 0.0, -0.0, 1e-41, 1e-310, 3e38};
  auto with_specials = [&](torch::Tensor base) {
    auto flat = base.view({-1});
    for (int64_t i = 0; i < flat.numel(); i += 997) flat[i] = specials[(i / 997) % 8];
    return base;
  };
  auto qkv = with_specials(torch::randn({8, 128, 3 * 4 * 64}, torch::kDouble));
  auto wide = with_specials(torch::randn({2048, 1024}, torch::kDouble));
  auto row = with_specials(torch::randn({1, 1000}, torch::kDouble));
  for (int threads : {2, 3}) {
    at::set_num_threads(threads);
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
      const std::vector<std::pair<std::string, torch::Tensor>> views = {
          {"head", qkv.to(dtype).view({8, 128, 3, 4, 64}).select(2, 1).transpose(1, 2)},
          {"columns", wide.to(dtype).slice(1, 0, 1000)},
          {"broadcast row", row.to(dtype).expand({600, 1000})}};
      at_every_simd_level([&] {
        for (const auto& [name, view] : views) {
          const std::string what = name + " " + c10::toString(dtype) + ", " + std::to_string(threads) + " threads";
          ASSERT_FALSE(view.is_non_overlapping_and_dense()) << what;
          TensorStats got;
          int threads_used = 0;
          ASSERT_EQ(sentinel::stats::compute_across_threads(view, got, &threads_used), Readability::Read) << what;
          expect_equal(got, oracle(view), what);
          EXPECT_EQ(threads_used, threads) << what;
        }
      });
    }
  }
}

// Every element of a view is visited once, whichever ranges of rows cover it, and the rows of a
// view without broadcast dimensions come in memory order. The oracle: the view of a tensor whose
// elements are their own offsets.
TEST(Stats, RowLayoutVisitsEveryElementOnceInMemoryOrder) {
  auto offsets = torch::arange(6 * 8 * 10 * 12, torch::kLong).view({6, 8, 10, 12});
  const std::vector<std::pair<std::string, torch::Tensor>> views = {
      {"head", offsets.view({6, 8, 2, 60}).select(2, 1).view({6, 8, 5, 12}).transpose(1, 2)},
      {"permuted slice", offsets.permute({2, 0, 3, 1}).slice(2, 1, 11, 3)},
      {"every other row", offsets.slice(1, 0, 8, 2)},
      {"broadcast", offsets.select(0, 2).select(0, 3).unsqueeze(0).expand({4, 10, 12})},
      {"one element", offsets.slice(0, 5, 6).slice(1, 7, 8).slice(2, 9, 10).slice(3, 11, 12)}};
  for (const auto& [name, view] : views) {
    const sentinel::stats::kernels::RowLayout layout(view);
    const int64_t rows = layout.rows();
    EXPECT_EQ(rows * layout.run_length(), view.numel()) << name;
    const bool broadcast = name == "broadcast";
    for (int64_t cut = 0; cut <= rows; cut += std::max<int64_t>(1, rows / 5)) {
      std::vector<int64_t> visited;
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, cut}, {cut, rows}}) {
        layout.for_each_row(begin, end, [&](int64_t offset, int64_t n, int64_t stride) {
          if (!broadcast && !visited.empty()) {
            EXPECT_GT(view.storage_offset() + offset, visited.back()) << name << ": rows out of memory order";
          }
          for (int64_t i = 0; i < n; ++i) visited.push_back(view.storage_offset() + offset + i * stride);
        });
      }
      auto want = view.contiguous().view({-1});
      std::vector<int64_t> expected(want.data_ptr<int64_t>(), want.data_ptr<int64_t>() + want.numel());
      std::sort(visited.begin(), visited.end());
      std::sort(expected.begin(), expected.end());
      EXPECT_EQ(visited, expected) << name << ", rows cut at " << cut;
    }
  }
  // The head of a packed projection is rows of all its heads' columns together.
  auto qkv = torch::zeros({4, 128, 768});
  const sentinel::stats::kernels::RowLayout head(qkv.view({4, 128, 3, 4, 64}).select(2, 0).transpose(1, 2));
  EXPECT_EQ(head.rows(), 4 * 128);
  EXPECT_EQ(head.run_length(), 256);
  EXPECT_EQ(head.run_stride(), 1);
}

TEST(Stats, ListsOfTensorsReadTogetherMatchTheOracle) {
  const RestoreThreads restore;
  torch::manual_seed(17);
  // An optimizer's list (a large tensor among small ones), every dtype, views, and what is not read.
  std::vector<torch::Tensor> list = {torch::randn({300000}), torch::randn({64, 48}).t(),
                                     torch::randn({2048, 100}).slice(1, 0, 90), torch::Tensor(),
                                     torch::ones({0, 3}), torch::arange(1000), torch::ones({4}, torch::kComplexFloat)};
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    for (int i = 0; i < 12; ++i) list.push_back(torch::randn({i * 20000 + 5}).to(dtype));
  }
  list[9][7] = std::numeric_limits<float>::infinity();
  list[30][2] = std::nan("");
  list[20][0] = 0.0;
  for (int threads : {2, 3}) {
    at::set_num_threads(threads);
    at_every_simd_level([&] {
      std::vector<TensorStats> got(list.size());
      std::vector<Readability> readability(list.size());
      int threads_used = 0;
      sentinel::stats::compute_many(list, got.data(), readability.data(), &threads_used);
      EXPECT_EQ(threads_used, threads);
      for (size_t i = 0; i < list.size(); ++i) {
        const std::string what = "tensor " + std::to_string(i) + ", " + std::to_string(threads) + " threads";
        TensorStats alone;
        const Readability expected = sentinel::stats::compute(list[i], alone);
        ASSERT_EQ(readability[i], expected) << what;
        if (expected != Readability::Read) continue;
        expect_equal(got[i], list[i].is_floating_point() ? oracle(list[i]) : alone, what);
      }
    });
  }
  // Inside a parallel region, or with too little to share, one thread reads them all.
  at::set_num_threads(2);
  std::vector<torch::Tensor> small = {torch::randn({100}), torch::randn({200})};
  std::vector<TensorStats> got(small.size());
  std::vector<Readability> readability(small.size());
  int threads_used = 0;
  sentinel::stats::compute_many(small, got.data(), readability.data(), &threads_used);
  EXPECT_EQ(threads_used, 1);
  expect_equal(got[1], oracle(small[1]), "small");
}

}  // namespace

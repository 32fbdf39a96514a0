// What reading an op's result costs right after the op, on one thread (stats::compute) and split
// between ATen's intra-op threads (stats::compute_across_threads): the op alone, the op and a read
// of its result, for a GEMM (MKL's or OpenBLAS's threads wrote the result) and an elementwise op
// (ATen's parallel_for wrote it, in the contiguous halves the split reads), and for the GEMM a
// read of a third of its columns (one of q, k, v out of a packed projection: a view with gaps).
// The read's cost is a case's time less the op's alone (docs/benchmarks.md, "Reads across ATen's
// threads").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <vector>

#include "stats/tensor_stats.h"

namespace {

enum Read { None, OneThread, AcrossThreads };
enum Producer { Gemm, GemmColumns, Elementwise };

template <Producer P, Read R>
void BM_ReadAfterOp(benchmark::State& state) {
  const int64_t rows = 512, columns = state.range(0) * (P == GemmColumns ? 3 : 1);
  const at::Tensor a = at::randn({rows, 256}), w = at::randn({256, columns}), x = at::randn({rows, columns});
  at::Tensor out = at::empty({rows, columns});
  const at::Tensor read = P == GemmColumns ? out.slice(1, columns / 3, 2 * columns / 3) : out;
  sentinel::TensorStats s;
  for (auto _ : state) {
    if (P == Elementwise) {
      at::gelu_out(out, x);
    } else {
      at::mm_out(out, a, w);
    }
    if (R == OneThread) sentinel::stats::compute(read, s);
    if (R == AcrossThreads) sentinel::stats::compute_across_threads(read, s);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * read.nbytes());
  state.counters["threads"] = at::get_num_threads();
}

// Reads of 256 KiB, 512 KiB, 1 MiB and 2 MiB (float32, 512 rows).
#define SENTINEL_READ_AFTER_OP(P, R) \
  BENCHMARK_TEMPLATE(BM_ReadAfterOp, P, R)->Arg(128)->Arg(256)->Arg(512)->Arg(1024)
SENTINEL_READ_AFTER_OP(Gemm, None);
SENTINEL_READ_AFTER_OP(Gemm, OneThread);
SENTINEL_READ_AFTER_OP(Gemm, AcrossThreads);
SENTINEL_READ_AFTER_OP(GemmColumns, None);
SENTINEL_READ_AFTER_OP(GemmColumns, OneThread);
SENTINEL_READ_AFTER_OP(GemmColumns, AcrossThreads);
SENTINEL_READ_AFTER_OP(Elementwise, None);
SENTINEL_READ_AFTER_OP(Elementwise, OneThread);
SENTINEL_READ_AFTER_OP(Elementwise, AcrossThreads);

// Reading memory that is not in the core's cache: 32 MiB of float32 tensors (state(0) KiB each,
// an optimizer's state or a step's parameters), after 64 MiB of other writes pushed them out
// (`cold`), or read again at once (from L3). One thread, stats::compute per tensor
// (docs/benchmarks.md, "Reading ahead").
void BM_ReadTensors(benchmark::State& state, bool cold) {
  const int64_t elements = state.range(0) * 256, count = (int64_t{32} << 20) / (elements * 4);
  std::vector<at::Tensor> tensors;
  for (int64_t i = 0; i < count; ++i) tensors.push_back(at::randn({elements}));
  at::Tensor other = at::zeros({int64_t{16} << 20});
  sentinel::TensorStats s;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      other.add_(1.0);
      state.ResumeTiming();
    }
    for (const auto& t : tensors) sentinel::stats::compute(t, s);
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * count * elements * 4);
}
BENCHMARK_CAPTURE(BM_ReadTensors, cold, true)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReadTensors, warm, false)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

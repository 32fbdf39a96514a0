// compute_across_threads: one large read split between ATen's intra-op threads.
//
// With ATen on every core, a model's ops run on all of them and the watching thread's reads on
// one: the larger the machine, the larger the watched step's share of reading. Splitting a large
// tensor's memory into contiguous parts, one per thread of ATen's own pool, reads it at the speed
// the model's elementwise ops write it, and the parts match how those ops split their outputs
// (contiguous ranges), so each core reads what it wrote, from its own cache. A view with gaps is
// split between its rows, taken in memory order (kernels::RowLayout).
//
// ATen's parallel_for is a header template: under ATen's OpenMP backend its region is an OpenMP
// pragma, so this file is compiled with the compiler's OpenMP flags (CMakeLists.txt). Compiled
// without them it still reads every part, on one thread.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>

#include "stats/tensor_stats.h"

namespace sentinel {
namespace stats {
namespace {

// Smaller parts cost more than they save: below about 128 KiB, waking a second thread outweighs
// half a read (docs/benchmarks.md, "Reads across ATen's threads").
constexpr int64_t kMinPartBytes = int64_t{128} << 10;
// Parts start on whole vector chunks of the kernel.
constexpr int64_t kPartAlignment = 1024;
// On the stack: a read allocates nothing (small allocations made during a step can keep malloc
// from joining its freed buffers: docs/benchmarks.md, "Hugging Face's Trainer").
constexpr int64_t kMaxParts = 64;

bool is_floating(c10::ScalarType s) {
  return s == c10::kFloat || s == c10::kDouble || s == c10::kHalf || s == c10::kBFloat16;
}

// What a read of `t` passes over, for sharing reads out (0 for what compute() does not read).
int64_t bytes_to_read(const at::Tensor& t) {
  return t.defined() && !t.is_nested() && t.layout() == c10::kStrided && !t.is_meta() ? t.numel() * t.element_size()
                                                                                         : 0;
}

// Runs read_part(p) for the parts [0, parts) on ATen's threads; `threads_used`, when given, is
// set to the number of threads that ran one.
template <typename ReadPart>
void read_parts(int64_t parts, int* threads_used, ReadPart&& read_part) {
  std::array<int, kMaxParts> reader;
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      read_part(p);
      reader[p] = at::get_thread_num();
    }
  });
  if (threads_used) {
    std::sort(reader.begin(), reader.begin() + parts);
    *threads_used = static_cast<int>(std::unique(reader.begin(), reader.begin() + parts) - reader.begin());
  }
}

}  // namespace

Readability compute_across_threads(const at::Tensor& t, TensorStats& out, int* threads_used) {
  if (threads_used) *threads_used = 1;
  // Every op's small results come this way: the cheap tests first, and compute() alone (with its
  // own readability check) for a tensor too small to split.
  if (bytes_to_read(t) < 2 * kMinPartBytes || !is_floating(t.scalar_type()) || compute_readability(t) != Readability::Read ||
      at::in_parallel_region()) {
    return compute(t, out);
  }
  const bool dense = t.is_non_overlapping_and_dense();
  // A view with gaps is split between its rows (src/stats/tensor_walk.h), whole rows to a part.
  const int64_t n = dense ? t.numel() : gapped_rows(t);
  const int64_t parts =
      std::min({int64_t{at::get_num_threads()}, t.numel() * t.element_size() / kMinPartBytes, n, kMaxParts});
  if (parts < 2) return compute(t, out);
  auto part_start = [&](int64_t p) {
    if (p == parts) return n;
    return dense ? std::min(n, (n * p / parts) / kPartAlignment * kPartAlignment) : n * p / parts;
  };
  std::array<TensorStats, kMaxParts> part_stats;
  read_parts(parts, threads_used, [&](int64_t p) {
    if (dense) {
      compute_dense_range(t, part_start(p), part_start(p + 1), part_stats[p]);
    } else {
      compute_gapped_rows(t, part_start(p), part_start(p + 1), part_stats[p]);
    }
  });
  out = TensorStats{};
  for (int64_t p = 0; p < parts; ++p) merge_part(part_stats[p], out);
  return Readability::Read;
}

void compute_many(c10::ArrayRef<at::Tensor> tensors, TensorStats* out, Readability* readability, int* threads_used) {
  if (threads_used) *threads_used = 1;
  const int64_t n = static_cast<int64_t>(tensors.size());
  int64_t total = 0;
  for (const auto& t : tensors) total += bytes_to_read(t);
  const int64_t parts = std::min({int64_t{at::get_num_threads()}, n, total / kMinPartBytes, kMaxParts});
  if (parts < 2 || at::in_parallel_region()) {
    for (int64_t i = 0; i < n; ++i) readability[i] = compute_across_threads(tensors[i], out[i]);
    return;
  }
  // Part p: the tensors whose first byte lies in [total * p / parts, total * (p + 1) / parts).
  std::array<int64_t, kMaxParts + 1> first;
  int64_t at_byte = 0, part = 0;
  for (int64_t i = 0; i < n; ++i) {
    while (part < parts && at_byte >= total * part / parts) first[part++] = i;
    at_byte += bytes_to_read(tensors[i]);
  }
  while (part <= parts) first[part++] = n;
  read_parts(parts, threads_used, [&](int64_t p) {
    for (int64_t i = first[p]; i < first[p + 1]; ++i) readability[i] = compute(tensors[i], out[i]);
  });
}

}  // namespace stats
}  // namespace sentinel

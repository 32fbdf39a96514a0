#pragma once
// The fused statistics pass over one tensor (CPU).
#include <sentinel/stats.h>

#include "stats/stats_accumulator.h"

#include <string>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

namespace at {
class Tensor;
}

namespace sentinel {
namespace stats {

enum class Readability {
  Read,        // stats filled in
  Undefined,   // an undefined tensor (absent optional): shown as None
  Empty,       // no elements
  Sparse,
  OtherLayout,  // mkldnn and other non-strided layouts
  Meta,
  NotOnCpu,
  Quantized,
  Complex,
  OtherDtype,
  // On a device whose statistics run there (src/device/):
  DeviceStrided,    // a view with gaps (a slice): the kernel reads one dense span
  DeviceDtype,      // a dtype the kernel does not read (float64, integers, bool)
  CapturedInGraph,  // reduced inside a CUDA graph capture: its numbers exist only at replay
  // An op's destination whose old values it never reads (copy_'s self, an out= argument): often
  // uninitialized memory, so its bits mean nothing.
  Overwritten,
  // Tensors with nothing in memory to read: reading them would throw or fault.
  Nested,      // a nested tensor (its storage is a packed buffer, not this view's elements)
  ZeroTensor,  // an efficient zero tensor (at::_efficientzerotensor): no memory at all
  NoStorage,   // a tensor without storage (a functional or wrapper tensor)
  NoData,      // elements without a data pointer
  // A fused TorchScript group's results (Options::keep_torchscript_fusion): its kernel's event
  // carries no tensors.
  InsideFusedKernel,
  // A factor of a matrix product inside compiled code, left unread because the product came out
  // finite (read after all when it did not): src/core/gemm_ops.h, factors_of_product.
  FactorOfFiniteProduct,
  // Memory an op of the `empty` family made that nothing has written yet (core/uninitialized_memory.h):
  // its bits mean nothing.
  Uninitialized,
  // Memory that was uninitialized and that an op returned without declaring a write (a custom op
  // filling its rank's slice of a buffer): how much of it holds values is unknown.
  PartlyWritten,
  // A tensor subclass that dispatches to Python (a DTensor, FSDP's sharded parameters): its
  // memory is not its elements; a front end may hand its local tensor instead
  // (Watchdog::set_local_tensor_reader).
  TensorSubclass,
  // A parameter a front end proved finite instead of reading it (Watchdog::proven_finite), written
  // again before a report could read what its frame saw.
  ProvenThenWritten,
};

// Reads `t` once, in place (dense or strided views alike, never copied). Floating types
// (float64/32/16, bfloat16) give every count; integer and bool tensors give abs min/max and
// zeros, as HF shows them. Anything else returns why it was not read.
Readability compute(const at::Tensor& t, TensorStats& out);

// compute(), with a large floating tensor read by ATen's intra-op threads at once, each a
// contiguous part of its memory or, for a view with gaps, a range of its rows
// (src/stats/intraop_reads.cpp): where the model's ops run on every core, so do the reads of what
// they made. The same numbers as compute(). For the watching thread, in an op's callback; not for
// a thread of the watchdog's own (it would start a second team of threads beside ATen's).
// `threads_used`, when given, is set to the number of threads that read a part (1 when not split).
Readability compute_across_threads(const at::Tensor& t, TensorStats& out, int* threads_used = nullptr);

// compute() of each of `tensors` into out[i] and readability[i], the tensors split between
// ATen's intra-op threads in contiguous runs of about equal bytes (one op's list of tensors: a
// foreach or fused optimizer's). For the watching thread, as compute_across_threads.
// `threads_used`, when given, is set to the number of threads that read a part (1 when not split).
void compute_many(c10::ArrayRef<at::Tensor> tensors, TensorStats* out, Readability* readability,
                  int* threads_used = nullptr);

// The statistics of elements [begin, end) of a dense floating tensor, in memory order (its span,
// whatever its strides): one part of compute_across_threads' read.
void compute_dense_range(const at::Tensor& t, int64_t begin, int64_t end, TensorStats& out);

// A floating view with gaps (not non-overlapping and dense) read in parts: its rows in memory
// order (kernels::RowLayout, src/stats/tensor_walk.h), and the statistics of rows [begin, end).
int64_t gapped_rows(const at::Tensor& t);
void compute_gapped_rows(const at::Tensor& t, int64_t begin, int64_t end, TensorStats& out);

// Adds the statistics of a part of a tensor to those of the parts before it.
inline void merge_part(const TensorStats& part, TensorStats& total) {
  total.count += part.count;
  total.nan += part.nan;
  total.pos_inf += part.pos_inf;
  total.neg_inf += part.neg_inf;
  total.zeros += part.zeros;
  total.subnormal += part.subnormal;
  if (part.abs_min < total.abs_min) total.abs_min = part.abs_min;
  if (part.abs_max > total.abs_max) total.abs_max = part.abs_max;
}

// compute() and, for floating tensors, the statistics menu in the same read (moments.n stays 0
// for other dtypes).
Readability compute_with_moments(const at::Tensor& t, TensorStats& out, MomentsAccumulator& moments);

// Counts what fp16 and bf16 casts would overflow or flush; false for non-floating tensors.
bool compute_headroom(const at::Tensor& t, HeadroomCounts& out);

// Whether compute() would read `t` (before looking at its dtype), and if not why.
Readability compute_readability(const at::Tensor& t);
const char* describe(Readability r);
std::string dtype_name(c10::ScalarType t);

}  // namespace stats
}  // namespace sentinel

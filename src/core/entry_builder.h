#pragma once
// Builds the entries of a frame from tensors: statistics (through the per-batch cache), or
// statistics and FP8 probe in one read, and optional fp16/bf16 headroom.
#include <ATen/core/Tensor.h>

#include "fp8/fp8_monitor.h"
#include "frames/frame_record.h"
#include "frames/stats_cache.h"
#include "stats/tensor_stats.h"

namespace sentinel {
namespace core {

using frames::EntryRecord;
using frames::Role;
using frames::EntryState;
using frames::StatsCache;

inline EntryRecord make_entry(Role role, int index, int sub) {
  EntryRecord e;
  e.role = role;
  e.index = static_cast<int16_t>(index);
  e.sub_index = static_cast<int16_t>(sub);
  return e;
}

// A tensor's identity for the place rule: its storage (0 for tensors without one).
inline uintptr_t storage_key(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? reinterpret_cast<uintptr_t>(t.storage().unsafeGetStorageImpl()) : 0;
}

inline void set_readability(EntryRecord& e, const at::Tensor& t, stats::Readability r) {
  e.state = r == stats::Readability::Read ? EntryState::Read
            : r == stats::Readability::Undefined ? EntryState::None
                                                  : EntryState::Skipped;
  e.skip_reason = static_cast<uint8_t>(r);
  e.dtype = t.defined() ? static_cast<int8_t>(t.scalar_type()) : -1;
}

inline EntryRecord tensor_entry(StatsCache& cache, const at::Tensor& t, Role role, int index, int sub,
                                bool headroom = false, bool reuse = true) {
  EntryRecord e = make_entry(role, index, sub);
  if (headroom) e.has_headroom = stats::compute_headroom(t, e.headroom);
  set_readability(e, t, cache.compute(t, e.stats, reuse));
  return e;
}

// A GEMM operand of a selected layer: statistics and FP8 cast in one read.
inline EntryRecord plain_entry(EntryState state, Role role, int index, int sub) {
  EntryRecord e = make_entry(role, index, sub);
  e.state = state;
  return e;
}

}  // namespace core
}  // namespace sentinel

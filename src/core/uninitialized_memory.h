#pragma once
// Memory that holds no values yet: what an op of the `empty` family made (a preallocated buffer,
// FSDP2's all-gather output), tracked per storage until something writes it. Reading it would
// judge garbage (in PyTorch 2.x, NaN under torch.use_deterministic_algorithms), so its reads are
// labelled instead (stats::Readability::Uninitialized, PartlyWritten).
//
// Written means: its version counter moved (an in-place or out= op, through autograd's
// bookkeeping), an op declared writing it (a schema's `Tensor(a!)`), or a collective was handed it
// (c10d's writes bump no counter). A custom op that returns the memory without declaring a write
// (`fsdp::all_gather_copy_in` fills its rank's slice and returns views of the buffer) wrote an
// unknown part of it: partly written, not read until the next write of any of those kinds.
// docs/nonfinite.md says where this can be fooled.
#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "stats/tensor_stats.h"

namespace sentinel::core {

class UninitializedMemory {
 public:
  // `t` is the result of an op of the empty family.
  void made(const at::Tensor& t);
  // An op declared writing `t` (or a collective was handed it): its memory holds values now.
  void written(const at::Tensor& t);
  // An op returned `t`, in memory that was uninitialized, without declaring a write.
  void written_in_part(const at::Tensor& t);
  // Why `t` must not be read, if its memory holds no values yet (forgets memory written since).
  std::optional<stats::Readability> unreadable(const at::Tensor& t);
  bool tracks(const at::Tensor& t) const;
  bool empty() const { return by_storage_.empty(); }
  // Forgets the memory freed since (a storage made later at its address is new memory).
  void prune();

 private:
  struct Unwritten {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t version = -1;  // its tensors' version when last looked at; -1: none kept (inference tensors)
    stats::Readability why = stats::Readability::Uninitialized;
  };
  void note(const at::Tensor& t, stats::Readability why);
  std::unordered_map<uintptr_t, Unwritten> by_storage_;
};

}  // namespace sentinel::core

#pragma once
// Statistics of tensors already read in this batch. An op's output is usually the next op's
// input, and a weight serves its ops through views such as weight.t(): reading each block of
// memory once halves the sentinel's memory traffic.
//
// The key is the memory a tensor covers: a tensor that is non-overlapping and dense holds
// exactly the elements of [offset, offset + numel) of its storage, whatever its strides, so a
// transposed or reshaped view has the same statistics as its base. An entry is reused only while
// that memory provably holds the same values:
//  - a weak reference keeps the StorageImpl's memory, so its address cannot be taken by a new
//    storage while the entry lives (no false hit after a free);
//  - the version counter (shared by a tensor and its views, bumped by every in-place or out= op)
//    and the data pointer must be unchanged.
// Inference tensors (no version counter) and gapped views are read every time. Cleared at each
// batch start and end (but for the parameters' entries, if the user asks to keep them).
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <unordered_map>

#include "stats/tensor_stats.h"

namespace sentinel {
namespace core {

class StatsCache {
 public:
  // Returns the readability and fills `out`, reading the tensor only on a miss.
  stats::Readability compute(const at::Tensor& t, TensorStats& out) {
    if (!cacheable(t)) return stats::compute(t, out);
    const uint32_t version = version_of(t);
    stats::Readability r;
    if (lookup(t, version, out, r)) return r;
    r = stats::compute(t, out);
    insert(t, version, out, r);
    return r;
  }
  // Whether `t` can be served from the cache at all.
  static bool cacheable(const at::Tensor& t) {
    return t.defined() && !t.is_inference() && t.has_storage() && t.device().is_cpu() && !t.is_sparse() &&
           t.numel() > 0 && t.is_non_overlapping_and_dense();
  }
  // Of a cacheable tensor (inference tensors have no version counter).
  static uint32_t version_of(const at::Tensor& t) {
    return t.unsafeGetTensorImpl()->version_counter().current_version();
  }
  // A hit: the numbers of `t`'s memory, read earlier in this batch and provably unchanged.
  bool find(const at::Tensor& t, TensorStats& out, stats::Readability& r) {
    return cacheable(t) && lookup(t, version_of(t), out, r);
  }
  // Remembers what a read of `t` at `version` found; nothing if `t` has been written since.
  void store(const at::Tensor& t, uint32_t version, const TensorStats& stats, stats::Readability r) {
    if (cacheable(t) && version_of(t) == version) insert(t, version, stats, r);
  }
  void clear() { entries_.clear(); }
  // Drops every entry except those of the tensors tensor_of(item) for the items of `keep`
  // (parameters kept across batches, Options::reuse_unchanged_parameter_reads). A kept entry is
  // still checked against the tensor's data pointer and version counter when it is looked up.
  template <typename Range, typename TensorOf>
  void clear_except(const Range& keep, TensorOf tensor_of) {
    std::unordered_map<Key, Entry, KeyHash> kept;
    for (const auto& item : keep) {
      const at::Tensor& t = tensor_of(item);
      if (!cacheable(t)) continue;
      auto it = entries_.find(key_of(t));
      if (it != entries_.end()) kept.insert(*it);
    }
    entries_.swap(kept);
  }
  size_t hits() const { return hits_; }

 private:
  struct Key {
    const c10::StorageImpl* storage;
    int64_t offset;
    int64_t numel;
    c10::ScalarType dtype;
    bool operator==(const Key& o) const {
      return storage == o.storage && offset == o.offset && numel == o.numel && dtype == o.dtype;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      size_t h = std::hash<const void*>()(k.storage);
      h ^= std::hash<int64_t>()(k.offset) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      h ^= std::hash<int64_t>()(k.numel) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      return h ^ static_cast<size_t>(k.dtype);
    }
  };
  static Key key_of(const at::Tensor& t) {
    return Key{t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.numel(), t.scalar_type()};
  }
  // Of a cacheable tensor at `version`.
  bool lookup(const at::Tensor& t, uint32_t version, TensorStats& out, stats::Readability& r) {
    auto it = entries_.find(key_of(t));
    if (it == entries_.end() || it->second.version != version || it->second.data != t.storage().data()) return false;
    out = it->second.stats;
    r = it->second.readability;
    ++hits_;
    return true;
  }
  void insert(const at::Tensor& t, uint32_t version, const TensorStats& stats, stats::Readability r) {
    Entry e{c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()), version, t.storage().data(),
            stats, r};
    entries_.insert_or_assign(key_of(t), std::move(e));
  }
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> keep_address;
    uint32_t version;
    const void* data;
    TensorStats stats;
    stats::Readability readability;
  };
  std::unordered_map<Key, Entry, KeyHash> entries_;
  size_t hits_ = 0;
};

}  // namespace core
}  // namespace sentinel

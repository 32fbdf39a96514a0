#pragma once
// The memory a tensor covers, as a key for reads that can be reused (frames/stats_cache.h for the
// CPU, device/device_read_cache.h for tensors read on a device). A tensor that is
// non-overlapping and dense holds exactly the elements of [offset, offset + numel) of its
// storage, whatever its strides, so a transposed or reshaped view has the same statistics as its
// base. A read is reused only while that memory provably holds the same values:
//  - the version counter (shared by a tensor and its views, bumped by every in-place or out= op)
//    must be the same counter, at the same version, and the data pointer unchanged. A tensor
//    made by .data() or variable_data() shares the memory but has a counter of its own: its
//    writes bump that one, so the same version number from another counter is a miss;
//  - the entry holds the counter, so its address cannot be taken by a new tensor's counter: a
//    tensor made where a freed one was (its storage, its data at the same addresses) is a miss.
// Inference tensors (no version counter) and gapped or expanded views are never keyed.
//
// An entry whose tensor has died (it holds the counter's last reference) is dropped as the map
// grows: the counter is one of the small allocations made beside the tensor's own, and kept for
// the whole batch it would stand between the step's large freed buffers, keep malloc from joining
// them again, and leave the heap growing through the step and trimmed at its end, to be faulted in
// again by the next (docs/benchmarks.md, "Hugging Face's Trainer").
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace sentinel {
namespace frames {

// Whether `t`'s memory can key a reused read, wherever it lives.
inline bool keyed_memory(const at::Tensor& t) {
  return t.defined() && !t.is_inference() && t.has_storage() && !t.is_sparse() && t.numel() > 0 &&
         t.is_non_overlapping_and_dense();
}

// Of a keyed tensor (inference tensors have no version counter).
inline uint32_t version_of(const at::Tensor& t) { return t.unsafeGetTensorImpl()->version_counter().current_version(); }

struct MemoryKey {
  const c10::StorageImpl* storage;
  int64_t offset;
  int64_t numel;
  c10::ScalarType dtype;
  bool operator==(const MemoryKey& o) const {
    return storage == o.storage && offset == o.offset && numel == o.numel && dtype == o.dtype;
  }
};

struct MemoryKeyHash {
  size_t operator()(const MemoryKey& k) const {
    size_t h = std::hash<const void*>()(k.storage);
    h ^= std::hash<int64_t>()(k.offset) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= std::hash<int64_t>()(k.numel) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h ^ static_cast<size_t>(k.dtype);
  }
};

inline MemoryKey memory_key(const at::Tensor& t) {
  return MemoryKey{t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.numel(), t.scalar_type()};
}

// Which counter a VariableVersion refers to. LibTorch gives no accessor, but the class holds
// nothing except the pointer to its shared counter, so the pointer's bytes name the counter.
inline const void* counter_identity(const c10::VariableVersion& v) {
  static_assert(std::is_standard_layout<c10::VariableVersion>::value && sizeof(c10::VariableVersion) == sizeof(void*),
                "c10::VariableVersion is no longer one pointer to its counter");
  const void* counter = nullptr;
  std::memcpy(&counter, static_cast<const void*>(&v), sizeof counter);
  return counter;
}

// What a keyed read saw of its memory, to tell later whether that memory still holds it.
struct MemoryStamp {
  c10::VariableVersion counter;  // a copy shares the counter, and keeps its address taken
  uint32_t version;
  const void* data;

  static MemoryStamp of(const at::Tensor& t, uint32_t version) {
    return MemoryStamp{t.unsafeGetTensorImpl()->version_counter(), version, t.storage().data()};
  }
  bool holds(const at::Tensor& t, uint32_t current_version) const {
    return version == current_version && data == t.storage().data() &&
           counter_identity(counter) == counter_identity(t.unsafeGetTensorImpl()->version_counter());
  }
};

// Values by the memory they were read from: a value is found only while its memory still holds
// what it held when the value was stored.
template <typename Value>
class MemoryMap {
 public:
  // Of a keyed tensor at its current `version`.
  Value* find(const at::Tensor& t, uint32_t version) {
    auto it = entries_.find(memory_key(t));
    return it == entries_.end() || !it->second.stamp.holds(t, version) ? nullptr : &it->second.value;
  }
  // The stored value stays at the returned address until it is erased (by clear, clear_except
  // or keep_if, drop_dead_tensors_when_due); storing again for the same memory overwrites it there.
  Value* insert(const at::Tensor& t, uint32_t version, Value value) {
    ++inserts_since_sweep_;
    auto it = entries_.insert_or_assign(memory_key(t), Entry{MemoryStamp::of(t, version), std::move(value)}).first;
    return &it->second.value;
  }
  void clear() {
    entries_.clear();
    inserts_since_sweep_ = 0;
  }
  // Drops every value except those of the keyed tensors tensor_of(item), items of `keep`.
  template <typename Range, typename TensorOf>
  void clear_except(const Range& keep, TensorOf tensor_of) {
    Entries kept;
    for (const auto& item : keep) {
      const at::Tensor& t = tensor_of(item);
      if (!keyed_memory(t)) continue;
      auto it = entries_.find(memory_key(t));
      if (it != entries_.end()) kept.insert(*it);
    }
    entries_.swap(kept);
  }
  // Erases the values of memory in any of `storages` (sorted).
  void erase_storages(const std::vector<const c10::StorageImpl*>& storages) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      const bool written = std::binary_search(storages.begin(), storages.end(), it->first.storage);
      it = written ? entries_.erase(it) : std::next(it);
    }
  }
  // Calls f(value) for each value of memory in any of `storages` (sorted), erasing nothing.
  template <typename F>
  void visit_storages(const std::vector<const c10::StorageImpl*>& storages, F f) {
    for (auto& [key, entry] : entries_) {
      if (std::binary_search(storages.begin(), storages.end(), key.storage)) f(entry.value);
    }
  }
  // Calls f(value) for each value; erases it where f returns false.
  template <typename F>
  void keep_if(F f) {
    for (auto it = entries_.begin(); it != entries_.end();) it = f(it->second.value) ? std::next(it) : entries_.erase(it);
  }

  // Erases the entries of tensors that have died (the entry alone holds their counter: no tensor
  // can hold that memory's values any more), once every size/8 inserts: a constant cost per
  // insert, and a dead tensor's entry lives for a few ops, not the batch. Erases values: not while
  // the caller holds the address of one.
  void drop_dead_tensors_when_due() {
    if (inserts_since_sweep_ < std::max<size_t>(kMinSweepInterval, entries_.size() / 8)) return;
    inserts_since_sweep_ = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.stamp.counter.unique() ? entries_.erase(it) : std::next(it);
    }
  }
  size_t size() const { return entries_.size(); }

 private:
  static constexpr size_t kMinSweepInterval = 16;
  struct Entry {
    MemoryStamp stamp;
    Value value;
  };
  using Entries = std::unordered_map<MemoryKey, Entry, MemoryKeyHash>;
  Entries entries_;
  size_t inserts_since_sweep_ = 0;
};

}  // namespace frames
}  // namespace sentinel

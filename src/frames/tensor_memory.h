#pragma once
// The memory a tensor covers, as a key for reads that can be reused (frames/stats_cache.h for the
// CPU, device/device_read_cache.h for tensors read on a device). A tensor that is
// non-overlapping and dense holds exactly the elements of [offset, offset + numel) of its
// storage, whatever its strides, so a transposed or reshaped view has the same statistics as its
// base. A read is reused only while that memory provably holds the same values:
//  - a weak reference keeps the StorageImpl allocated (not its data), so its address cannot be
//    taken by a new storage while the entry lives (no false hit after a free);
//  - the version counter (shared by a tensor and its views, bumped by every in-place or out= op)
//    must be the same counter, at the same version, and the data pointer unchanged. A tensor
//    made by .data() or variable_data() shares the memory but has a counter of its own: its
//    writes bump that one, so the same version number from another counter is a miss.
// Inference tensors (no version counter) and gapped or expanded views are never keyed.
#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <unordered_map>

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
  c10::weak_intrusive_ptr<c10::StorageImpl> keep_address;
  c10::VariableVersion counter;  // a copy shares the counter, and keeps its address taken
  uint32_t version;
  const void* data;

  static MemoryStamp of(const at::Tensor& t, uint32_t version) {
    return MemoryStamp{c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()),
                       t.unsafeGetTensorImpl()->version_counter(), version, t.storage().data()};
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
  // or keep_if); storing again for the same memory overwrites it there.
  Value* insert(const at::Tensor& t, uint32_t version, Value value) {
    auto it = entries_.insert_or_assign(memory_key(t), Entry{MemoryStamp::of(t, version), std::move(value)}).first;
    return &it->second.value;
  }
  void clear() { entries_.clear(); }
  // Drops every value except those of the keyed tensors tensor_of(item), items of `keep`.
  template <typename Range, typename TensorOf>
  void clear_except(const Range& keep, TensorOf tensor_of) {
    std::unordered_map<MemoryKey, Entry, MemoryKeyHash> kept;
    for (const auto& item : keep) {
      const at::Tensor& t = tensor_of(item);
      if (!keyed_memory(t)) continue;
      auto it = entries_.find(memory_key(t));
      if (it != entries_.end()) kept.insert(*it);
    }
    entries_.swap(kept);
  }
  // Calls f(value) for each value; erases it where f returns false.
  template <typename F>
  void keep_if(F f) {
    for (auto it = entries_.begin(); it != entries_.end();) it = f(it->second.value) ? std::next(it) : entries_.erase(it);
  }

 private:
  struct Entry {
    MemoryStamp stamp;
    Value value;
  };
  std::unordered_map<MemoryKey, Entry, MemoryKeyHash> entries_;
};

}  // namespace frames
}  // namespace sentinel

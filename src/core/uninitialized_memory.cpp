#include "core/uninitialized_memory.h"

#include "core/entry_builder.h"

namespace sentinel::core {
namespace {

// Inference tensors keep no version counter: only declared writes tell.
int64_t version_of(const at::Tensor& t) { return t.is_inference() ? -1 : static_cast<int64_t>(t._version()); }

}  // namespace

void UninitializedMemory::note(const at::Tensor& t, stats::Readability why) {
  const uintptr_t k = storage_key(t);
  if (k == 0 || t.storage().nbytes() == 0) return;
  by_storage_.insert_or_assign(k, Unwritten{t.storage().getWeakStorageImpl(), version_of(t), why});
}

void UninitializedMemory::made(const at::Tensor& t) { note(t, stats::Readability::Uninitialized); }

void UninitializedMemory::written_in_part(const at::Tensor& t) {
  if (tracks(t)) note(t, stats::Readability::PartlyWritten);
}

void UninitializedMemory::written(const at::Tensor& t) {
  if (!by_storage_.empty()) by_storage_.erase(storage_key(t));
}

bool UninitializedMemory::tracks(const at::Tensor& t) const {
  if (by_storage_.empty()) return false;
  const auto it = by_storage_.find(storage_key(t));
  return it != by_storage_.end() && !it->second.storage.expired();
}

std::optional<stats::Readability> UninitializedMemory::unreadable(const at::Tensor& t) {
  const auto it = by_storage_.find(storage_key(t));
  if (it == by_storage_.end()) return std::nullopt;
  const Unwritten& u = it->second;
  // A storage freed and made again at the same address is new memory: judged as any other.
  c10::intrusive_ptr<c10::StorageImpl> live = u.storage.lock();
  if (!live || live.get() != t.storage().unsafeGetStorageImpl() ||
      (u.version >= 0 && !t.is_inference() && static_cast<int64_t>(t._version()) != u.version)) {
    by_storage_.erase(it);
    return std::nullopt;
  }
  return u.why;
}

void UninitializedMemory::prune() {
  for (auto it = by_storage_.begin(); it != by_storage_.end();) {
    it = it->second.storage.expired() ? by_storage_.erase(it) : std::next(it);
  }
}

}  // namespace sentinel::core

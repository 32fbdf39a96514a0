// Entries read where their tensors live (src/core/entry_reader.h picks the reader), and the
// read-back that resolves the frames waiting for a device's numbers, in order.
#include <ATen/core/Tensor.h>

#include <limits>

#include "core/entry_builder.h"
#include "core/read_faults.h"
#include "core/watchdog_impl.h"

namespace sentinel {

using frames::EntryRecord;
using frames::FrameRecord;
using frames::Role;

EntryRecord Watchdog::Impl::read_entry(FrameRecord& f, const at::Tensor& t, Role role, int index, int sub,
                                       bool headroom, const GemmOperand* gemm, bool reuse_reads) {
  core::testing::maybe_fail_read();
  if (t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) {
    // A tensor subclass (a DTensor): its own memory is not its elements; its local tensor is.
    const at::Tensor local = local_tensor_of ? local_tensor_of(t) : at::Tensor();
    if (local.defined() && !local.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) {
      return read_entry(f, local, role, index, sub, headroom, gemm, reuse_reads);
    }
    EntryRecord e = core::make_entry(role, index, sub);
    core::set_readability(e, t, stats::Readability::TensorSubclass);
    e.storage = core::storage_key(t);
    return e;
  }
  if (!uninitialized.empty()) {
    // Memory that holds no values yet: its bits are not the model's numbers.
    if (const auto why = uninitialized.unreadable(t)) {
      EntryRecord e = core::make_entry(role, index, sub);
      core::set_readability(e, t, *why);
      e.storage = core::storage_key(t);
      return e;
    }
  }
  const core::ReadRequest request{role, index, sub, headroom, gemm, reuse_reads && reads_reusable()};
  EntryRecord e = readers.pick(f, t, request).read(f, t, request);
  e.storage = core::storage_key(t);
  if (keeping_magnitudes || loop_ops_watched) keep_magnitude(t, e);
  return e;
}

void Watchdog::Impl::keep_magnitude(const at::Tensor& t, const EntryRecord& e) {
  if (!t.defined() || t.is_inference()) return;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  // A read on a device comes back later: until then nothing is known of the values.
  if (e.state != frames::EntryState::Read || e.pending_slot >= 0 || e.stats.count != t.numel()) {
    read_magnitudes.erase(impl);
    return;
  }
  const double abs_max = e.stats.finite() ? e.stats.abs_max : std::numeric_limits<double>::infinity();
  keep_magnitude_of(t, abs_max, /*proof=*/0);
}

void Watchdog::Impl::keep_magnitude_of(const at::Tensor& t, double abs_max, uint32_t proof) {
  // Tensors freed since are dropped once the map has doubled: gradients are new tensors each step.
  if (read_magnitudes.size() >= 2 * read_magnitudes_kept + 256) {
    for (auto it = read_magnitudes.begin(); it != read_magnitudes.end();) {
      it = it->second.tensor.expired() ? read_magnitudes.erase(it) : std::next(it);
    }
    read_magnitudes_kept = read_magnitudes.size();
  }
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  read_magnitudes.insert_or_assign(
      impl, ReadMagnitude{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
                          impl->version_counter().current_version(), abs_max, proof});
}

core::HeldLaunches Watchdog::Impl::read_ahead(c10::ArrayRef<at::Tensor> tensors) {
  if (tensors.size() < 2) return core::HeldLaunches(nullptr, tensors);
  // (Inside compiled code nothing read earlier is reused: reads_reusable.)
  if (reads_reusable()) readers.cpu.cache().read_ahead(tensors);
  return core::HeldLaunches(&readers.device, tensors);
}

void Watchdog::Impl::resolve_deferred(std::unique_lock<std::mutex>& lock, bool last_is_current) {
  if (!lock.owns_lock()) lock.lock();
  core::DeviceReader& reader = readers.device;
  device::StatsDevice* dev = reader.device();
  device::DeferredFrames& deferred = reader.deferred();
  if (!dev || deferred.empty() || dev->capturing()) return;  // nothing may wait inside a capture
  if (reader.failed()) {  // said when it failed; what an op in flight then had started is lost too
    drop_deferred();
    return;
  }
  const int64_t syncs_before = dev->synchronisations();
  const int64_t first_slot = deferred.first_unread_slot(), end_slot = deferred.next_slot();
  // The frames of the last batch's read-back lend their memory (a read-back while these are
  // processed, if any, allocates its own).
  std::vector<FrameRecord> frames;
  frames.swap(resolved_frames);
  try {
    deferred.resolve(
        *dev,
        [&](const device::PendingProbe& p, const device::SlotResult& r) {
          observers.fp8().add_result(p.place, p.role, r.stats, r.probe);
          observers.fp8().add_recipe_results(p.place, p.role, r.recipes);
        },
        frames);
  } catch (const std::exception& error) {
    // A device that cannot be read back (a sticky CUDA error, such as a device-side assert in the
    // model) fails every later read as well. The watchdog says so and reads it no more, so that
    // what reaches the user is the model's own error, not one thrown from the watchdog.
    reader.fail();
    opts.output() << "sentinel: reading the numbers back from the device failed (" << error.what() << "): the "
                  << deferred.size() << " frames waiting for them are not checked, and "
                  << "tensors on the device are no longer read\n"
                  << std::flush;
    drop_deferred();
    return;
  }
  reader.reads().read_back(*dev, first_slot, end_slot);
  device_counters.readbacks += dev->synchronisations() - syncs_before;
  for (size_t i = 0; i < frames.size() && !delivery.stopped(); ++i) {  // after a trip that stops the run: no more
    detecting_late = !(last_is_current && i + 1 == frames.size());
    process_frame(frames[i], lock);
    if (!lock.owns_lock()) lock.lock();
  }
  detecting_late = false;
  // Kept, frames and all, for the next read-back to write over (DeferredFrames::push).
  if (frames.capacity() > resolved_frames.capacity()) resolved_frames.swap(frames);
}

void Watchdog::Impl::drop_deferred() {
  readers.device.deferred().drop();
  readers.device.reads().drop_in_flight();
}

DeviceCounters Watchdog::device_counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->device_counters;
}

}  // namespace sentinel

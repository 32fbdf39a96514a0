// Tensors read where they live: entries of device tensors are reduced there without waiting, and
// their frames wait in `deferred` until one read-back fills them (src/device/).
#include <ATen/core/Tensor.h>

#include <algorithm>

#include "core/entry_builder.h"
#include "core/read_faults.h"
#include "stats/tensor_stats.h"
#include "core/watchdog_impl.h"

namespace sentinel {

using frames::EntryRecord;
using frames::FrameRecord;
using frames::Role;

namespace {

// Slots one read-back can cover: every entry of the frames a read-back waits for, twice over.
int64_t ring_capacity(const Options& o) {
  return std::min<int64_t>(int64_t{1} << 20, 2 * (frames::FrameRecord::kMaxEntries + 2) * o.device_readback_frames() + 1024);
}

}  // namespace

device::StatsDevice* Watchdog::Impl::device_for(const at::Tensor& t) {
  if (!t.defined() || device_failed) return nullptr;
  if (!device_tried) {
    if (auto factory = device::device_factory_for_testing()) {
      device_tried = true;
      device = factory(ring_capacity(opts));
    } else if (t.is_cuda() && opts.watch_cuda()) {
      device_tried = true;
      std::string why;
      device = device::make_cuda_device(ring_capacity(opts), &why);
      if (!device) opts.output() << "sentinel: CUDA tensors are not read: " << why << "\n" << std::flush;
    }
  }
  return device && device->owns(t) ? device.get() : nullptr;
}

EntryRecord Watchdog::Impl::read_entry(FrameRecord& f, const at::Tensor& t, Role role, int index, int sub,
                                       bool headroom, const GemmOperand* gemm, bool reuse_reads) {
  core::testing::maybe_fail_read();
  device::StatsDevice* dev = device_for(t);
  if (!dev) {
    if (gemm && t.defined()) {
      // One read: the statistics, the FP8 probe of the slot and the collections' menu.
      EntryRecord e = core::make_entry(role, index, -1);
      stats::MomentsAccumulator moments;
      stats::MomentsAccumulator* menu = gemm->collect ? &moments : nullptr;
      // A gradient's blocks follow the forward GEMM its autograd node differentiates.
      const uint32_t gemm_op = gemm->role == fp8::Role::Gradient ? f.forward_op : f.op;
      static const std::string kNoOp;
      const std::string& op_name = fp8.other_recipes() ? strings.at(gemm_op) : kNoOp;  // no copy
      const stats::Readability r = gemm->probe
                                       ? fp8.probe(t, f.place, gemm->role, f.batch_number, places, e.stats, menu, op_name, index)
                                       : stats::compute_with_moments(t, e.stats, moments);
      core::set_readability(e, t, r);
      if (gemm->collect && moments.n > 0) {
        collector.add(f.place, gemm->role, f.batch_number, moments);
        if (collector.wants_tensor(f.batch_number, f.place, gemm->role, places)) {
          collector.add_tensor(f.place, gemm->role, f.batch_number, t, places, opts.output());
        }
      }
      return e;
    }
    if (reading_inputs_beside && role != Role::Output && !headroom && f.has_room(role) &&
        overlap::worth_reading_beside(t)) {
      if (!side_reader) side_reader = std::make_unique<overlap::SideReader>();
      if (side_reader->can_post(&f)) {
        EntryRecord e = core::make_entry(role, index, sub);
        stats::Readability r;
        if (stats_cache.find(t, e.stats, r)) {
          core::set_readability(e, t, r);
          return e;
        }
        core::set_readability(e, t, stats::Readability::Read);
        const uint32_t version = frames::StatsCache::cacheable(t) ? frames::StatsCache::version_of(t) : 0;
        side_reader->post(&f, t, version, f.entry_count);  // the entry's index once added
        ++device_counters.tensors_read_beside_ops;
        return e;
      }
    }
    return core::tensor_entry(stats_cache, t, role, index, sub, headroom, reuse_reads);
  }
  if (gemm && gemm->collect && !warned_device_collect) {
    warned_device_collect = true;
    opts.output() << "sentinel: statistics collections read CPU tensors only; " << t.device().str()
                  << " tensors are left out of them\n"
                  << std::flush;
  }
  if (gemm && gemm->probe && fp8.other_recipes() && !dev->replays_recipes() && !warned_device_recipes) {
    warned_device_recipes = true;
    opts.output() << "sentinel: the fp8 recipes current, mxfp8, nvfp4 and float8block are not replayed on "
                  << t.device().str() << " yet: delayed scaling alone is\n"
                  << std::flush;
  }
  const fp8::Role* fp8_role = gemm && gemm->probe ? &gemm->role : nullptr;
  EntryRecord e = core::make_entry(role, index, sub);
  stats::Readability r = dev->readability(t);
  if (r == stats::Readability::Read && dev->capturing()) r = stats::Readability::CapturedInGraph;
  core::set_readability(e, t, r);
  if (r != stats::Readability::Read) {
    ++device_counters.tensors_skipped_on_device;
    return e;
  }
  const bool own_slot = f.has_room(role);
  if (own_slot && !fp8_role && reuse_reads) {  // a probed operand is read under its own scale
    if (const device::DeviceReadCache::Read* earlier = device_reads.find(t, headroom)) {
      ++device_counters.device_reads_reused;
      e.has_headroom = headroom;
      if (earlier->slot >= 0) {
        e.pending_slot = earlier->slot;
        f.pending = true;
      } else {
        e.stats = earlier->stats;
        if (headroom) e.headroom = earlier->headroom_counts;
      }
      return e;
    }
  }
  device::Request request;
  request.headroom = headroom;
  int64_t slot;
  if (own_slot) {
    slot = e.pending_slot = deferred.take_slot();
  } else {
    // No room to show it: it shares its role's slot, which still tells whether it was finite.
    int64_t& shared = f.omitted_slot[role == Role::Output ? 1 : 0];
    request.accumulate = shared >= 0;
    request.shared_slot = true;
    if (shared < 0) shared = deferred.take_slot();
    slot = shared;
  }
  const auto dtype = t.scalar_type();
  if (fp8_role && (dtype == c10::kFloat || dtype == c10::kHalf || dtype == c10::kBFloat16)) {
    const auto target = fp8.target(f.place, *fp8_role, f.batch_number, places);
    request.probe = target.params;
    request.probe_scale = target.scale;
    request.probe_format = target.format;
    deferred.note_probe(device::PendingProbe{slot, f.place, *fp8_role});
    if (fp8.other_recipes() && dev->replays_recipes()) {
      // A gradient's blocks follow the forward GEMM its autograd node differentiates.
      const uint32_t gemm_op = *fp8_role == fp8::Role::Gradient ? f.forward_op : f.op;
      recipe_jobs = fp8.recipe_jobs(*fp8_role, strings.at(gemm_op), index, t.dim());
      request.recipes = &recipe_jobs;
    }
  }
  try {
    dev->enqueue(t, slot, request);
  } catch (const std::exception& error) {
    // The model's own op must not fail because its statistics could not be started.
    opts.output() << error.what() << " (the tensor is skipped)\n" << std::flush;
    e.pending_slot = -1;
    core::set_readability(e, t, stats::Readability::NotOnCpu);
    ++device_counters.tensors_skipped_on_device;
    return e;
  }
  if (own_slot) device_reads.started(t, slot, headroom);
  e.has_headroom = headroom;
  f.pending = true;
  ++device_counters.tensors_read_on_device;
  return e;
}

void Watchdog::Impl::collect_side_reads(FrameRecord& f) {
  if (!side_reader || !side_reader->has_reads_for(&f)) return;
  side_reader->collect(&f, [&](const overlap::SideReader::Read& r) {
    EntryRecord& e = f.entries[r.entry];
    if (r.failed) {
      core::set_readability(e, r.tensor, stats_cache.compute(r.tensor, e.stats));
    } else {
      e.stats = r.stats;
      core::set_readability(e, r.tensor, r.readability);
      stats_cache.store(r.tensor, r.version, r.stats, r.readability);
    }
    if (!e.stats.finite()) f.inputs_finite = false;
  });
}

void Watchdog::Impl::resolve_deferred(std::unique_lock<std::mutex>& lock, bool last_is_current) {
  if (!lock.owns_lock()) lock.lock();
  if (!device || deferred.empty() || device->capturing()) return;  // nothing may wait inside a capture
  if (device_failed) {  // said when it failed; what an op in flight then had started is lost too
    drop_deferred();
    return;
  }
  const int64_t syncs_before = device->synchronisations();
  const int64_t first_slot = deferred.first_unread_slot(), end_slot = deferred.next_slot();
  std::vector<FrameRecord> frames;
  try {
    frames = deferred.resolve(*device, [&](const device::PendingProbe& p, const device::SlotResult& r) {
      fp8.add_result(p.place, p.role, r.stats, r.probe);
      fp8.add_recipe_results(p.place, p.role, r.recipes);
    });
  } catch (const std::exception& error) {
    // A device that cannot be read back (a sticky CUDA error, such as a device-side assert in the
    // model) fails every later read as well. The watchdog says so and reads it no more, so that
    // what reaches the user is the model's own error, not one thrown from the watchdog.
    device_failed = true;
    opts.output() << "sentinel: reading the numbers back from the device failed (" << error.what() << "): the "
                  << deferred.size() << " frames waiting for them are not checked, and "
                  << "tensors on the device are no longer read\n"
                  << std::flush;
    drop_deferred();
    return;
  }
  device_reads.read_back(*device, first_slot, end_slot);
  device_counters.readbacks += device->synchronisations() - syncs_before;
  for (size_t i = 0; i < frames.size() && !delivery.stopped(); ++i) {  // after a trip that stops the run: no more
    detecting_late = !(last_is_current && i + 1 == frames.size());
    process_frame(frames[i], lock);
    if (!lock.owns_lock()) lock.lock();
  }
  detecting_late = false;
}

void Watchdog::Impl::drop_deferred() {
  deferred.drop();
  device_reads.drop_in_flight();
}

DeviceCounters Watchdog::device_counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->device_counters;
}

}  // namespace sentinel

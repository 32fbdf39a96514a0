#include "core/entry_reader.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <ostream>
#include <string>

#include "core/entry_builder.h"
#include "stats/tensor_stats.h"

namespace sentinel::core {

using frames::EntryRecord;
using frames::FrameRecord;
using frames::Role;

namespace {

// Slots one read-back can cover: every entry of the frames a read-back waits for, twice over.
int64_t ring_capacity(const Options& o) {
  return std::min<int64_t>(int64_t{1} << 20, 2 * (FrameRecord::kMaxEntries + 2) * o.device_readback_frames() + 1024);
}

// A gradient's blocks follow the forward GEMM its autograd node differentiates.
uint32_t gemm_op_of(const FrameRecord& f, fp8::Role role) { return role == fp8::Role::Gradient ? f.forward_op : f.op; }

}  // namespace

EntryRecord CpuReader::read(FrameRecord& f, const at::Tensor& t, const ReadRequest& r) {
  if (!r.gemm || !t.defined()) return tensor_entry(cache_, t, r.role, r.index, r.sub, r.headroom, r.reuse_reads);
  // One read: the statistics, the FP8 probe of the slot and the collections' menu.
  const GemmOperand& gemm = *r.gemm;
  EntryRecord e = make_entry(r.role, r.index, -1);
  stats::MomentsAccumulator moments;
  stats::MomentsAccumulator* menu = gemm.collect ? &moments : nullptr;
  Fp8Monitor& fp8 = ctx_.observers.fp8();
  static const std::string kNoOp;
  const std::string& op_name = fp8.other_recipes() ? ctx_.strings.at(gemm_op_of(f, gemm.role)) : kNoOp;  // no copy
  const stats::Readability readability =
      gemm.probe ? fp8.probe(t, f.place, gemm.role, f.batch_number, ctx_.places, e.stats, menu, op_name, r.index)
                 : stats::compute_with_moments(t, e.stats, moments);
  set_readability(e, t, readability);
  collect::StatsCollector& collector = ctx_.observers.collector();
  if (gemm.collect && moments.n > 0) {
    collector.add(f.place, gemm.role, f.batch_number, moments);
    if (collector.wants_tensor(f.batch_number, f.place, gemm.role, ctx_.places)) {
      collector.add_tensor(f.place, gemm.role, f.batch_number, t, ctx_.places, ctx_.opts.output());
    }
  }
  return e;
}

bool BesideReader::takes(const FrameRecord& f, const at::Tensor& t, const ReadRequest& r) const {
  return active_ && !r.gemm && r.role != Role::Output && !r.headroom && f.has_room(r.role) &&
         overlap::worth_reading_beside(t);
}

EntryRecord BesideReader::read(FrameRecord& f, const at::Tensor& t, const ReadRequest& r) {
  if (!side_) side_ = std::make_unique<overlap::SideReader>();
  if (!side_->can_post(&f)) return cpu_.read(f, t, r);
  EntryRecord e = make_entry(r.role, r.index, r.sub);
  stats::Readability readability;
  if (cpu_.cache().find(t, e.stats, readability)) {
    set_readability(e, t, readability);
    return e;
  }
  set_readability(e, t, stats::Readability::Read);
  const uint32_t version = frames::StatsCache::cacheable(t) ? frames::StatsCache::version_of(t) : 0;
  side_->post(&f, t, version, f.entry_count);  // the entry's index once added
  ++ctx_.counters.tensors_read_beside_ops;
  return e;
}

void BesideReader::start(FrameRecord& f) {
  if (side_) side_->start(&f);
}

void BesideReader::collect(FrameRecord& f) {
  if (!side_ || !side_->has_reads_for(&f)) return;
  side_->collect(&f, [&](const overlap::SideReader::Read& r) {
    EntryRecord& e = f.entries[r.entry];
    if (r.failed) {
      set_readability(e, r.tensor, cpu_.cache().compute(r.tensor, e.stats));
    } else {
      e.stats = r.stats;
      set_readability(e, r.tensor, r.readability);
      cpu_.cache().store(r.tensor, r.version, r.stats, r.readability);
    }
    if (!e.stats.finite()) f.inputs_finite = false;
  });
}

device::StatsDevice* DeviceReader::owner_of(const at::Tensor& t) {
  if (!t.defined() || failed_) return nullptr;
  if (!tried_) {
    if (auto factory = device::device_factory_for_testing()) {
      tried_ = true;
      device_ = factory(ring_capacity(ctx_.opts));
    } else if (t.is_cuda() && ctx_.opts.watch_cuda()) {
      tried_ = true;
      std::string why;
      device_ = device::make_cuda_device(ring_capacity(ctx_.opts), &why);
      if (!device_) ctx_.opts.output() << "sentinel: CUDA tensors are not read: " << why << "\n" << std::flush;
    }
  }
  return device_ && device_->owns(t) ? device_.get() : nullptr;
}

EntryRecord DeviceReader::read(FrameRecord& f, const at::Tensor& t, const ReadRequest& r) {
  device::StatsDevice& dev = *device_;  // owner_of(t) chose this reader
  Fp8Monitor& fp8 = ctx_.observers.fp8();
  std::ostream& out = ctx_.opts.output();
  if (r.gemm && r.gemm->collect && !warned_collect_) {
    warned_collect_ = true;
    out << "sentinel: statistics collections read CPU tensors only; " << t.device().str()
        << " tensors are left out of them\n"
        << std::flush;
  }
  if (r.gemm && r.gemm->probe && fp8.other_recipes() && !dev.replays_recipes() && !warned_recipes_) {
    warned_recipes_ = true;
    out << "sentinel: the fp8 recipes current, mxfp8, nvfp4 and float8block are not replayed on " << t.device().str()
        << " yet: delayed scaling alone is\n"
        << std::flush;
  }
  const fp8::Role* fp8_role = r.gemm && r.gemm->probe ? &r.gemm->role : nullptr;
  EntryRecord e = make_entry(r.role, r.index, r.sub);
  stats::Readability readability = dev.readability(t);
  if (readability == stats::Readability::Read) {
    if (f.device_capturing < 0) f.device_capturing = dev.capturing() ? 1 : 0;
    if (f.device_capturing == 1) readability = stats::Readability::CapturedInGraph;
  }
  set_readability(e, t, readability);
  if (readability != stats::Readability::Read) {
    ++ctx_.counters.tensors_skipped_on_device;
    return e;
  }
  const bool own_slot = f.has_room(r.role);
  if (own_slot && !fp8_role && r.reuse_reads) {  // a probed operand is read under its own scale
    if (const device::DeviceReadCache::Read* earlier = reads_.find(t, r.headroom)) {
      ++ctx_.counters.device_reads_reused;
      e.has_headroom = r.headroom;
      if (earlier->slot >= 0) {
        e.pending_slot = earlier->slot;
        f.pending = true;
      } else {
        e.stats = earlier->stats;
        if (r.headroom) e.headroom = earlier->headroom_counts;
      }
      return e;
    }
  }
  device::Request request;
  request.headroom = r.headroom;
  int64_t slot;
  if (own_slot) {
    slot = e.pending_slot = deferred_.take_slot();
  } else {
    // No room to show it: it shares its role's slot, which still tells whether it was finite.
    int64_t& shared = f.omitted_slot[r.role == Role::Output ? 1 : 0];
    request.accumulate = shared >= 0;
    request.shared_slot = true;
    if (shared < 0) shared = deferred_.take_slot();
    slot = shared;
  }
  const auto dtype = t.scalar_type();
  if (fp8_role && (dtype == c10::kFloat || dtype == c10::kHalf || dtype == c10::kBFloat16)) {
    const auto target = fp8.target(f.place, *fp8_role, f.batch_number, ctx_.places);
    request.probe = target.params;
    request.probe_scale = target.scale;
    request.probe_format = target.format;
    deferred_.note_probe(device::PendingProbe{slot, f.place, *fp8_role});
    if (fp8.other_recipes() && dev.replays_recipes()) {
      recipe_jobs_ = fp8.recipe_jobs(*fp8_role, ctx_.strings.at(gemm_op_of(f, *fp8_role)), r.index, t.dim());
      request.recipes = &recipe_jobs_;
    }
  }
  try {
    dev.enqueue(t, slot, request);
  } catch (const std::exception& error) {
    // The model's own op must not fail because its statistics could not be started.
    out << error.what() << " (the tensor is skipped)\n" << std::flush;
    e.pending_slot = -1;
    set_readability(e, t, stats::Readability::NotOnCpu);
    ++ctx_.counters.tensors_skipped_on_device;
    return e;
  }
  if (own_slot) reads_.started(t, slot, r.headroom);
  e.has_headroom = r.headroom;
  f.pending = true;
  ++ctx_.counters.tensors_read_on_device;
  return e;
}

void DeviceReader::hold_launches(c10::ArrayRef<at::Tensor> tensors) {
  if (failed_ || holding_) return;
  // The device is made at the first tensor it owns: the list's may be the first of the run.
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (owner_of(t)) {
      device_->hold_launches();
      holding_ = true;
    }
    return;  // a list's tensors share one device
  }
}

void DeviceReader::release_launches() noexcept {
  if (!holding_) return;
  holding_ = false;
  try {
    device_->release_launches();
  } catch (const std::exception& error) {
    failed_ = true;
    try {
      ctx_.opts.output() << error.what() << ": the tensors of a list read together on the device are not checked, "
                         << "and tensors on the device are no longer read\n"
                         << std::flush;
    } catch (...) {
    }
  }
}

}  // namespace sentinel::core

// The watchdog among many ranks: the exchanges at its safe points, and carrying out what an
// agreement asks (src/core/rank_glue.h weighs it).
#include "capture/op_call.h"

#include "core/watchdog_impl.h"
#include "report/report_files.h"

namespace sentinel {

void Watchdog::Impl::stamp(Report& report) {
  ranks.stamp(report);
  report.phase = phase;
}

void Watchdog::Impl::exchange_ranks(ranks::Phase phase) {
  if (!ranks.session().exchanging()) return;
  // May run inside a RecordFunction callback (the end of a TorchScript forward): a channel's
  // own tensors (a process group's all-gather) are not the model's ops.
  capture::NotRecorded not_recorded;
  int64_t batch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch = batches.current();
  }
  // Without the lock: this waits for the other ranks.
  const auto agreement = ranks.session().exchange(batch, phase);
  if (!agreement) return;
  std::unique_lock<std::mutex> lock(mutex);
  act_on_agreement(*agreement, lock);
}

void Watchdog::Impl::announce_trip() {
  if (!ranks.session().untold_trip()) return;
  capture::NotRecorded not_recorded;
  int64_t batch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch = batches.current();
  }
  const auto agreement = ranks.session().announce(batch);
  if (!agreement) return;
  std::unique_lock<std::mutex> lock(mutex);
  act_on_agreement(*agreement, lock);
}

void Watchdog::Impl::act_on_agreement(const RankAgreement& agreed, std::unique_lock<std::mutex>& lock) {
  using Kind = core::RankGlue::Outcome::Kind;
  std::ostream& out = opts.output();
  const auto& written = delivery.last_report();
  const auto outcome =
      ranks.weigh(agreed, written && written->kind == "nonfinite", delivery.pending_is_report());
  switch (outcome.kind) {
    case Kind::Nothing:
      return;
    case Kind::Say:
      out << outcome.line << std::flush;
      return;
    case Kind::Amend: {
      // This rank's report is written: it gains what the others said, in place and in its files.
      const auto amended = delivery.amend_last_report(outcome.agreement);
      lock.unlock();
      // With Action::Callback nothing is printed; last_report() has the completed report.
      if (opts.action() != Action::Callback) out << render_ranks_text(amended->first) << std::flush;
      if (!delivery.files_dir().empty()) {
        const std::string error = report::write_report_files(delivery.files_dir(), amended->first, amended->second);
        if (!error.empty()) out << "sentinel: " << error << "\n" << std::flush;
      }
      lock.lock();
      return;
    }
    case Kind::Stop: {
      Report r = build_report();  // this rank's own last frames, for the context
      r.rank = ranks.session().identity().rank;
      r.world_size = ranks.session().identity().world_size;
      r.batch_number = batches.current();
      r.phase = phase;
      r.produced_here = false;
      r.fp8_metrics = observers.last_fp8_metrics();
      r.ranks = outcome.agreement;
      r.kind = outcome.report_kind;
      r.origin = outcome.origin;
      deliver(std::move(r), lock);
      lock.lock();
      return;
    }
  }
}

}  // namespace sentinel

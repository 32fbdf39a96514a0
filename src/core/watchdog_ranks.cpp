// The watchdog among many ranks: what this rank tells the others at a trip, and what it does with
// what they tell it (src/ranks/ carries the records).
#include "capture/op_call.h"

#include <algorithm>
#include <cstring>

#include "core/watchdog_impl.h"
#include "report/report_files.h"

namespace sentinel {

namespace {

// Collectives write what other ranks sent: a non-finite output from finite inputs arrived here.
// (c10d's dispatcher ops, PyTorch 2's functional collectives, and the backends' profiler names.)
bool is_collective(const std::string& op) {
  static const char* const kPrefixes[] = {"c10d::", "c10d_functional::", "_c10d_functional::", "gloo:", "nccl:",
                                          "mpi:", "ucc:"};
  for (const char* p : kPrefixes) {
    if (op.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string describe_frame(const Frame& f) {
  std::string place = f.module_path.empty() ? "<root>" : f.module_path;
  if (!f.module_class.empty()) place += " (" + f.module_class + ")";
  return place + " " + (f.direction == Direction::Backward ? "grad " : "") + f.op;
}

bool same_news(const RankAgreement& a, const RankAgreement& b) {
  const bool same_first = a.first.has_value() == b.first.has_value() &&
                          (!a.first || (a.first->rank == b.first->rank && a.first->batch_number == b.first->batch_number &&
                                        a.first->op_index == b.first->op_index));
  return same_first && a.tripped == b.tripped && a.missing == b.missing && a.problem == b.problem;
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string out;
  for (int64_t r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

void Watchdog::Impl::stamp_rank(Report& report) {
  report.rank = ranks->identity().rank;
  report.world_size = ranks->identity().world_size;
  if (!ranks->distributed() || report.kind != "nonfinite" || report.frames.empty()) return;
  const Frame& t = report.trigger();
  RankEvent e;
  e.rank = report.rank;
  e.batch_number = t.batch_number;
  e.direction = t.direction;
  e.op_index = t.op_index;
  e.frame = describe_frame(t);
  e.role = RankRole::Made;
  e.host = ranks->identity().host;
  e.local_rank = ranks->identity().local_rank;
  if (report.produced_here && is_collective(t.op)) {
    e.role = RankRole::Received;
    report.origin = "origin: received from another rank - " + t.op + " in " +
                    (t.module_path.empty() ? std::string("the model's root") : t.module_path) +
                    " returned inf/nan from finite inputs on this rank";
  } else if (report.produced_here && grads_at_batch_end && t.op == "AccumulateGrad") {
    // The backward's own frames were finite (a non-finite one would have tripped there), so the
    // gradients changed after it: in data-parallel training, by the all-reduce.
    e.role = RankRole::Received;
    report.origin = "origin: received from another rank - the parameter gradients of " +
                    (t.module_path.empty() ? std::string("the model's root") : t.module_path) +
                    " were finite when backward made them and hold inf/nan at batch end (after the "
                    "gradient all-reduce)";
  } else if (!report.produced_here && t.direction == Direction::Forward && backward_ran_in_batch) {
    // The first inf/nan this rank sees is already in an input after this batch's backward, with
    // no op here having made it: it came in between the ops, where the gradients are all-reduced.
    e.role = RankRole::Received;
    report.origin = "origin: received from another rank - " + report.origin.substr(std::strlen("origin: ")) +
                    "; no op on this rank made it: it arrived after the backward (the gradient all-reduce)";
  }
  e.origin = report.origin;
  report.ranks.role = e.role;
  report.ranks.host = e.host;
  report.ranks.local_rank = e.local_rank;
  ranks->note_trip(e);
}

void Watchdog::Impl::exchange_ranks(ranks::Phase phase) {
  if (!ranks->exchanging()) return;
  // May run inside a RecordFunction callback (the end of a TorchScript forward): a channel's
  // own tensors (a process group's all-gather) are not the model's ops.
  capture::NotRecorded not_recorded;
  int64_t batch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch = batches.current();
  }
  // Without the lock: this waits for the other ranks.
  const auto agreement = ranks->exchange(batch, phase);
  if (!agreement) return;
  std::unique_lock<std::mutex> lock(mutex);
  act_on_agreement(*agreement, lock);
}

void Watchdog::Impl::announce_trip() {
  if (!ranks->untold_trip()) return;
  capture::NotRecorded not_recorded;
  int64_t batch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch = batches.current();
  }
  const auto agreement = ranks->announce(batch);
  if (!agreement) return;
  std::unique_lock<std::mutex> lock(mutex);
  act_on_agreement(*agreement, lock);
}

void Watchdog::Impl::act_on_agreement(const RankAgreement& agreed, std::unique_lock<std::mutex>& lock) {
  std::ostream& out = opts.output();
  RankAgreement a = agreed;
  if (const auto own = ranks->own_trip()) {
    // A trip noted while the exchange ran was not in this rank's record: it counts all the same.
    if (a.exchanged && std::find(a.tripped.begin(), a.tripped.end(), own->rank) == a.tripped.end()) {
      a.tripped.insert(std::upper_bound(a.tripped.begin(), a.tripped.end(), own->rank), own->rank);
      if (!a.first || ranks::earlier(*own, *a.first)) a.first = own;
    }
    a.role = own->role;
  }
  if (!a.exchanged) {
    if (!a.problem.empty() && !reported_agreement) {
      reported_agreement = a;
      out << "sentinel: rank " << ranks->identity().rank << ": " << a.problem << "\n" << std::flush;
    }
    return;
  }
  if (reported_agreement && same_news(*reported_agreement, a)) return;
  const bool news = a.first || !a.missing.empty() || !a.problem.empty();
  if (!news) return;
  reported_agreement = a;

  // This rank's report is written: it gains what the others said, in place and in its files.
  if (const auto amended = ranks->own_trip() ? delivery.amend_last_report(a) : std::nullopt) {
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
  if (delivery.pending_is_report()) return;  // a report is already on its way to the user
  if (!a.first && a.missing.empty()) {  // trouble, but nobody to stop for
    out << "sentinel: rank " << ranks->identity().rank << ": " << a.problem << "\n" << std::flush;
    return;
  }

  Report r = build_report();  // this rank's own last frames, for the context
  r.rank = ranks->identity().rank;
  r.world_size = ranks->identity().world_size;
  r.batch_number = batches.current();
  r.produced_here = false;
  r.fp8_metrics = last_fp8_metrics;
  r.ranks = a;
  if (a.first) {
    const RankEvent& f = *a.first;
    r.kind = "peer_nonfinite";
    r.origin = "origin: on rank " + std::to_string(f.rank) + " - it saw inf/nan first, in batch " +
               std::to_string(f.batch_number) + ", " + to_string(f.direction) + " op " +
               std::to_string(f.op_index) + ": " + f.frame + "; this rank saw none and stops with it";
  } else {
    r.kind = "ranks_missing";
    r.origin = "origin: unknown - rank" + std::string(a.missing.size() > 1 ? "s " : " ") + rank_list(a.missing) +
               " did not answer (died, left, or never reached the exchange) and no rank that answered saw inf/nan";
  }
  deliver(std::move(r), lock);
  lock.lock();
}

}  // namespace sentinel

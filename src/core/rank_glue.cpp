#include "core/rank_glue.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace sentinel::core {

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

std::string module_or_root(const Frame& f) {
  return f.module_path.empty() ? std::string("the model's root") : f.module_path;
}

bool same_news(const RankAgreement& a, const RankAgreement& b) {
  const bool same_first = a.first.has_value() == b.first.has_value() &&
                          (!a.first || (a.first->rank == b.first->rank && a.first->batch_number == b.first->batch_number &&
                                        a.first->op_index == b.first->op_index));
  return same_first && a.tripped == b.tripped && a.missing == b.missing && a.problem == b.problem;
}

}  // namespace

void RankGlue::stamp(Report& report) {
  const ranks::Identity& id = session_->identity();
  report.rank = id.rank;
  report.world_size = id.world_size;
  if (!session_->distributed() || report.kind != "nonfinite" || report.frames.empty()) return;
  const Frame& t = report.trigger();
  RankEvent e;
  e.rank = report.rank;
  e.batch_number = t.batch_number;
  e.direction = t.direction;
  e.op_index = t.op_index;
  e.frame = describe_frame(t);
  e.role = RankRole::Made;
  e.host = id.host;
  e.local_rank = id.local_rank;
  if (report.produced_here && is_collective(t.op)) {
    e.role = RankRole::Received;
    report.origin = fmt::format(
        "origin: received from another rank - {} in {} returned inf/nan from finite inputs on this rank", t.op,
        module_or_root(t));
  } else if (report.produced_here && grads_at_batch_end && t.op == "AccumulateGrad") {
    // The backward's own frames were finite (a non-finite one would have tripped there), so the
    // gradients changed after it: in data-parallel training, by the all-reduce.
    e.role = RankRole::Received;
    report.origin = fmt::format(
        "origin: received from another rank - the parameter gradients of {} were finite when backward made them "
        "and hold inf/nan at batch end (after the gradient all-reduce)",
        module_or_root(t));
  } else if (!report.produced_here &&
             (nonfinite_from_collective || (t.direction == Direction::Forward && backward_ran_in_batch))) {
    // The first inf/nan this rank sees lies in what a collective wrote, or is already in an input
    // once this batch's backward ran, with no op here having made it: a collective brought it
    // (FSDP's all-gather, the gradients' all-reduce between the ops, FSDP's reduce-scatter inside
    // the backward).
    e.role = RankRole::Received;
    report.origin = fmt::format(
        "origin: received from another rank - {}; no op on this rank made it: it arrived through a collective{}",
        report.origin.substr(std::strlen("origin: ")),
        nonfinite_from_collective ? "" : " once the backward ran (the gradients' all-reduce or reduce-scatter)");
  }
  e.origin = report.origin;
  report.ranks.role = e.role;
  report.ranks.host = e.host;
  report.ranks.local_rank = e.local_rank;
  session_->note_trip(e);
}

RankGlue::Outcome RankGlue::weigh(const RankAgreement& agreed, bool report_written, bool report_pending) {
  Outcome out;
  RankAgreement& a = out.agreement = agreed;
  const auto own = session_->own_trip();
  if (own) {
    // A trip noted while the exchange ran was not in this rank's record: it counts all the same.
    if (a.exchanged && std::find(a.tripped.begin(), a.tripped.end(), own->rank) == a.tripped.end()) {
      a.tripped.insert(std::upper_bound(a.tripped.begin(), a.tripped.end(), own->rank), own->rank);
      if (!a.first || ranks::earlier(*own, *a.first)) a.first = own;
    }
    a.role = own->role;
  }
  const std::string rank_says = fmt::format("sentinel: rank {}: {}\n", session_->identity().rank, a.problem);
  if (!a.exchanged) {
    if (!a.problem.empty() && !reported_) {
      reported_ = a;
      out.kind = Outcome::Kind::Say;
      out.line = rank_says;
    }
    return out;
  }
  if (reported_ && same_news(*reported_, a)) return out;
  if (!a.first && a.missing.empty() && a.problem.empty()) return out;  // no news
  reported_ = a;
  if (own && report_written) {
    out.kind = Outcome::Kind::Amend;
    return out;
  }
  if (report_pending) return out;  // a report is already on its way to the user
  if (!a.first && a.missing.empty()) {  // trouble, but nobody to stop for
    out.kind = Outcome::Kind::Say;
    out.line = rank_says;
    return out;
  }
  out.kind = Outcome::Kind::Stop;
  if (a.first) {
    const RankEvent& f = *a.first;
    out.report_kind = "peer_nonfinite";
    out.origin = fmt::format(
        "origin: on rank {} - it saw inf/nan first, in batch {}, {} op {}: {}; this rank saw none and stops with it",
        f.rank, f.batch_number, to_string(f.direction), f.op_index, f.frame);
  } else {
    std::string list;
    for (int64_t r : a.missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    out.report_kind = "ranks_missing";
    out.origin = fmt::format(
        "origin: unknown - rank{} {} did not answer (died, left, or never reached the exchange) and no rank that "
        "answered saw inf/nan",
        a.missing.size() > 1 ? "s" : "", list);
  }
  return out;
}

}  // namespace sentinel::core

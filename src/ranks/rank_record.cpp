#include "ranks/rank_record.h"

#include <algorithm>
#include <sstream>
#include <tuple>

namespace sentinel {
namespace ranks {

namespace {

constexpr const char* kHeader = "sentinel-rank-record 1";
constexpr size_t kMaxText = 800;  // frame and origin each; keeps a record under kMaxRecordBytes

std::string one_line(const std::string& s) {
  std::string out = s.substr(0, kMaxText);
  std::replace(out.begin(), out.end(), '\n', ' ');
  std::replace(out.begin(), out.end(), '\r', ' ');
  return out;
}

const char* role_key(RankRole r) { return r == RankRole::Received ? "received" : "made"; }

bool parse_int(const std::string& s, int64_t& out) {
  try {
    size_t used = 0;
    out = std::stoll(s, &used);
    return used == s.size();
  } catch (...) {
    return false;
  }
}

}  // namespace

std::string encode(const RankRecord& record) {
  std::string out = std::string(kHeader) + "\nrank=" + std::to_string(record.rank) +
                    "\nleft=" + (record.left ? "1" : "0") + "\naborted=" + (record.aborted ? "1" : "0") +
                    "\nlast_round=" + std::to_string(record.last_round) + "\n";
  if (const auto& e = record.tripped) {
    out += "batch=" + std::to_string(e->batch_number) + "\ndirection=" + to_string(e->direction) +
           "\nop_index=" + std::to_string(e->op_index) + "\nrole=" + role_key(e->role) +
           "\nframe=" + one_line(e->frame) + "\norigin=" + one_line(e->origin) + "\nhost=" + one_line(e->host) +
           "\nlocal_rank=" + std::to_string(e->local_rank) + "\n";
  }
  return out;
}

std::optional<RankRecord> decode(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) return std::nullopt;
  RankRecord r;
  RankEvent e;
  bool have_rank = false, have_batch = false, have_op = false;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) return std::nullopt;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "rank") {
      if (!parse_int(value, r.rank) || r.rank < 0) return std::nullopt;
      have_rank = true;
    } else if (key == "left") {
      r.left = value == "1";
    } else if (key == "aborted") {
      r.aborted = value == "1";
    } else if (key == "last_round") {
      if (!parse_int(value, r.last_round)) return std::nullopt;
    } else if (key == "batch") {
      if (!parse_int(value, e.batch_number)) return std::nullopt;
      have_batch = true;
    } else if (key == "direction") {
      if (value != "forward" && value != "backward") return std::nullopt;
      e.direction = value == "forward" ? Direction::Forward : Direction::Backward;
    } else if (key == "op_index") {
      if (!parse_int(value, e.op_index)) return std::nullopt;
      have_op = true;
    } else if (key == "role") {
      e.role = value == "received" ? RankRole::Received : RankRole::Made;
    } else if (key == "frame") {
      e.frame = value;
    } else if (key == "origin") {
      e.origin = value;
    } else if (key == "host") {
      e.host = value;
    } else if (key == "local_rank") {
      if (!parse_int(value, e.local_rank)) return std::nullopt;
    }  // keys of later versions are ignored
  }
  if (!have_rank || have_batch != have_op) return std::nullopt;
  if (have_batch) {
    e.rank = r.rank;
    r.tripped = e;
  }
  return r;
}

bool earlier(const RankEvent& a, const RankEvent& b) {
  // The op index counts forward and backward frames of a batch in one sequence. A value received
  // was made somewhere: within a batch, a rank that made one comes before any that received one.
  return std::make_tuple(a.batch_number, a.role == RankRole::Received, a.op_index, a.rank) <
         std::make_tuple(b.batch_number, b.role == RankRole::Received, b.op_index, b.rank);
}

RankAgreement agree(int64_t round, const RankRecord& self, const std::vector<std::optional<RankRecord>>& records,
                    const std::vector<int64_t>& unreadable) {
  RankAgreement a;
  a.exchanged = true;
  std::string departed;
  for (size_t r = 0; r < records.size(); ++r) {
    const auto& rec = static_cast<int64_t>(r) == self.rank ? std::optional<RankRecord>(self) : records[r];
    if (!rec) {
      if (std::find(unreadable.begin(), unreadable.end(), static_cast<int64_t>(r)) == unreadable.end()) {
        a.missing.push_back(static_cast<int64_t>(r));
      }
      continue;
    }
    if (!rec->tripped && rec->left && static_cast<int64_t>(r) != self.rank &&
        (rec->aborted || rec->last_round < round)) {
      // Gone without an inf/nan: it will not join the next collective either.
      a.missing.push_back(static_cast<int64_t>(r));
      departed += (departed.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                  (rec->aborted ? " left while an exception unwound its batch " + std::to_string(rec->last_round)
                                : " left after batch " + std::to_string(rec->last_round));
      continue;
    }
    if (!rec->tripped) continue;
    a.tripped.push_back(static_cast<int64_t>(r));
    if (!a.first || earlier(*rec->tripped, *a.first)) a.first = rec->tripped;
  }
  a.problem = departed;
  if (!unreadable.empty()) {
    a.problem += std::string(a.problem.empty() ? "" : "; ") + "unreadable records from rank";
    for (int64_t r : unreadable) a.problem += " " + std::to_string(r);
    a.missing.insert(a.missing.end(), unreadable.begin(), unreadable.end());
  }
  std::sort(a.missing.begin(), a.missing.end());
  if (self.tripped) {
    a.role = self.tripped->role;
  } else if (a.first || !a.missing.empty()) {
    a.role = RankRole::Stopped;
  } else {
    a.role = RankRole::Alone;
  }
  return a;
}

}  // namespace ranks
}  // namespace sentinel

#include "cli/ranks_command.h"
#include "report/json_text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <vector>

#include "cli/run_command.h"
#include "ranks/rank_record.h"

namespace sentinel {
namespace cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RankReport {
  std::string file;
  json j;
};

// "rank12" -> 12
std::optional<int64_t> rank_of(const std::string& name) {
  if (name.rfind("rank", 0) != 0 || name.size() == 4) return std::nullopt;
  int64_t r = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || r > 1000000) return std::nullopt;
    r = r * 10 + (name[i] - '0');
  }
  return r;
}

std::string frame_text(const json& f) {
  std::string place = f.value("module_path", std::string());
  if (place.empty()) place = "<root>";
  const std::string cls = f.value("module_class", std::string());
  if (!cls.empty()) place += " (" + cls + ")";
  return place + " " + (f.value("direction", std::string()) == "backward" ? "grad " : "") + f.value("op", std::string());
}

// A report's detecting frame as the event the ranks exchange, so that the ranks' own order decides.
RankEvent event_of(const json& report, int64_t rank) {
  const json& t = report["frames"].back();
  const json ranks = report.value("ranks", json::object());
  RankEvent e;
  e.rank = rank;
  e.batch_number = t.value("batch_number", int64_t{0});
  e.direction = t.value("direction", std::string()) == "backward" ? Direction::Backward : Direction::Forward;
  e.op_index = t.value("op_index", int64_t{0});
  e.role = ranks.is_object() && ranks.value("role", std::string()) == "received" ? RankRole::Received : RankRole::Made;
  return e;
}

}  // namespace

int summarize_ranks(const std::string& dir, std::ostream& out, std::ostream& err) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    err << "sentinel ranks: '" << dir << "' is not a directory\n";
    return kInputError;
  }
  std::map<int64_t, std::vector<RankReport>> by_rank;
  for (const auto& d : fs::directory_iterator(dir, ec)) {
    const auto rank = rank_of(d.path().filename().string());
    if (!rank || !d.is_directory()) continue;
    auto& reports = by_rank[*rank];
    std::vector<fs::path> files;
    for (const auto& f : fs::directory_iterator(d.path(), ec)) {
      const std::string name = f.path().filename().string();
      if (f.path().extension() == ".json" && name.rfind("sentinel_", 0) == 0) files.push_back(f.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      std::ifstream in(path);
      json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("kind") || !j.contains("frames") || !j["frames"].is_array()) {
        err << "sentinel ranks: " << path.string() << " is not a sentinel report: skipped\n";
        continue;
      }
      reports.push_back({path.filename().string(), std::move(j)});
    }
  }
  if (by_rank.empty()) {
    err << "sentinel ranks: no rank<R>/ directories in '" << dir << "' (a run of many ranks writes them into its report_dir)\n";
    return kInputError;
  }

  // The first event, from the files themselves: every rank's own inf/nan report.
  std::optional<RankEvent> first;
  const json* first_report = nullptr;
  int64_t world = 0;
  bool any_trip = false;
  for (const auto& [rank, reports] : by_rank) {
    for (const auto& r : reports) {
      world = std::max(world, r.j.value("world_size", int64_t{0}));
      const std::string kind = r.j.value("kind", std::string());
      any_trip = any_trip || kind == "nonfinite" || kind == "peer_nonfinite" || kind == "ranks_missing";
      if (kind != "nonfinite" || r.j["frames"].empty()) continue;
      const RankEvent e = event_of(r.j, rank);
      if (!first || ranks::earlier(e, *first)) {
        first = e;
        first_report = &r.j;
      }
    }
  }
  out << "sentinel ranks " << dir << ": reports of " << by_rank.size() << " rank(s)"
      << (world > 0 ? " of a world of " + std::to_string(world) : std::string()) << "\n";
  if (first) {
    out << "First to see inf/nan: rank " << first->rank << ", batch " << first->batch_number << ", "
        << to_string(first->direction) << " op " << first->op_index << ": "
        << frame_text((*first_report)["frames"].back()) << " (" << to_string(first->role) << " there)\n"
        << "  " << first_report->value("origin", std::string()) << "\n";
  } else if (any_trip) {
    out << "No rank's own inf/nan report is here (its files are missing or it did not answer).\n";
  } else {
    out << "No rank saw inf/nan.\n";
  }
  for (int64_t r = 0; r < std::max<int64_t>(world, by_rank.rbegin()->first + 1); ++r) {
    auto it = by_rank.find(r);
    if (it == by_rank.end() || it->second.empty()) {
      out << "rank " << r << ": no report\n";
      continue;
    }
    for (const auto& rep : it->second) {
      const json& j = rep.j;
      const std::string kind = j.value("kind", std::string());
      const json ranks = j.value("ranks", json::object());
      out << "rank " << r << ": " << kind << " in batch " << j.value("batch_number", int64_t{0});
      if (ranks.is_object() && ranks.contains("role")) out << ", role " << ranks.value("role", std::string());
      if (kind == "nonfinite" && !j["frames"].empty()) out << ", at " << frame_text(j["frames"].back());
      const json missing = ranks.value("missing", json::array());
      if (missing.is_array() && !missing.empty()) out << ", did not hear from rank(s) " << report::json_text(missing);
      out << "  [rank" << r << "/" << rep.file << "]\n";
    }
  }
  return any_trip ? kNonFinite : kClean;
}

}  // namespace cli
}  // namespace sentinel

#include "report/json_read.h"

#include <sentinel/errors.h>
#include <sentinel/version.h>

#include <fmt/format.h>

#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace sentinel {
namespace report {

namespace {

using Json = nlohmann::json;

// A JSON value and where it sits in the document ("frames[2].entries[0]"), so that every error
// names the key the user must look at.
class Node {
 public:
  Node(const Json& j, std::string path, const std::string& source) : j_(j), path_(std::move(path)), source_(source) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(fmt::format("sentinel: {}: {}: {}", source_, path_.empty() ? "the document" : path_, what));
  }
  Node at(const std::string& key) const {
    if (!j_.is_object()) fail("expected an object");
    auto it = j_.find(key);
    if (it == j_.end()) Node(j_, child(key), source_).fail("missing");
    return Node(*it, child(key), source_);
  }
  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  bool is_null() const { return j_.is_null(); }
  std::vector<Node> items() const {
    if (!j_.is_array()) fail("expected an array");
    std::vector<Node> out;
    for (size_t i = 0; i < j_.size(); ++i) out.emplace_back(j_[i], fmt::format("{}[{}]", path_, i), source_);
    return out;
  }
  std::string str() const {
    if (!j_.is_string()) fail("expected a string");
    return j_.get<std::string>();
  }
  int64_t integer() const {
    if (!j_.is_number_integer()) fail("expected an integer");
    return j_.get<int64_t>();
  }
  bool boolean() const {
    if (!j_.is_boolean()) fail("expected true or false");
    return j_.get<bool>();
  }
  // Numbers, and the strings "inf", "-inf" and "nan" that stand for what JSON cannot hold.
  double number() const {
    if (j_.is_number()) return j_.get<double>();
    if (j_.is_string()) {
      const std::string s = j_.get<std::string>();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
      if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    }
    fail("expected a number (or \"inf\", \"-inf\", \"nan\")");
  }
  template <typename E>
  E one_of(std::initializer_list<E> values) const {
    const std::string s = str();
    std::string names;
    for (E v : values) {
      if (s == to_string(v)) return v;
      names += (names.empty() ? "" : ", ") + std::string(to_string(v));
    }
    fail(fmt::format("'{}' is not one of {}", s, names));
  }

 private:
  std::string child(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const Json& j_;
  std::string path_;
  const std::string& source_;
};

Entry read_entry(const Node& n) {
  Entry e;
  e.label = n.at("label").str();
  if (n.has("role")) {
    e.role = n.at("role").one_of({EntryRole::Parameter, EntryRole::Input, EntryRole::Output, EntryRole::Gradient});
  } else {  // schema 6 and older: outputs were told apart by label only
    e.role = e.label.rfind("output", 0) == 0 ? EntryRole::Output : e.label.rfind("input", 0) == 0 ? EntryRole::Input
             : e.label.size() > 5 && e.label.compare(e.label.size() - 5, 5, ".grad") == 0 ? EntryRole::Gradient
                                                                                           : EntryRole::Parameter;
  }
  e.is_output = e.role == EntryRole::Output || e.role == EntryRole::Gradient;
  e.kind = n.at("kind").one_of({EntryKind::Tensor, EntryKind::None, EntryKind::NotATensor, EntryKind::Skipped});
  if (n.has("dtype")) e.dtype = n.at("dtype").str();
  if (e.kind == EntryKind::Skipped) e.skip_reason = n.at("skip_reason").str();
  if (n.has("headroom")) {
    const Node h = n.at("headroom");
    e.has_headroom = true;
    e.headroom.fp16_overflow = h.at("fp16_overflow").integer();
    e.headroom.fp16_underflow = h.at("fp16_underflow").integer();
    e.headroom.bf16_overflow = h.at("bf16_overflow").integer();
    e.headroom.bf16_underflow = h.at("bf16_underflow").integer();
  }
  if (e.kind == EntryKind::Tensor) {
    const Node s = n.at("stats");
    TensorStats& t = e.stats;
    t.count = s.at("count").integer();
    t.nan = s.at("nan").integer();
    t.pos_inf = s.at("pos_inf").integer();
    t.neg_inf = s.at("neg_inf").integer();
    t.zeros = s.at("zeros").integer();
    t.subnormal = s.at("subnormal").integer();
    t.abs_min = s.at("abs_min").number();
    t.abs_max = s.at("abs_max").number();
  }
  return e;
}

Frame read_frame(const Node& n) {
  Frame f;
  f.batch_number = n.at("batch_number").integer();
  f.op_index = n.at("op_index").integer();
  f.direction = n.at("direction").one_of({Direction::Forward, Direction::Backward});
  f.module_path = n.at("module_path").str();
  f.module_class = n.at("module_class").str();
  f.op = n.at("op").str();
  f.forward_op = n.at("forward_op").str();
  f.attribution = n.at("attribution").one_of(
      {Attribution::ModuleHierarchy, Attribution::Parameter, Attribution::UserScope, Attribution::ModelRoot});
  f.inputs_finite = n.at("inputs_finite").boolean();
  f.outputs_finite = n.at("outputs_finite").boolean();
  f.entries_omitted = n.at("entries_omitted").integer();
  if (n.has("recomputed")) f.recomputed = n.at("recomputed").boolean();
  if (n.has("error")) f.error = n.at("error").str();
  for (const Node& e : n.at("entries").items()) f.entries.push_back(read_entry(e));
  return f;
}

Fp8SlotMetrics read_metrics(const Node& n) {
  Fp8SlotMetrics m;
  m.step = n.at("step").integer();
  m.module_path = n.at("module_path").str();
  m.role = n.at("role").str();
  m.recipe = n.at("recipe").str();
  m.format = n.at("format").str();
  m.uses = n.at("uses").integer();
  m.cur_amax = n.at("cur_amax").number();
  m.delayed_scale = n.at("delayed_scale").number();
  m.current_scale = n.at("current_scale").number();
  m.drift_log2 = n.at("drift_log2").number();
  m.count = n.at("count").integer();
  m.overflow = n.at("overflow").integer();
  m.underflow = n.at("underflow").integer();
  m.overflow_pct = n.at("overflow_pct").number();
  m.underflow_pct = n.at("underflow_pct").number();
  m.mse = n.at("mse").number();
  m.cosine = n.at("cosine").number();
  m.sqnr_db = n.at("sqnr_db").number();
  if (n.has("blocks")) {
    m.blocks = n.at("blocks").integer();
    m.blocks_zero = n.at("blocks_zero").integer();
    m.blocks_saturated = n.at("blocks_saturated").integer();
    m.blocks_at_min = n.at("blocks_at_min").integer();
    m.blocks_nonfinite = n.at("blocks_nonfinite").integer();
    m.lost = n.at("lost").integer();
    for (const Node& pair : n.at("block_scales").items()) {
      const auto two = pair.items();
      if (two.size() != 2) pair.fail("expected [scale, blocks]");
      m.block_scales.emplace_back(two[0].number(), two[1].integer());
    }
  }
  return m;
}

RankEvent read_rank_event(const Node& n) {
  RankEvent e;
  e.rank = n.at("rank").integer();
  e.batch_number = n.at("batch_number").integer();
  e.direction = n.at("direction").one_of({Direction::Forward, Direction::Backward});
  e.op_index = n.at("op_index").integer();
  e.frame = n.at("frame").str();
  e.origin = n.at("origin").str();
  e.role = n.at("role").one_of({RankRole::Alone, RankRole::Made, RankRole::Received, RankRole::Stopped});
  e.host = n.at("host").str();
  e.local_rank = n.at("local_rank").integer();
  return e;
}

std::vector<std::string> strings(const Node& n) {
  std::vector<std::string> out;
  for (const Node& s : n.items()) out.push_back(s.str());
  return out;
}

std::vector<int64_t> integers(const Node& n) {
  std::vector<int64_t> out;
  for (const Node& s : n.items()) out.push_back(s.integer());
  return out;
}

Report read_report(const Node& root) {
  const int64_t version = root.at("schema_version").integer();
  if (version > SENTINEL_REPORT_SCHEMA_VERSION || version < 5) {
    root.at("schema_version").fail(fmt::format("version {} is not read by this build (it reads 5 to {})", version,
                                               SENTINEL_REPORT_SCHEMA_VERSION));
  }
  Report r;
  r.kind = root.at("kind").str();
  if (r.kind != "nonfinite" && r.kind != "fp8_alarm" && r.kind != "peer_nonfinite" && r.kind != "ranks_missing" &&
      r.kind != "trace") {
    root.at("kind").fail("'" + r.kind + "' is not a kind of report");
  }
  r.batch_number = root.at("batch_number").integer();
  r.rank = root.at("rank").integer();
  r.world_size = root.at("world_size").integer();
  r.produced_here = root.at("produced_here").boolean();
  r.origin = root.at("origin").str();
  if (version >= 9) {
    if (!root.at("origin_frame").is_null()) r.origin_frame = read_frame(root.at("origin_frame"));
    r.escape = root.at("escape").one_of({Escape::None, Escape::Read, Escape::Written, Escape::Returned});
    for (const Node& t : root.at("tolerated").items()) {
      ToleratedCount c;
      c.module_path = t.at("module_path").str();
      c.module_class = t.at("module_class").str();
      c.op = t.at("op").str();
      c.allowed = t.at("allowed").boolean();
      c.frames = t.at("frames").integer();
      c.nan = t.at("nan").integer();
      c.pos_inf = t.at("pos_inf").integer();
      c.neg_inf = t.at("neg_inf").integer();
      c.first_batch = t.at("first_batch").integer();
      c.last_batch = t.at("last_batch").integer();
      r.tolerated.push_back(std::move(c));
    }
  }
  r.stack = strings(root.at("stack"));
  r.torchscript_stack = strings(root.at("torchscript_stack"));
  if (version >= 8) r.python_stack = strings(root.at("python_stack"));
  r.deferred = root.at("deferred").boolean();
  if (root.has("dump_dir")) r.dump_dir = root.at("dump_dir").str();
  if (root.has("phase")) r.phase = root.at("phase").str();
  for (const Node& f : root.at("frames").items()) r.frames.push_back(read_frame(f));
  for (const Node& m : root.at("fp8_metrics").items()) r.fp8_metrics.push_back(read_metrics(m));
  for (const Node& a : root.at("fp8_alarms").items()) {
    r.fp8_alarms.push_back(Fp8Alarm{read_metrics(a.at("metrics")), a.at("reason").str()});
  }
  const Node ranks = root.at("ranks");
  RankAgreement& a = r.ranks;
  a.exchanged = ranks.at("exchanged").boolean();
  a.role = ranks.at("role").one_of({RankRole::Alone, RankRole::Made, RankRole::Received, RankRole::Stopped});
  if (!ranks.at("first").is_null()) a.first = read_rank_event(ranks.at("first"));
  a.tripped = integers(ranks.at("tripped"));
  a.missing = integers(ranks.at("missing"));
  a.problem = ranks.at("problem").str();
  a.host = ranks.at("host").str();
  a.local_rank = ranks.at("local_rank").integer();
  return r;
}

}  // namespace

Report parse_report_json(const std::string& text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw InputError(fmt::format("sentinel: {}: not JSON ({})", source, e.what()));
  }
  return read_report(Node(j, "", source));
}

Report read_report_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError("sentinel: cannot open report '" + path + "'");
  std::stringstream text;
  text << f.rdbuf();
  if (f.bad()) throw InputError("sentinel: cannot read report '" + path + "'");
  return parse_report_json(text.str(), path);
}

std::vector<Fp8SlotMetrics> read_fp8_metrics_log(const std::string& path, size_t max_lines, int64_t& skipped) {
  skipped = 0;
  std::deque<Fp8SlotMetrics> kept;
  std::ifstream f(path);
  std::string line;
  for (int64_t number = 1; std::getline(f, line); ++number) {
    if (line.empty()) continue;
    try {
      const Json j = Json::parse(line);
      kept.push_back(read_metrics(Node(j, fmt::format("line {}", number), path)));
      if (kept.size() > max_lines) kept.pop_front();
    } catch (const Json::exception&) {
      ++skipped;
    } catch (const InputError&) {
      ++skipped;
    }
  }
  return {kept.begin(), kept.end()};
}

std::vector<Fp8SlotMetrics> fp8_history_in(const std::string& dir, int64_t& skipped) {
  constexpr size_t kLines = 200000;  // the last steps of a long run's log
  skipped = 0;
  const std::filesystem::path log = std::filesystem::path(dir) / "fp8_metrics.jsonl";
  std::error_code ec;
  if (!std::filesystem::exists(log, ec)) return {};
  return read_fp8_metrics_log(log.string(), kLines, skipped);
}

}  // namespace report
}  // namespace sentinel

#include "core/place_rule.h"

#include <array>

#include "frames/entry_label.h"

namespace sentinel::core {

using frames::EntryRecord;
using frames::EntryState;
using frames::FrameRecord;
using frames::Role;

namespace {

bool nonfinite_read(const EntryRecord& e) { return e.state == EntryState::Read && !e.stats.finite(); }

// Whether a result lies in the memory of one of the frame's arguments.
bool shares_an_argument(const FrameRecord& f, uintptr_t storage) {
  for (int i = 0; i < f.entry_count; ++i) {
    if (f.entries[i].role != Role::Output && f.entries[i].storage == storage) return true;
  }
  return false;
}

// Whether module path `in` is `out` or a path inside it ("" is the root's: every path is inside).
bool path_within(const std::string& in, const std::string& out) {
  return out.empty() || in == out ||
         (in.size() > out.size() && in.compare(0, out.size(), out) == 0 && in[out.size()] == '.');
}

void add_elements(ToleratedCount& c, const TensorStats& s) {
  c.nan += s.nan;
  c.pos_inf += s.pos_inf;
  c.neg_inf += s.neg_inf;
}

}  // namespace

PlaceRule::PlaceRule(const frames::PlaceTable& places, const frames::StringTable& strings,
                     std::vector<options::NonfiniteAllowance> allow)
    : places_(places), strings_(strings), allow_(std::move(allow)) {}

bool PlaceRule::within(uint32_t inner, uint32_t outer) const {
  if (inner == outer) return true;
  const uint64_t key = (uint64_t{inner} << 32) | outer;
  if (auto it = within_.find(key); it != within_.end()) return it->second;
  const bool inside = path_within(places_.path(inner), places_.path(outer));
  within_.emplace(key, inside);
  return inside;
}

std::string PlaceRule::owner_path(const Made& m) const {
  std::string path = places_.path(m.place);
  if (!m.handed_up) return path;
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

bool PlaceRule::readable_by(const Made& m, uint32_t reader) const {
  return m.handed_up ? path_within(places_.path(reader), owner_path(m)) : within(reader, m.place);
}

bool PlaceRule::owned_within(const Made& m, uint32_t module) const {
  return m.handed_up ? path_within(owner_path(m), places_.path(module)) : within(m.place, module);
}

bool PlaceRule::made_by_compiled_kernels_and_absorbed(const FrameRecord& f, const EntryRecord& e) const {
  if (!f.in_compiled_code || e.role != Role::Input || !f.outputs_finite) return false;
  for (int i = 0; i < f.entry_count; ++i) {
    if (f.entries[i].role == Role::Output && f.entries[i].state == EntryState::Read) return true;
  }
  return false;  // no result read: nothing says the value ends here
}

std::string PlaceRule::label(const EntryRecord& e) const { return frames::entry_label(e, strings_); }

bool PlaceRule::allowed(const FrameRecord& f, const EntryRecord& e) {
  if (allow_.empty()) return false;
  const std::string path = places_.path(f.place), op = strings_.at(f.op), entry = label(e);
  for (const auto& a : allow_) {
    // A module's whole forward (the boundary tier) is what it returned: a pattern for its "return"
    // holds in both tiers.
    const bool matches = a.matches(path, op, entry, e.stats) || (f.whole_module && a.matches(path, "return", entry, e.stats));
    if (!matches) continue;
    add_elements(counted_row(f, true), e.stats);
    return true;
  }
  return false;
}

ToleratedCount& PlaceRule::counted_row(const FrameRecord& f, bool allowed) {
  auto& c = counts_[{f.place, f.op, allowed}];
  if (c.frames++ == 0) c.first_batch = f.batch_number;
  c.last_batch = f.batch_number;
  return c;
}

void PlaceRule::count(const FrameRecord& f) {
  auto& c = counted_row(f, false);
  for (int i = 0; i < f.entry_count; ++i) {
    if (f.entries[i].role == Role::Output && nonfinite_read(f.entries[i])) add_elements(c, f.entries[i].stats);
  }
}

DetectionPolicy::Judgement PlaceRule::judge(const FrameRecord& f) {
  Judgement j;
  if (f.is_return) return judge_return(f);
  if (f.whole_module) return judge_whole_module(f);
  // Backward nodes, and ops the model's own code did not run, are judged where the value appears;
  // a value tolerated inside a module that such an op reads is still traced to the op that made it.
  if (f.direction != static_cast<uint8_t>(Direction::Forward) || !f.in_model) {
    j.error = !f.finite();
    if (!j.error || f.direction != static_cast<uint8_t>(Direction::Forward)) return j;
    if (from_constants(f)) return judge_from_constants(f);
    for (int i = 0; i < f.entry_count; ++i) {
      const EntryRecord& e = f.entries[i];
      if (e.role == Role::Output || !nonfinite_read(e)) continue;
      const auto it = e.storage != 0 ? tolerated_values_.find(e.storage) : tolerated_values_.end();
      if (it == tolerated_values_.end()) continue;
      j.escape = Escape::Read;
      j.made_by = it->second.by;
      break;
    }
    return j;
  }
  model_ops_scoped_ = true;
  const uint32_t here = f.module_place;
  std::shared_ptr<const FrameRecord> made_by;  // of the tolerated values this op reads
  if (!f.inputs_finite) {
    bool seen = false;
    std::array<int, FrameRecord::kMaxEntries> absorbed{};  // entries made by compiled kernels, ending here
    int absorbed_count = 0;
    for (int i = 0; i < f.entry_count && !j.error; ++i) {
      const EntryRecord& e = f.entries[i];
      if (e.role == Role::Output || !nonfinite_read(e)) continue;
      seen = true;
      const auto it = e.storage != 0 ? tolerated_values_.find(e.storage) : tolerated_values_.end();
      // A value made outside the model from the program's constants is the model's input here:
      // an error at its first read, as any input holding one.
      if (it != tolerated_values_.end() && !it->second.from_constant && readable_by(it->second, here)) {
        if (!made_by) made_by = it->second.by;
        continue;
      }
      if (allowed(f, e)) continue;
      if (it == tolerated_values_.end() && made_by_compiled_kernels_and_absorbed(f, e)) {
        absorbed[absorbed_count++] = i;
        continue;
      }
      // Made elsewhere and tolerated there, or made where nothing tolerates it (the batch's input,
      // a parameter, a buffer, a value from outside the model): judged as now.
      j.error = true;
      if (it != tolerated_values_.end()) {
        j.escape = Escape::Read;
        j.made_by = it->second.by;
      }
    }
    // The non-finite inputs lie beyond the entries kept: nothing says who made them.
    if (!seen) j.error = true;
    if (absorbed_count > 0 && !j.error) {
      auto& c = counted_row(f, false);
      for (int k = 0; k < absorbed_count; ++k) add_elements(c, f.entries[absorbed[k]].stats);
    }
  }
  bool any_tolerated = false;
  for (int i = 0; i < f.entry_count; ++i) {
    const EntryRecord& e = f.entries[i];
    if (e.role != Role::Output || e.storage == 0 || e.state != EntryState::Read) continue;
    const bool in_place = e.written_argument || shares_an_argument(f, e.storage);
    // An argument handed back as a result (no write) holds what it held: judged where it was read.
    if (in_place && !f.writes_arguments) continue;
    if (!in_place) made_in_batch_[e.storage] = here;
    if (e.stats.finite()) {
      // New values in memory an old tensor had.
      if (!in_place && !tolerated_values_.empty()) tolerated_values_.erase(e.storage);
      continue;
    }
    if (in_place && !j.error) {
      const auto maker = made_in_batch_.find(e.storage);
      // Made by this module or one inside it (and handed up): its own. Otherwise it is the
      // caller's, a parameter or a buffer, and the value leaves the module through it.
      if ((maker == made_in_batch_.end() || !within(maker->second, here)) && !allowed(f, e)) {
        j.error = true;
        j.escape = Escape::Written;
        j.made_by = made_by;
      }
    }
    if (j.error) continue;
    any_tolerated = true;
    auto& value = tolerated_values_[e.storage];
    value.place = here;
    value.by = made_by ? made_by : std::make_shared<const FrameRecord>(f);
  }
  // A recomputed op makes again what the forward made, and was counted then.
  if (any_tolerated && !j.error && !f.recomputed) count(f);
  return j;
}

void PlaceRule::made_uninitialized(uintptr_t storage, uint32_t module) {
  if (storage == 0) return;
  made_in_batch_[storage] = module;
  tolerated_values_.erase(storage);  // (memory a freed tensor held)
}

bool PlaceRule::from_constants(const FrameRecord& f) const {
  // Where no op was ever placed in a module (a C++ model without scopes), the model's ops cannot be
  // told from the training loop's: every op is judged strictly, as the model's.
  if (!model_ops_scoped_) return false;
  // From finite tensors: an overflow, unless the op was handed a non-finite number to write.
  if (f.inputs_finite) return f.nonfinite_constant;
  bool seen = false;
  for (int i = 0; i < f.entry_count; ++i) {
    const EntryRecord& e = f.entries[i];
    if (e.role == Role::Output || !nonfinite_read(e)) continue;
    seen = true;
    if (e.program_constant) continue;
    const auto it = e.storage != 0 ? tolerated_values_.find(e.storage) : tolerated_values_.end();
    if (it == tolerated_values_.end() || !it->second.from_constant) return false;
  }
  return seen;  // (non-finite inputs beyond the entries kept: nothing says where they came from)
}

DetectionPolicy::Judgement PlaceRule::judge_from_constants(const FrameRecord& f) {
  Judgement j;
  std::shared_ptr<const FrameRecord> made_by;  // of the values made from constants this op reads
  for (int i = 0; i < f.entry_count && !made_by; ++i) {
    const EntryRecord& e = f.entries[i];
    if (e.role == Role::Output || !nonfinite_read(e) || e.program_constant) continue;
    if (const auto it = tolerated_values_.find(e.storage); it != tolerated_values_.end()) made_by = it->second.by;
  }
  bool any_tolerated = false;
  for (int i = 0; i < f.entry_count; ++i) {
    const EntryRecord& e = f.entries[i];
    if (e.role != Role::Output || e.state != EntryState::Read) continue;
    const bool in_place = e.written_argument || (f.writes_arguments && shares_an_argument(f, e.storage));
    if (e.stats.finite()) {
      if (!in_place && e.storage != 0) tolerated_values_.erase(e.storage);
      continue;
    }
    // Written into what this batch's ops made (the model's logits, masked in place) it stays a
    // value of the program's; into anything else (a gradient, a parameter, a state) it is an error.
    if (e.storage == 0 || (in_place && made_in_batch_.count(e.storage) == 0)) {
      j.error = true;
      j.escape = Escape::Written;
      j.made_by = made_by;
      return j;
    }
    any_tolerated = true;
    if (!in_place) made_in_batch_[e.storage] = f.module_place;
    Made& value = tolerated_values_[e.storage];
    value.place = f.module_place;
    value.by = made_by ? made_by : std::make_shared<const FrameRecord>(f);
    value.from_constant = true;
  }
  if (any_tolerated) count(f);
  return j;
}

bool PlaceRule::holds_tolerated(uintptr_t storage, uint32_t module_place) const {
  const auto it = tolerated_values_.find(storage);
  return it != tolerated_values_.end() && owned_within(it->second, module_place);
}

DetectionPolicy::Judgement PlaceRule::judge_return(const FrameRecord& returned) {
  Judgement j;
  for (int i = 0; i < returned.entry_count; ++i) {
    const EntryRecord& e = returned.entries[i];
    if (!nonfinite_read(e)) continue;
    const auto it = tolerated_values_.find(e.storage);
    if (it == tolerated_values_.end() || !owned_within(it->second, returned.module_place)) continue;
    if (allowed(returned, e)) {
      it->second.place = returned.module_place;
      it->second.handed_up = true;
      continue;
    }
    j.error = true;
    j.escape = Escape::Returned;
    j.made_by = it->second.by;
    return j;
  }
  return j;
}

DetectionPolicy::Judgement PlaceRule::judge_whole_module(const FrameRecord& f) {
  Judgement j;
  model_ops_scoped_ = true;  // (the training loop's ops, watched after the backward, are told from the model's)
  for (int i = 0; i < f.entry_count; ++i) {
    const EntryRecord& e = f.entries[i];
    if (e.role != Role::Output || !nonfinite_read(e)) continue;
    if (e.storage != 0 && handed_nonfinite(f, e.storage)) continue;
    if (allowed(f, e)) continue;
    j.error = true;  // (the frame itself made it, as far as this tier sees: the replay names the op)
    return j;
  }
  return j;
}

bool PlaceRule::handed_nonfinite(const FrameRecord& f, uintptr_t storage) {
  for (int i = 0; i < f.entry_count; ++i) {
    const EntryRecord& e = f.entries[i];
    if (e.role != Role::Output && e.storage == storage && nonfinite_read(e)) return true;
  }
  return false;
}

void PlaceRule::begin_batch() {
  made_in_batch_.clear();
  tolerated_values_.clear();
}

std::vector<ToleratedCount> PlaceRule::tolerated() const {
  std::vector<ToleratedCount> out;
  for (const auto& [key, c] : counts_) {
    ToleratedCount row = c;
    row.module_path = places_.path(std::get<0>(key));
    row.module_class = places_.cls(std::get<0>(key));
    row.op = strings_.at(std::get<1>(key));
    row.allowed = std::get<2>(key);
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace sentinel::core

// HF's text layout, so that people and the tools that parse HF's reports read ours unchanged.
#include <sentinel/report.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace sentinel {

namespace {

const std::string kPrefix(17, ' ');

// Python's f"{value:>17}": right-aligned in 17 columns, as HF writes "None" and "not a tensor".
std::string right17(const std::string& s) { return s.size() >= 17 ? s : std::string(17 - s.size(), ' ') + s; }

std::string entry_line(const Entry& e) {
  switch (e.kind) {
    case EntryKind::Tensor: {
      // Extra columns after HF's three, only where there is something to say.
      std::string line = fmt::format("{:>8.2e} {:>8.2e} ", e.stats.hf_abs_min(), e.stats.hf_abs_max()) + e.label;
      if (e.stats.subnormal > 0) line += " subnormal=" + std::to_string(e.stats.subnormal);
      const auto& h = e.headroom;
      if (h.fp16_overflow > 0) line += " fp16_overflow=" + std::to_string(h.fp16_overflow);
      if (h.fp16_underflow > 0) line += " fp16_underflow=" + std::to_string(h.fp16_underflow);
      if (h.bf16_overflow > 0) line += " bf16_overflow=" + std::to_string(h.bf16_overflow);
      if (h.bf16_underflow > 0) line += " bf16_underflow=" + std::to_string(h.bf16_underflow);
      return line;
    }
    case EntryKind::None: return right17("None") + " " + e.label;
    case EntryKind::NotATensor: return right17("not a tensor") + " " + e.label;
    case EntryKind::Skipped: return right17(e.skip_reason) + " " + e.label;
  }
  return e.label;
}

}  // namespace

std::string batch_header(int64_t batch_number, int64_t rank) {
  return "\n\n" + kPrefix + " *** Starting batch number=" + std::to_string(batch_number) +
         (rank >= 0 ? " on rank " + std::to_string(rank) : std::string()) + " ***\n" + "abs min  abs max  metadata\n";
}

std::string render_frame_text(const Frame& frame) {
  std::string out = kPrefix + " ";
  if (frame.direction == Direction::Backward) {
    // "grad of <path> <Class> <forward op> <autograd node>"
    out += "grad of " + frame.module_path + " " + frame.module_class + " " +
           (frame.forward_op.empty() ? std::string() : frame.forward_op + " ") + frame.op + "\n";
  } else {
    out += frame.module_path + " " + frame.module_class + " " + frame.op + (frame.recomputed ? " (recomputed)" : "") + "\n";
  }
  for (const auto& e : frame.entries) out += entry_line(e) + "\n";
  if (frame.entries_omitted > 0) {
    out += right17("...") + " " + std::to_string(frame.entries_omitted) + " more entries, checked, not shown\n";
  }
  if (!frame.error.empty()) out += right17("read failed") + " " + frame.error + " (the entries above were read)\n";
  return out;
}

std::string render_fp8_metrics_text(const Fp8SlotMetrics& m) {
  if (m.recipe != "delayed") {
    const std::string head = fmt::format("{} {} {} {}: amax {:.2e}  ", m.module_path.empty() ? "<root>" : m.module_path,
                                         m.role, m.format, m.recipe, m.cur_amax);
    std::string scales;
    if (m.recipe == "current") {
      scales = fmt::format("scale {:.3e}  ", m.current_scale);
    } else {
      scales = fmt::format("blocks {} (zero {}, saturated {}, at min {}, inf/nan {})  ", m.blocks, m.blocks_zero,
                           m.blocks_saturated, m.blocks_at_min, m.blocks_nonfinite);
      if (m.recipe == "nvfp4") scales = fmt::format("tensor scale {:.3e}  ", m.current_scale) + scales;
    }
    return head + scales +
           fmt::format("overflow {:.3f}% ({})  underflow {:.3f}% ({})  mse {:.2e}  cosine {:.6f}  sqnr {:.1f} dB",
                       m.overflow_pct, m.overflow, m.underflow_pct, m.underflow, m.mse, m.cosine, m.sqnr_db);
  }
  return fmt::format(
      "{} {} {}: amax {:.2e}  delayed scale {:.3e}  current scale {:.3e}  drift {:+.2f}  overflow {:.3f}% ({})  "
      "underflow {:.3f}% ({})  mse {:.2e}  cosine {:.6f}  sqnr {:.1f} dB",
      m.module_path.empty() ? "<root>" : m.module_path, m.role, m.format, m.cur_amax, m.delayed_scale,
      m.current_scale, m.drift_log2, m.overflow_pct, m.overflow, m.underflow_pct, m.underflow, m.mse, m.cosine,
      m.sqnr_db);
}

std::string render_fp8_recipe_table(const std::vector<Fp8SlotMetrics>& metrics) {
  std::vector<std::string> recipes, slots;
  auto add_unique = [](std::vector<std::string>& v, const std::string& s) {
    if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  };
  for (const auto& m : metrics) {
    add_unique(recipes, m.recipe);
    add_unique(slots, (m.module_path.empty() ? "<root>" : m.module_path) + " " + m.role);
  }
  size_t width = 4;
  for (const auto& s : slots) width = std::max(width, s.size());
  std::string out = fmt::format("{:<{}}", "slot", width);
  std::string sub = fmt::format("{:<{}}", "", width);
  for (const auto& r : recipes) {
    out += fmt::format(" | {:<26}", r);
    sub += fmt::format(" | {:>8} {:>8} {:>8}", "ovf %", "unf %", "sqnr dB");
  }
  out += "\n" + sub + "\n";
  std::string blocks;
  for (const auto& slot : slots) {
    out += fmt::format("{:<{}}", slot, width);
    for (const auto& r : recipes) {
      const Fp8SlotMetrics* found = nullptr;
      for (const auto& m : metrics) {
        if (m.recipe == r && (m.module_path.empty() ? "<root>" : m.module_path) + " " + m.role == slot) found = &m;
      }
      if (!found) {
        out += fmt::format(" | {:>8} {:>8} {:>8}", "-", "-", "-");
        continue;
      }
      out += fmt::format(" | {:>8.3f} {:>8.3f} {:>8.1f}", found->overflow_pct, found->underflow_pct, found->sqnr_db);
      if (found->blocks > 0) {
        blocks += fmt::format("{:<{}} {:<11} ({}): {} blocks, {} all zero, {} saturated, {} at the smallest scale, {} with inf/nan\n",
                              slot, width, r, found->format, found->blocks, found->blocks_zero, found->blocks_saturated,
                              found->blocks_at_min, found->blocks_nonfinite);
      }
    }
    out += "\n";
  }
  return blocks.empty() ? out : out + "\n" + blocks;
}

std::string render_tolerated_text(const std::vector<ToleratedCount>& tolerated) {
  if (tolerated.empty()) return "";
  std::string out = "Non-finite values tolerated so far inside the modules that made them (the place rule):\n";
  for (const auto& c : tolerated) {
    std::string kinds;
    auto add = [&](int64_t n, const char* kind) {
      if (n > 0) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", n, kind);
    };
    add(c.neg_inf, "-inf");
    add(c.pos_inf, "+inf");
    add(c.nan, "nan");
    const std::string batches = c.first_batch == c.last_batch ? fmt::format("batch {}", c.first_batch)
                                                              : fmt::format("batches {}-{}", c.first_batch, c.last_batch);
    out += fmt::format("  {}{} {}: {} frame{} in {}{}{}\n", c.module_path.empty() ? "(root)" : c.module_path,
                       c.module_class.empty() ? "" : " (" + c.module_class + ")", c.op, c.frames, c.frames == 1 ? "" : "s",
                       batches, kinds.empty() ? "" : ", " + kinds, c.allowed ? " (allowed by allow_nonfinite)" : "");
  }
  return out;
}

std::string render_text(const Report& report) {
  if (report.kind == "fp8_alarm") {
    std::string out = "FP8 alarm during batch_number=" + std::to_string(report.batch_number) + "\n";
    for (const auto& a : report.fp8_alarms) {
      out += kPrefix + " " + render_fp8_metrics_text(a.metrics) + "\n" + kPrefix + " alarm: " + a.reason + "\n";
    }
    return out;
  }
  if (report.kind == "trace") {  // what trace mode printed as the batch ran
    std::string out = batch_header(report.batch_number, report.world_size > 1 ? report.rank : -1);
    for (const auto& f : report.frames) out += render_frame_text(f);
    return out;
  }
  std::string out;
  // Which rank, and what the batch was: " on rank 1 (evaluation)".
  const std::string rank_and_phase =
      (report.world_size > 1 ? " on rank " + std::to_string(report.rank) : std::string()) +
      (report.phase.empty() ? std::string() : " (" + report.phase + ")");
  if (report.kind == "peer_nonfinite") {
    out = "Another rank detected inf/nan; none during batch_number=" + std::to_string(report.batch_number) + rank_and_phase + "\n";
  } else if (report.kind == "ranks_missing") {
    out = "Ranks did not answer during batch_number=" + std::to_string(report.batch_number) + rank_and_phase + "\n";
  } else {
    out = "Detected inf/nan during batch_number=" + std::to_string(report.batch_number) + rank_and_phase + "\n";
  }
  bool any_backward = false;
  for (const auto& f : report.frames) any_backward = any_backward || f.direction == Direction::Backward;
  out += "Last " + std::to_string(report.frames.size()) +
         (any_backward ? " frames (forward and backward):\n" : " forward frames:\n");
  out += "abs min  abs max  metadata\n";
  // The buffer spans batches, as HF's does: mark where each batch starts, in HF's words.
  for (size_t i = 0; i < report.frames.size(); ++i) {
    const Frame& f = report.frames[i];
    if (i > 0 && f.batch_number != report.frames[i - 1].batch_number) out += batch_header(f.batch_number);
    out += render_frame_text(f);
  }
  out += "\n" + report.origin + "\n";
  if (const auto& m = report.origin_frame) {
    const bool shown = std::any_of(report.frames.begin(), report.frames.end(), [&](const Frame& f) {
      return f.batch_number == m->batch_number && f.op_index == m->op_index && f.direction == m->direction;
    });
    if (!shown) out += "The op that made it (before the frames above):\n" + render_frame_text(*m);
  }
  out += render_tolerated_text(report.tolerated);
  out += render_ranks_text(report);
  if (!report.dump_dir.empty()) {
    out += "The op's arguments and results are saved in " + report.dump_dir + " (sentinel replay " + report.dump_dir +
           " re-runs it).\n";
  }
  if (report.deferred) {
    out += "Found when the device's statistics were read back, after the op had run: no call stack.\n"
           "Options::device_sync_each_op(true) stops at the op itself, with its call stack.\n";
  }
  if (!report.python_stack.empty()) {
    out += "Python call stack at detection (innermost first):\n";
    for (const auto& line : report.python_stack) out += "  " + line + "\n";
  }
  if (!report.torchscript_stack.empty()) {
    out += "TorchScript call stack at detection (innermost first):\n";
    for (const auto& line : report.torchscript_stack) out += "  " + line + "\n";
  }
  if (!report.fp8_metrics.empty()) {
    out += "FP8 metrics of step " + std::to_string(report.fp8_metrics.front().step) + ":\n";
    for (const auto& m : report.fp8_metrics) out += "  " + render_fp8_metrics_text(m) + "\n";
  }
  if (!report.stack.empty()) {
    out += "C++ call stack at detection (innermost first):\n";
    for (const auto& line : report.stack) out += "  " + line + "\n";
  }
  return out;
}

const char* to_string(Attribution a) {
  switch (a) {
    case Attribution::ModuleHierarchy: return "module_hierarchy";
    case Attribution::Parameter: return "parameter";
    case Attribution::UserScope: return "user_scope";
    case Attribution::ModelRoot: return "model_root";
  }
  return "?";
}

const char* to_string(RankRole r) {
  switch (r) {
    case RankRole::Alone: return "alone";
    case RankRole::Made: return "made";
    case RankRole::Received: return "received";
    case RankRole::Stopped: return "stopped";
  }
  return "?";
}

const char* to_string(Escape e) {
  switch (e) {
    case Escape::None: return "none";
    case Escape::Read: return "read";
    case Escape::Written: return "written";
    case Escape::Returned: return "returned";
  }
  return "?";
}

std::string render_ranks_text(const Report& report) {
  if (report.world_size <= 1) return "";
  const RankAgreement& a = report.ranks;
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (int64_t r : v) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  };
  auto where = [](const std::string& host, int64_t local_rank) {
    std::string w;
    if (local_rank >= 0) w += "local rank " + std::to_string(local_rank);
    if (!host.empty()) w += (w.empty() ? "on " : " on ") + host;
    return w.empty() ? w : " (" + w + ")";
  };
  std::string out = "Ranks: this is rank " + std::to_string(report.rank) + " of " + std::to_string(report.world_size) +
                    where(a.host, a.local_rank) + ".\n";
  if (!a.exchanged) {
    out += "  The ranks have not exchanged yet: whether another rank saw inf/nan first is not known here.\n";
  }
  if (a.first) {
    const RankEvent& f = *a.first;
    out += "  First to see inf/nan: rank " + std::to_string(f.rank) + where(f.host, f.local_rank) + ", batch " +
           std::to_string(f.batch_number) +
           ", " + to_string(f.direction) + " op " + std::to_string(f.op_index) + ": " + f.frame + " (" +
           (f.role == RankRole::Received ? "received there" : "made there") + ")\n";
    if (f.rank != report.rank) out += "  Its " + f.origin + "\n";
  } else if (a.exchanged) {
    out += "  No rank that answered saw inf/nan.\n";
  }
  switch (a.role) {
    case RankRole::Made: out += "  This rank made the inf/nan (from its own computation or inputs).\n"; break;
    case RankRole::Received: out += "  This rank received the inf/nan from another rank (through a collective).\n"; break;
    case RankRole::Stopped: out += "  This rank saw no inf/nan: it stops because of the other ranks.\n"; break;
    case RankRole::Alone: break;
  }
  if (!a.tripped.empty()) out += "  Ranks that saw inf/nan: " + list(a.tripped) + "\n";
  if (!a.missing.empty()) out += "  Ranks that did not answer: " + list(a.missing) + "\n";
  if (!a.problem.empty()) out += "  " + a.problem + "\n";
  return out;
}

const char* to_string(Direction d) { return d == Direction::Forward ? "forward" : "backward"; }

const char* to_string(EntryRole r) {
  switch (r) {
    case EntryRole::Parameter: return "parameter";
    case EntryRole::Input: return "input";
    case EntryRole::Output: return "output";
    case EntryRole::Gradient: return "gradient";
  }
  return "?";
}

const char* to_string(EntryKind k) {
  switch (k) {
    case EntryKind::Tensor: return "tensor";
    case EntryKind::None: return "none";
    case EntryKind::NotATensor: return "not_a_tensor";
    case EntryKind::Skipped: return "skipped";
  }
  return "?";
}

}  // namespace sentinel

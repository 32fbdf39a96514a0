#pragma once
// Where two traces of the same model part: frames aligned by direction, module path, op and
// occurrence, their entries' statistics compared under a tolerance, the first frame beyond it
// named, and how the difference grows after it.
#include <sentinel/report.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sentinel {
namespace report {

enum class DiffVerdict { Same, Diverged, NotComparable };

// One statistic of one entry that differs most in a matched frame.
struct StatDifference {
  std::string entry;  // the entry's label: "output", "input[0]", "weight"
  std::string stat;   // "abs_max", "abs_min", "nan", "inf", "zeros"
  double a = 0, b = 0;
  double relative = 0;  // |a - b| / max(|a|, |b|) (0 when both are 0; 1 when one is inf or nan)
  double score = 0;     // |a - b| / (atol + rtol * |b|): above 1, beyond the tolerance
};

// A frame of A and the frame of B it was matched with.
struct MatchedFrame {
  int64_t index_a = 0, index_b = 0;  // positions in the traces' frames
  Direction direction = Direction::Forward;
  std::string module_path, module_class, op;
  int64_t occurrence = 0;       // this (direction, module path, op) seen before in the trace
  StatDifference worst;         // the entry statistic with the largest score
  bool diverged = false;        // worst.score > 1
  int64_t entries_compared = 0; // entries present in both frames with statistics
  std::vector<std::string> entries_unmatched;  // labels in one frame only, or skipped in one
};

// A frame of one trace that has no counterpart in the other.
struct UnmatchedFrame {
  int64_t index = 0;
  Direction direction = Direction::Forward;
  std::string module_path, op;
  int64_t occurrence = 0;
};

struct TraceDiff {
  std::string name_a, name_b;  // what the user passed (file paths)
  int64_t batch_a = 0, batch_b = 0;
  double rtol = 0, atol = 0;
  DiffVerdict verdict = DiffVerdict::Same;
  std::string not_comparable;            // why, when verdict is NotComparable
  std::vector<MatchedFrame> matched;     // in the order of A
  std::optional<size_t> first_divergent; // index into `matched`
  std::vector<UnmatchedFrame> only_a, only_b;
};

// "layers.1 (Linear) aten::addmm #2", "grad of layers.1 (Linear) AddmmBackward0 #0".
std::string frame_label(const MatchedFrame& m);

// Aligns `a` and `b` (their frames, oldest first) and compares them. Traces with no frame in
// common, or a report that is not a trace of one batch, are NotComparable.
TraceDiff diff_traces(const Report& a, const Report& b, double rtol, double atol);

// The verdict, the first divergent frame with its worst statistic, the growth of the difference
// over the frames after it, and the unmatched frames.
std::string render_diff_text(const TraceDiff& diff);

}  // namespace report
}  // namespace sentinel

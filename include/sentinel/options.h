#pragma once
// Options of the watchdog, in LibTorch's chained-setter style:
//   sentinel::Options().max_frames_to_save(50).trace_batch_nums({1, 3}).report_dir("out")
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sentinel {

struct Report;

// What happens when the first inf/nan is detected.
enum class Action {
  Throw,     // sentinel::NonFiniteError reaches the caller at the next safe point (default)
  Abort,     // print and write the report, then std::abort()
  Warn,      // print and write the report, keep running
  Callback,  // call the user's callback with the report, keep running
};

// Defines `Options& name(T)` (setter, chains) and `const T& name() const` (getter).
#define SENTINEL_OPTION(T, name, ...)                 \
 public:                                              \
  Options& name(T value) {                            \
    name##_ = std::move(value);                       \
    return *this;                                     \
  }                                                   \
  const T& name() const noexcept { return name##_; }  \
                                                      \
 private:                                             \
  T name##_ = __VA_ARGS__

class Options {
  // How many of the most recent frames a report shows (HF's default: 21). At least 1.
  SENTINEL_OPTION(int64_t, max_frames_to_save, 21);
  // Batches (0-indexed) printed frame by frame as they run; detection is off in them (as in HF).
  SENTINEL_OPTION(std::vector<int64_t>, trace_batch_nums, {});
  // After this batch finishes, sentinel::AbortAfterBatch is thrown.
  SENTINEL_OPTION(std::optional<int64_t>, abort_after_batch_num, std::nullopt);
  SENTINEL_OPTION(Action, action, Action::Throw);
  // Directory for report files (created if missing); empty: no files.
  SENTINEL_OPTION(std::string, report_dir, {});
  // Skip ops whose outputs only alias their inputs (views such as t, view, select): same values.
  SENTINEL_OPTION(bool, skip_view_ops, true);

 public:
  // Sets the callback and Action::Callback.
  Options& callback(std::function<void(const Report&)> fn) {
    callback_ = std::move(fn);
    action_ = Action::Callback;
    return *this;
  }
  const std::function<void(const Report&)>& callback() const noexcept { return callback_; }
  // Where text goes (trace lines, reports). Default: std::cout. The stream must outlive the watchdog.
  Options& output(std::ostream& os) {
    output_ = &os;
    return *this;
  }
  std::ostream& output() const;

  // Throws sentinel::OptionError naming the first invalid option.
  void validate() const;

 private:
  std::function<void(const Report&)> callback_;
  std::ostream* output_ = nullptr;
};

#undef SENTINEL_OPTION

}  // namespace sentinel

#pragma once
// Batch numbering, tracing and abort-after: one small state machine, HF's rules.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace sentinel {
namespace frames {

class BatchState {
 public:
  BatchState(std::vector<int64_t> trace, std::optional<int64_t> abort_after)
      : trace_(std::move(trace)), abort_after_(abort_after) {}

  // Returns true when this batch is traced (its header is printed, detection is off).
  bool begin() {
    open_ = true;
    current_ = next_;
    op_index_ = 0;
    tracing_ = std::find(trace_.begin(), trace_.end(), current_) != trace_.end();
    return tracing_;
  }
  // Returns true when abort_after_batch_num says to stop now that this batch is done.
  bool end() {
    if (!open_) return false;
    open_ = false;
    tracing_ = false;
    next_ = current_ + 1;
    return abort_after_ && current_ >= *abort_after_;
  }
  bool open() const { return open_; }
  bool tracing() const { return tracing_; }
  bool is_traced(int64_t batch) const { return std::find(trace_.begin(), trace_.end(), batch) != trace_.end(); }
  // The open batch, else the last one (a backward after its forward's batch); 0 before any.
  int64_t current() const { return open_ ? current_ : std::max<int64_t>(next_ - 1, 0); }
  int64_t next() const { return next_; }
  // Between batches: the number the next one gets (a resumed run goes on from its step).
  void set_next(int64_t n) {
    if (!open_) next_ = n;
  }
  int64_t take_op_index() { return op_index_++; }

 private:
  std::vector<int64_t> trace_;
  std::optional<int64_t> abort_after_;
  bool open_ = false;
  bool tracing_ = false;
  int64_t current_ = -1;
  int64_t next_ = 0;
  int64_t op_index_ = 0;
};

}  // namespace frames
}  // namespace sentinel

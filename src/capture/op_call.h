#pragma once
// One RecordFunction event as plain values. RecordFunction's layout depends on NDEBUG (LibTorch is
// built with it; a Debug build of this project is not), so exactly one translation unit,
// src/capture/record_hooks.cpp, reads RecordFunction itself; everything else reads this view.
#include <cstdint>

#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>

namespace at {
class RecordFunction;
}
namespace c10 {
struct IValue;
struct FunctionSchema;
}  // namespace c10

namespace sentinel {
namespace capture {

class OpCall {
 public:
  explicit OpCall(const at::RecordFunction& fn, bool at_end);

  const char* name() const { return name_; }
  // The schema's overload ("Tensor" of aten::add.Tensor); "" for none and for events without one.
  const char* overload_name() const;
  // Autograd's sequence number (-1: not recorded for autograd); a backward node has its forward op's.
  int64_t seq_nr() const { return seq_nr_; }
  // The arguments (start callbacks) and the results (end callbacks; empty when the op threw).
  c10::ArrayRef<c10::IValue> inputs() const { return inputs_; }
  c10::ArrayRef<c10::IValue> outputs() const { return outputs_; }
  // Not on the per-op path: a copy of the schema, its strings and types.
  c10::optional<c10::FunctionSchema> schema() const;

 private:
  const at::RecordFunction& fn_;
  const char* name_;
  int64_t seq_nr_;
  c10::ArrayRef<c10::IValue> inputs_;
  c10::ArrayRef<c10::IValue> outputs_;
};

// Turns recording off for ops this library runs itself (at::DisableRecordFunctionGuard, without
// its header).
class NotRecorded {
 public:
  NotRecorded();
  ~NotRecorded();
  NotRecorded(const NotRecorded&) = delete;
  NotRecorded& operator=(const NotRecorded&) = delete;

 private:
  bool touched_ = false;  // false at a thread's exit, once LibTorch's thread state may be gone
  bool was_enabled_ = true;
};

// Whether LibTorch holds any RecordFunction callback now, global or on the calling thread (for
// tests that check a watchdog left nothing behind).
bool callbacks_installed();

}  // namespace capture
}  // namespace sentinel

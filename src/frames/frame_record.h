#pragma once
// Frames as compact values: numbers and ids only, no strings and no tensors. Strings are made
// when a report is rendered.
#include <sentinel/stats.h>

#include <array>
#include <cstdint>

namespace sentinel {
namespace frames {

enum class Role : uint8_t { Param, Input, Output };
// Proven: a parameter proven finite instead of read (Watchdog::proven_finite); its numbers are
// read when a report shows its frame, if it still holds what the frame saw.
enum class EntryState : uint8_t { Read, None, NotATensor, Skipped, Proven };

struct EntryRecord {
  TensorStats stats;
  uint32_t param_name = 0;  // Param: id in the watchdog's string table
  // A tensor inside a module's argument or result that is not a tensor ("output.logits"): its
  // path, an id in the string table (Watchdog::module_boundary).
  uint32_t path = 0;
  int16_t index = -1;       // input[i] / output[i]; -1: the single output ("output")
  int16_t sub_index = -1;   // [j] inside a list argument
  Role role = Role::Input;
  EntryState state = EntryState::Read;
  int8_t dtype = -1;        // c10::ScalarType
  uint8_t skip_reason = 0;  // stats::Readability when Skipped
  bool has_headroom = false;
  // An output that is an argument's new values, written in place and not returned
  // (core::written_unreturned): a write into that argument, whether or not its input entry was kept.
  bool written_argument = false;
  // A number the program passed as a Python scalar (a wrapped number, `max_norm=inf`): an inf or
  // NaN it holds is the program's own constant, not a value that overflowed.
  bool program_constant = false;
  HeadroomCounts headroom;
  int64_t pending_slot = -1;  // read on a device: the result slot its numbers will come back in
  // The tensor's storage (its identity while it lives; 0: none): which module made the values an
  // op reads, and whether an op writes into its own argument (the place rule, core/place_rule.h).
  uintptr_t storage = 0;
  // Proven: the tensor (its TensorImpl, found again among the watchdog's magnitudes) and the proof
  // that covered it.
  const void* proven_tensor = nullptr;
  uint32_t proof = 0;
};

struct FrameRecord {
  static constexpr int kMaxEntries = 16;
  // Inputs stop here so that outputs (what the op made) always have room.
  static constexpr int kMaxInputEntries = 12;

  int64_t batch_number = 0;
  int64_t op_index = 0;
  uint32_t op = 0;      // string table id of the op name as shown
  uint32_t op_key = 0;  // name.overload: the op-info cache key
  uint32_t forward_op = 0;  // backward frames: the forward op this autograd node differentiates
  uint32_t place = 0;  // PlaceTable id: module path + class
  uint32_t module_place = 0;  // the innermost module's place (`place` may add user scopes to it)
  uint8_t attribution = 0;
  uint8_t direction = 0;
  bool in_model = false;  // run by the model's own code (a module's forward), not the training loop's
  // Run by compiled code (an extern kernel of torch.compile's): its arguments may hold what the
  // compiled kernels made, which no op made (core/place_rule.h).
  bool in_compiled_code = false;
  // An argument is an inf or NaN the program passed as a number (`masked_fill(mask, -inf)`,
  // `full(size, inf)`): the op's own non-finite results may be that constant (core/place_rule.h).
  bool nonfinite_constant = false;
  bool is_return = false;  // not an op: what a module's forward returned (its outputs)
  // Not an op: a module's whole forward, seen at its boundary (Options::exact false): what it was
  // handed and what it returned.
  bool whole_module = false;
  // A forward op run again inside the backward (gradient checkpointing recomputes a block).
  bool recomputed = false;
  // The op writes into an argument (in place, out=); otherwise a result in an argument's memory
  // is that argument passed on (dropout in eval mode returns its input).
  bool writes_arguments = false;
  // Some arguments were left unread until the op's result is known (Readability::FactorOfFiniteProduct).
  bool factors_deferred = false;
  // What the op's end decides before this is a frame (Watchdog::Impl::op_end): whether an
  // alias-annotated call copied, or which memory an op of the empty family made.
  enum class Undecided : uint8_t { No, CopyOrView, UninitializedResults };
  Undecided undecided = Undecided::No;
  // Whether the device's stream was capturing a CUDA graph when this frame first read there (-1:
  // not asked yet): asked once per frame, not once per tensor (a runtime call each).
  int8_t device_capturing = -1;
  uint16_t entry_count = 0;
  int64_t entries_omitted = 0;
  uint16_t outputs_seen = 0;  // outputs added so far, kept or omitted (numbers the next one)
  bool inputs_finite = true;
  bool outputs_finite = true;
  // Entries read on a device wait for their numbers (src/device/deferred_frames.h). Entries that
  // found no room share one slot per role, so that their inf/nan still counts.
  bool pending = false;
  int64_t omitted_slot[2] = {-1, -1};  // inputs, outputs
  // Set when the frame went to the ring, detection or the deferred queue: a failure after that
  // must not finish it twice.
  bool finished = false;
  // What went wrong while this frame was read (string table id; 0: nothing): the callback caught
  // it, kept the frame with what it had, and the report says so.
  uint32_t error = 0;
  std::array<EntryRecord, kMaxEntries> entries;

  void reset() {
    op = 0;
    pending = false;
    finished = false;
    error = 0;
    omitted_slot[0] = omitted_slot[1] = -1;
    forward_op = 0;
    in_model = false;
    in_compiled_code = false;
    nonfinite_constant = false;
    is_return = false;
    whole_module = false;
    recomputed = false;
    writes_arguments = false;
    factors_deferred = false;
    undecided = Undecided::No;
    device_capturing = -1;
    outputs_seen = 0;
    entry_count = 0;
    entries_omitted = 0;
    inputs_finite = outputs_finite = true;
  }
  // Keeps the entry if there is room; its finiteness counts either way. A full frame keeps an
  // inf/nan over a finite value of the same side (arguments or results): a _foreach_ op's hundreds
  // of tensors must not hide the one that holds it.
  void add(const EntryRecord& e) {
    const bool finite = e.stats.finite();
    if (!finite) (e.role == Role::Output ? outputs_finite : inputs_finite) = false;
    if (e.role == Role::Output) ++outputs_seen;
    const int limit = e.role == Role::Output ? kMaxEntries : kMaxInputEntries;
    if (entry_count < limit) {
      entries[entry_count++] = e;
      return;
    }
    ++entries_omitted;
    if (finite) return;
    // (An entry waiting for a device's numbers is not known to be finite yet: it stays.)
    for (int i = entry_count; i-- > 0;) {
      if (entries[i].stats.finite() && entries[i].pending_slot < 0 &&
          (entries[i].role == Role::Output) == (e.role == Role::Output)) {
        entries[i] = e;
        return;
      }
    }
  }
  bool finite() const { return inputs_finite && outputs_finite; }
  bool has_room(Role role) const { return entry_count < (role == Role::Output ? kMaxEntries : kMaxInputEntries); }
  // Copies only the entries in use (a full copy would move ~1 KiB per op).
  void assign(const FrameRecord& o) {
    batch_number = o.batch_number;
    op_index = o.op_index;
    op = o.op;
    op_key = o.op_key;
    forward_op = o.forward_op;
    place = o.place;
    module_place = o.module_place;
    attribution = o.attribution;
    direction = o.direction;
    in_model = o.in_model;
    in_compiled_code = o.in_compiled_code;
    nonfinite_constant = o.nonfinite_constant;
    is_return = o.is_return;
    whole_module = o.whole_module;
    recomputed = o.recomputed;
    writes_arguments = o.writes_arguments;
    factors_deferred = o.factors_deferred;
    device_capturing = o.device_capturing;
    outputs_seen = o.outputs_seen;
    entry_count = o.entry_count;
    entries_omitted = o.entries_omitted;
    inputs_finite = o.inputs_finite;
    outputs_finite = o.outputs_finite;
    pending = o.pending;
    finished = o.finished;
    error = o.error;
    omitted_slot[0] = o.omitted_slot[0];
    omitted_slot[1] = o.omitted_slot[1];
    for (int i = 0; i < entry_count; ++i) entries[i] = o.entries[i];
  }
};

}  // namespace frames
}  // namespace sentinel

#pragma once
// When a non-finite value is an error (docs/nonfinite.md). Each op of the model belongs to a place:
// its module. A value an op of module P makes non-finite is tolerated while only ops of P and of
// the modules inside P read it; it is an error once an op of another module reads it, once it is
// written into a tensor P did not make (a parameter, a buffer, P's input), once P returns it
// (Watchdog::Impl::check_returned), and wherever the model's own code did not make it (an op
// outside the model, a backward node). A view's reader sees only the view's elements: the frames'
// statistics are of what each op read. The rule is a function of the frames in op order, each
// entry carrying its tensor's storage: it runs where detection runs, after a device's numbers are
// back, and costs one map update per op result while every value is finite.
#include <sentinel/report.h>

#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/delivery.h"
#include "frames/frame_record.h"
#include "frames/string_table.h"
#include "options/nonfinite_allowance.h"

namespace sentinel::core {

class PlaceRule final : public DetectionPolicy {
 public:
  // `allow`: Options::allow_nonfinite, parsed; the tables name places, ops and parameters.
  PlaceRule(const frames::PlaceTable& places, const frames::StringTable& strings,
            std::vector<options::NonfiniteAllowance> allow);

  Judgement judge(const frames::FrameRecord& f) override;
  void begin_batch() override;
  std::vector<ToleratedCount> tolerated() const override;

  // A module's forward returns these entries (its outputs, with their storages): an error when one
  // holds a value tolerated inside the module. Entries whose storage holds no tolerated value are
  // not looked at: `holds_tolerated` says which are worth reading.
  bool holds_tolerated(uintptr_t storage, uint32_t module_place) const;
  bool holds_any() const { return !tolerated_values_.empty(); }
  Judgement judge_return(const frames::FrameRecord& returned);
  // A module's whole forward (FrameRecord::whole_module): what it returns non-finite is an error
  // there, unless it was handed that very value (a mask passed through) or a pattern allows it;
  // what it was handed is not judged (a mask its caller made for it).
  Judgement judge_whole_module(const frames::FrameRecord& f);

  // A buffer an op of `module` allocated without values (the empty family): the module's, as a
  // result it made, so that it may write into it what it tolerates.
  void made_uninitialized(uintptr_t storage, uint32_t module);

  // Whether `inner`'s module is `outer`'s or one inside it.
  bool within(uint32_t inner, uint32_t outer) const;

 private:
  struct Made {
    uint32_t place = 0;  // the module whose op made the value
    std::shared_ptr<const frames::FrameRecord> by;  // the op that first made it non-finite
    // An allow_nonfinite pattern let `place` return it: it is its caller's value now.
    bool handed_up = false;
    // Made outside the model from the program's own constants (judge_from_constants).
    bool from_constant = false;
  };
  // An op outside the model whose inf/nan inputs are all the program's constants (a Python
  // `float("inf")`) or values made from them, or that was handed a non-finite number to write
  // (`masked_fill(mask, -inf)`): clip_grad_norm_(parameters, inf), as Trainer calls it for its logs,
  // computes inf / norm and clamps it to 1. Its non-finite results are tolerated until they are
  // written into a tensor no op of the batch made (a gradient, a parameter, an optimizer's state),
  // where they are an error, as they are when an op of the model reads them (the model's input);
  // an overflow from finite values outside the model is an error at once.
  bool from_constants(const frames::FrameRecord& f) const;
  Judgement judge_from_constants(const frames::FrameRecord& f);
  // Inside compiled code, an argument's inf or NaN that no op made was made by the compiled kernels
  // (Inductor's run no op), for no module this rule can name. Where the op reading it makes nothing
  // non-finite of it (attention reading the -inf of a mask the kernels built) the value ends there:
  // tolerated and counted under that op. Where it passes it on, it is an error at that op, and the
  // eager replay of the batch names the op that made it.
  bool made_by_compiled_kernels_and_absorbed(const frames::FrameRecord& f, const frames::EntryRecord& e) const;
  // Whether `f` was handed a non-finite tensor in memory `storage`.
  static bool handed_nonfinite(const frames::FrameRecord& f, uintptr_t storage);
  // The path of the module a value belongs to.
  std::string owner_path(const Made& m) const;
  // Whether ops of `reader` may read the value (its owner's or inside it), and whether the value
  // belongs to `module` or a module inside it.
  bool readable_by(const Made& m, uint32_t reader) const;
  bool owned_within(const Made& m, uint32_t module) const;
  std::string label(const frames::EntryRecord& e) const;
  bool allowed(const frames::FrameRecord& f, const frames::EntryRecord& e);
  // A frame whose results hold tolerated values, counted under its module and op.
  void count(const frames::FrameRecord& f);
  // The row of `f`'s module and op, with `f` counted in it (its elements are added by the caller).
  ToleratedCount& counted_row(const frames::FrameRecord& f, bool allowed);

  const frames::PlaceTable& places_;
  const frames::StringTable& strings_;
  std::vector<options::NonfiniteAllowance> allow_;
  // Storage -> the module whose op made the tensor (results only; in-place writes keep it).
  std::unordered_map<uintptr_t, uint32_t> made_in_batch_;
  // Whether any op has been judged as a module's (Python hooks, scopes, TorchScript): only then
  // are the ops outside modules the training loop's (from_constants).
  bool model_ops_scoped_ = false;
  // Storage -> the tolerated non-finite value it holds.
  std::unordered_map<uintptr_t, Made> tolerated_values_;
  mutable std::unordered_map<uint64_t, bool> within_;
  // (place, op, allowed) -> counts, in a stable order for reports.
  std::map<std::tuple<uint32_t, uint32_t, bool>, ToleratedCount> counts_;
};

}  // namespace sentinel::core

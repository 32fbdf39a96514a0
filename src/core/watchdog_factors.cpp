// The factors of a matrix product inside compiled code, read only when its result is not finite.
//
// Inside a torch.compile'd graph the ATen ops the watchdog sees are its extern kernels, mostly
// GEMMs whose factors were made by Inductor's fused kernels (never seen) or are the weights. The
// factors are two thirds of those GEMMs' bytes, yet every element of a factor reaches an element
// of a non-empty result (core::factors_of_product): a finite result proves the factors
// finite, and a non-finite one has them read at the op's end, before its frame is judged. The
// first frame to see an inf/nan, and what it shows, are the same; earlier frames say "not read:
// its product is finite" where they would have shown the factors' numbers.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "core/entry_builder.h"
#include "core/gemm_ops.h"
#include "core/watchdog_impl.h"
#include "stats/tensor_stats.h"

namespace sentinel {

using frames::EntryRecord;
using frames::EntryState;
using frames::FrameRecord;
using frames::Role;

namespace {

// addmm and baddbmm scale their bias by beta and their product by alpha (arguments 3 and 4):
// only 1 keeps every factor's inf/nan in the result (beta 0 drops the bias altogether).
bool unit_scaling(c10::ArrayRef<c10::IValue> inputs) {
  for (size_t i : {size_t{3}, size_t{4}}) {
    if (i >= inputs.size() || inputs[i].isNone()) continue;
    if (!inputs[i].isScalar()) return false;
    const c10::Scalar s = inputs[i].toScalar();
    if (s.isComplex() || s.toDouble() != 1.0) return false;  // (toDouble throws for a complex)
  }
  return true;
}

}  // namespace

uint32_t Watchdog::Impl::factors_to_defer(const FrameRecord& f, c10::ArrayRef<c10::IValue> inputs,
                                          uint32_t gemm_operands) {
  // Wanted anyway: FP8's probes and the collections (gemm_operands), the headroom counts, a trace.
  if (!inside_compiled_code || gemm_operands != 0 || opts.headroom() || batches.is_traced(f.batch_number)) return 0;
  const uint8_t factors = core::factors_of_product(strings.at(f.op));
  const bool with_bias = factors == 0b111;  // addmm, baddbmm: (bias, a, b), scaled by beta and alpha
  if (factors == 0 || (with_bias && !unit_scaling(inputs))) return 0;
  uint32_t deferred = 0;
  for (size_t i = 0; i < inputs.size() && i < 8; ++i) {
    if (!((factors >> i) & 1)) continue;
    // On a device a result's numbers come later than the op's end: its factors are read as always.
    if (!inputs[i].isTensor() || !inputs[i].toTensor().defined() || !inputs[i].toTensor().device().is_cpu()) return 0;
    deferred |= 1u << i;
  }
  return deferred;
}

void Watchdog::Impl::defer_factor(FrameRecord& f, const at::Tensor& t, int position, const core::ParamRef* param) {
  EntryRecord e = core::make_entry(param ? Role::Param : Role::Input, position, -1);
  core::set_readability(e, t, stats::Readability::FactorOfFiniteProduct);
  e.storage = core::storage_key(t);
  if (param) e.param_name = parameter_label(*param, f.module_place);
  else e.path = storage_name(t);
  f.add(e);
  f.factors_deferred = true;
}

void Watchdog::Impl::settle_factors(FrameRecord& f, const std::vector<c10::IValue>& inputs) {
  f.factors_deferred = false;
  bool any_result = false, results_read = true;
  for (int k = 0; k < f.entry_count; ++k) {
    const EntryRecord& e = f.entries[k];
    if (e.role != Role::Output) continue;
    any_result = true;
    results_read = results_read && e.state == EntryState::Read && e.stats.count > 0;
  }
  if (any_result && results_read && f.outputs_finite) return;
  // Not proven finite (an inf/nan in the result, an empty result, an op that threw): read them.
  for (int k = 0; k < f.entry_count; ++k) {
    EntryRecord& e = f.entries[k];
    if (e.state != EntryState::Skipped ||
        e.skip_reason != static_cast<uint8_t>(stats::Readability::FactorOfFiniteProduct)) {
      continue;
    }
    if (e.index < 0 || static_cast<size_t>(e.index) >= inputs.size() || !inputs[e.index].isTensor()) continue;
    EntryRecord read = read_entry(f, inputs[e.index].toTensor(), e.role, e.index, -1, false);
    read.param_name = e.param_name;
    read.path = e.path;
    e = read;
    if (!e.stats.finite()) f.inputs_finite = false;
  }
}

}  // namespace sentinel

// Arguments an op writes in place without returning them: the optimizers' fused and foreach ops
// (`_fused_adamw_(Tensor(a!)[] self, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, ...) -> ()`,
// `_foreach_addcmul_(...) -> ()`), AMP's unscaling. Their results are those arguments' new
// values, and nothing else shows them: without reading them again at the op's end, an inf that
// Adam's fused step writes into `exp_avg_sq` would be seen only by the next op to read it (a
// foreach step's next op, the next step's optimizer), or never (tests/python/test_optimizer_step.py).
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/entry_builder.h"
#include "core/watchdog_impl.h"
#include "core/written_arguments.h"

namespace sentinel {

using frames::EntryRecord;
using frames::FrameRecord;
using frames::Role;

namespace core {

uint64_t written_unreturned(const c10::FunctionSchema& schema) {
  uint64_t bits = 0;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    const c10::AliasInfo* written = args[i].alias_info();
    if (written == nullptr || !written->isWrite()) continue;
    // A list's annotation (`Tensor(a!)[]`) names no set of its own: never matched by a result.
    bool returned = false;
    for (const auto& r : schema.returns()) {
      const c10::AliasInfo* result = r.alias_info();
      if (result == nullptr) continue;
      for (const auto& set : written->beforeSets()) returned = returned || result->beforeSets().count(set) > 0;
    }
    if (!returned) bits |= uint64_t{1} << i;
  }
  return bits;
}

void gradients_written_when_unscaled(const char* op_name, const c10::FunctionSchema& schema,
                                     uint64_t* written_when_unscaled, int* grad_scale) {
  if (std::strncmp(op_name, "aten::_fused_", 13) != 0) return;
  int grads = -1, scale = -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    if (args[i].name() == "grads") grads = static_cast<int>(i);
    if (args[i].name() == "grad_scale") scale = static_cast<int>(i);
  }
  if (grads < 0 || scale < 0) return;
  *written_when_unscaled = uint64_t{1} << grads;
  *grad_scale = scale;
}

void running_statistics_written(const c10::FunctionSchema& schema, uint64_t* written_when_flag, int* flag) {
  uint64_t bits = 0;
  int flag_at = -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    const std::string& name = args[i].name();
    const c10::AliasInfo* alias = args[i].alias_info();
    if ((name == "running_mean" || name == "running_var") && !(alias && alias->isWrite())) bits |= uint64_t{1} << i;
    if (name == "training" || name == "use_input_stats") flag_at = static_cast<int>(i);
  }
  if (bits == 0) return;
  *written_when_flag = bits;
  *flag = flag_at;
}

}  // namespace core

uint32_t Watchdog::Impl::written_label(const at::Tensor& t, const core::ParamRef* param, const FrameRecord& f,
                                       const OpInfo& info, size_t position, int sub) {
  if (const uint32_t named = storage_name(t)) return named;  // an optimizer's state: "0.weight.exp_avg_sq"
  if (param) return parameter_label(*param, f.place);
  const std::string& argument = strings.at(info.argument_names.at(position));
  return strings.intern(sub >= 0 ? fmt::format("{}[{}]", argument, sub) : argument);
}

namespace {

// Calls f(tensor, argument's position, index in its list or -1) for each tensor of the written
// arguments, in order.
template <typename F>
void for_each_written(c10::ArrayRef<c10::IValue> inputs, uint64_t written, F&& f) {
  for (size_t i = 0; i < inputs.size() && i < 64; ++i) {
    if (((written >> i) & 1) == 0) continue;
    if (inputs[i].isTensor()) {
      f(inputs[i].toTensor(), i, -1);
    } else if (inputs[i].isTensorList()) {
      const auto list = inputs[i].toTensorList();
      for (size_t j = 0; j < list.size(); ++j) f(list.get(j), i, static_cast<int>(j));
    }
  }
}

uint32_t counted_version(const at::Tensor& t) { return frames::keyed_memory(t) ? frames::version_of(t) : 0; }

// The arguments this call of the op writes: a fused optimizer's gradients only when it unscales
// them (core::gradients_written_when_unscaled), batch norm's running statistics only when it
// trains (core::running_statistics_written).
uint64_t written_by_call(c10::ArrayRef<c10::IValue> inputs, const OpInfo& info) {
  uint64_t written = info.written_unreturned;
  if (info.grad_scale_arg >= 0 && static_cast<size_t>(info.grad_scale_arg) < inputs.size() &&
      inputs[static_cast<size_t>(info.grad_scale_arg)].isNone()) {
    written &= ~info.written_when_unscaled;
  }
  if (info.running_statistics_flag >= 0 && static_cast<size_t>(info.running_statistics_flag) < inputs.size()) {
    const c10::IValue& updating = inputs[static_cast<size_t>(info.running_statistics_flag)];
    if (updating.isBool() && !updating.toBool()) written &= ~info.running_statistics;
  }
  return written;
}

}  // namespace

void Watchdog::Impl::note_written_versions(c10::ArrayRef<c10::IValue> inputs, const OpInfo& info,
                                           std::vector<uint32_t>& versions) {
  versions.clear();
  for_each_written(inputs, written_by_call(inputs, info),
                   [&](const at::Tensor& t, size_t, int) { versions.push_back(counted_version(t)); });
}

void Watchdog::Impl::add_written_arguments(FrameRecord& f, const std::vector<c10::IValue>& inputs, const OpInfo& info,
                                           const std::vector<uint32_t>& versions_at_start, bool& any_tensor) {
  struct Written {
    size_t position;
    int sub;
  };
  std::vector<at::Tensor> tensors;
  std::vector<Written> where;
  for_each_written(inputs, written_by_call(inputs, info), [&](const at::Tensor& t, size_t position, int sub) {
    tensors.push_back(t);
    where.push_back({position, sub});
  });
  // The fused optimizers and batch norm's running statistics write without counting a version
  // (torch.optim's `fused=True`, an unannotated schema): the reads kept from before the op, of
  // these tensors and of any view of them, would be taken for their new values. The reads of
  // their storages are forgotten then.
  bool uncounted = false;
  for (size_t k = 0; k < tensors.size() && k < versions_at_start.size() && !uncounted; ++k) {
    uncounted = frames::keyed_memory(tensors[k]) && versions_at_start[k] == counted_version(tensors[k]);
  }
  if (uncounted) forget_reads_of(tensors);
  // Nothing read before the op is reused now: a counted write changed the version, an uncounted
  // one had the reads of its memory forgotten. In the training loop's window, what clipping's
  // multiply leaves of gradients read finite is proven so instead of read again.
  const double factor = loop_ops_watched && !uncounted ? shrinking_factor(f, inputs) : std::nan("");
  const auto held = std::isnan(factor) ? read_ahead(tensors) : core::HeldLaunches(nullptr, {});
  for (size_t k = 0; k < tensors.size(); ++k) {
    const at::Tensor& t = tensors[k];
    if (!t.defined()) continue;
    any_tensor = true;
    const core::ParamRef* param = index->find_param(t);
    EntryRecord e = core::make_entry(Role::Output, static_cast<int>(where[k].position), where[k].sub);
    const bool proven = !std::isnan(factor) && k < versions_at_start.size() &&
                        proven_scaled(t, versions_at_start[k], factor, e);
    if (!proven) e = read_entry(f, t, Role::Output, static_cast<int>(where[k].position), where[k].sub, opts.headroom());
    e.path = written_label(t, param, f, info, where[k].position, where[k].sub);
    e.written_argument = true;
    f.add(e);
  }
}

namespace {

// The value of a one-element CPU tensor of a floating dtype; NaN for anything else.
double single_value(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.numel() != 1 || !t.has_storage() || t.is_sparse()) return std::nan("");
  switch (t.scalar_type()) {
    case c10::kFloat: return *t.const_data_ptr<float>();
    case c10::kDouble: return *t.const_data_ptr<double>();
    case c10::kBFloat16: return static_cast<float>(*t.const_data_ptr<c10::BFloat16>());
    case c10::kHalf: return static_cast<float>(*t.const_data_ptr<c10::Half>());
    default: return std::nan("");
  }
}

}  // namespace

double Watchdog::Impl::shrinking_factor(const FrameRecord& f, const std::vector<c10::IValue>& inputs) const {
  const std::string& op = strings.at(f.op_key);
  if ((op != "aten::_foreach_mul_.Tensor" && op != "aten::_foreach_mul_.Scalar") || inputs.size() != 2) {
    return std::nan("");
  }
  const c10::IValue& other = inputs[1];
  double factor = std::nan("");
  if (other.isTensor()) {
    factor = single_value(other.toTensor());
  } else if (other.isDouble() || other.isInt()) {
    factor = other.isDouble() ? other.toDouble() : static_cast<double>(other.toInt());
  }
  return std::isfinite(factor) && std::abs(factor) <= 1.0 ? std::abs(factor) : std::nan("");
}

bool Watchdog::Impl::proven_scaled(const at::Tensor& t, uint32_t version_before, double factor, EntryRecord& e) {
  TensorStats before;
  stats::Readability readability;
  if (!reads_reusable() ||
      !readers.cpu.cache().find_at(t, version_before, before, readability) ||
      readability != stats::Readability::Read || !before.finite()) {
    return false;
  }
  // |round(x c)| is at most |x| for |c| <= 1, and at most |x| |c| by one rounding of any floating
  // dtype down to bfloat16's (2^-8 relative).
  prove_finite({t}, std::min(before.abs_max, before.abs_max * factor * (1 + 1.0 / 128)));
  return proven_entry(t, e);
}

}  // namespace sentinel

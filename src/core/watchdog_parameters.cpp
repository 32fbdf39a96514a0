// Which of the model's parameters an op reads, and the name its entry gives each.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "core/watchdog_impl.h"

namespace sentinel {

const core::ParamRef* Watchdog::Impl::find_params(c10::ArrayRef<c10::IValue> inputs, capture::ThreadState& ts,
                                                  c10::SmallVectorImpl<const core::ParamRef*>& params) {
  params.assign(inputs.size(), nullptr);
  const core::ParamRef* owner = nullptr;
  size_t owner_arg = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].isTensor() && inputs[i].toTensor().defined()) params[i] = index->find_param(inputs[i].toTensor());
    if (!owner && params[i]) {
      owner = params[i];
      owner_arg = i;
    }
  }
  if (owner && owner->shared) {
    // Tied weights: the op belongs to the innermost running module that holds the parameter.
    for (size_t s = ts.scopes.size(); s-- > 0;) {
      const auto place = ts.scopes[s].module ? index->module_place(ts.scopes[s].module) : std::nullopt;
      const core::ParamRef* held = place ? index->holder_at(inputs[owner_arg].toTensor(), *place) : nullptr;
      if (held) {
        owner = params[owner_arg] = held;
        break;
      }
    }
  }
  return owner;
}

uint32_t Watchdog::Impl::parameter_label(const core::ParamRef& p, uint32_t place) {
  if (p.place == place) return p.name;
  // By the name a report's reader finds it under: its path from the running module when inside
  // it, else its whole path.
  const std::string& holder = places.path(p.place);
  const std::string& running = places.path(place);
  const bool inside = !running.empty() && holder.size() > running.size() &&
                      holder.compare(0, running.size(), running) == 0 && holder[running.size()] == '.';
  const std::string module = inside ? holder.substr(running.size() + 1) : holder;
  return module.empty() ? p.name : strings.intern(module + "." + strings.at(p.name));
}

}  // namespace sentinel

#pragma once
// Ops the compiler runs while it traces a model (torch.compile's fake tensors, its proxy and
// functional tracing) compute nothing: they make no frame, and the ops they run are nested in
// them. A user's own dispatch mode (a FLOP counter) runs real ops: those are watched.
#include <c10/core/impl/TorchDispatchModeTLS.h>

namespace sentinel {
namespace capture {

// Asked at every op: inline, and cheap when no mode is set.
inline bool compiler_tracing() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (!TorchDispatchModeTLS::any_modes_set(/*skip_infra_modes=*/false)) return false;  // the usual case, cheaply
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL).has_value();
}

}  // namespace capture
}  // namespace sentinel

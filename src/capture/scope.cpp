#include <sentinel/scope.h>

#include "capture/thread_state.h"

namespace sentinel {

ScopeGuard::ScopeGuard(std::string name) {
  auto& ts = capture::thread_state();
  ts.scopes.push_back(capture::ScopeEntry{std::move(name), nullptr});
  ++ts.scopes_version;
}

ScopeGuard::ScopeGuard(const torch::nn::Module& module) {
  auto& ts = capture::thread_state();
  ts.scopes.push_back(capture::ScopeEntry{{}, &module});
  ++ts.scopes_version;
}

ScopeGuard::~ScopeGuard() {
  auto& ts = capture::thread_state();
  if (!ts.scopes.empty()) ts.scopes.pop_back();
  ++ts.scopes_version;
}

}  // namespace sentinel

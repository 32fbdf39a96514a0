#include <sentinel/scope.h>
#include <sentinel/scope_stack.h>

#include "capture/thread_state.h"

namespace sentinel {

ScopeGuard::ScopeGuard(std::string name) {
  auto& ts = capture::thread_state();
  ts.scopes.push_back(capture::ScopeEntry{std::move(name), nullptr});
  ++ts.scopes_version;
}

ScopeGuard::ScopeGuard(const torch::nn::Module& module) { enter_scope(module); }

void enter_scope(const torch::nn::Module& module) {
  auto& ts = capture::thread_state();
  ts.scopes.push_back(capture::ScopeEntry{{}, &module});
  ++ts.scopes_version;
}

bool leave_scope(const torch::nn::Module& module) {
  auto& ts = capture::thread_state();
  for (size_t k = ts.scopes.size(); k-- > 0;) {
    if (ts.scopes[k].module == &module) {
      ts.scopes.resize(k);
      ++ts.scopes_version;
      return true;
    }
  }
  return false;
}

ScopeGuard::~ScopeGuard() {
  auto& ts = capture::thread_state();
  if (!ts.scopes.empty()) ts.scopes.pop_back();
  ++ts.scopes_version;
}

}  // namespace sentinel

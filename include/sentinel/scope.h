#pragma once
// Names the ops of a region for frames that no parameter identifies (C++ frontend):
//   torch::Tensor forward(torch::Tensor x) {
//     auto s = sentinel::scope(*this);   // this module's path, as named_modules() says it
//     auto h = fc1(x) * 2;               // the mul is attributed to this module
//     { auto g = sentinel::scope("gate"); h = torch::gelu(h); }  // "<path>.gate"
//   }
// Costs a push and a pop on a thread-local stack; no effect when no watchdog runs.
// RECORD_USER_SCOPE("name") regions are honoured the same way.
#include <string>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace sentinel {

class [[nodiscard]] ScopeGuard {
 public:
  explicit ScopeGuard(std::string name);
  explicit ScopeGuard(const torch::nn::Module& module);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ScopeGuard(ScopeGuard&&) = delete;
};

inline ScopeGuard scope(std::string name) { return ScopeGuard(std::move(name)); }
inline ScopeGuard scope(const torch::nn::Module& module) { return ScopeGuard(module); }

}  // namespace sentinel

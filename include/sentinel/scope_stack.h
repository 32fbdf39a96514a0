#pragma once
// The stack sentinel::scope pushes on, for front ends whose module calls begin and end in two
// separate callbacks (a Python module's forward pre-hook and forward hook), on the thread that
// runs the module. An op that uses no parameter belongs to the innermost module entered.
namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace sentinel {

void enter_scope(const torch::nn::Module& module);
// Pops down to and including the module's innermost entry: entries above it are of modules an
// exception left before their end. Returns false, the stack as it was, when the module has none.
bool leave_scope(const torch::nn::Module& module);

}  // namespace sentinel

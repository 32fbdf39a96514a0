#pragma once
// Arguments an op writes in place without returning them (src/core/written_arguments.cpp).
#include <cstdint>

namespace c10 {
struct FunctionSchema;
}

namespace sentinel::core {

// Bit i: argument i is annotated as written (`Tensor(a!)`, `Tensor(a!)[]`) and no result aliases
// it, so the op's results do not show its new values.
uint64_t written_unreturned(const c10::FunctionSchema& schema);

}  // namespace sentinel::core

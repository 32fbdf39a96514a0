#pragma once
// Ops whose results are uninitialized memory, filled by a later op (an autograd formula's
// `new_empty_strided(...).zero_()`, a user's `torch::empty` then `copy_`): whatever bits they hold
// mean nothing, and reading them would report garbage as inf/nan.
#include "capture/op_name_list.h"

namespace sentinel {
namespace core {

inline bool returns_uninitialized(const char* op_name) {
  static const char* const kOps[] = {"aten::empty",         "aten::empty_like",         "aten::empty_strided",
                                     "aten::new_empty",     "aten::new_empty_strided",  "aten::_empty_affine_quantized",
                                     "aten::empty_quantized", "aten::_empty_per_channel_affine_quantized"};
  return capture::is_aten_op_in(op_name, kOps);
}

// In-place ops that replace every element of `self` without reading it: `self` going in is a
// destination, not an input (often an uninitialized buffer).
inline bool overwrites_self(const char* op_name) {
  static const char* const kOps[] = {"aten::copy_",        "aten::fill_",      "aten::zero_",   "aten::normal_",
                                     "aten::uniform_",     "aten::random_",    "aten::bernoulli_", "aten::exponential_",
                                     "aten::geometric_",   "aten::log_normal_", "aten::cauchy_"};
  return capture::is_aten_op_in(op_name, kOps);
}

}  // namespace core
}  // namespace sentinel

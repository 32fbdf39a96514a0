#pragma once
// Ops whose results are uninitialized memory, filled by a later op (an autograd formula's
// `new_empty_strided(...).zero_()`, a user's `torch::empty` then `copy_`): whatever bits they hold
// mean nothing, and reading them would report garbage as inf/nan.
#include <cstring>

#include "capture/op_name_list.h"

namespace sentinel {
namespace core {

inline bool returns_uninitialized(const char* op_name) {
  static const char* const kOps[] = {"aten::empty",         "aten::empty_like",         "aten::empty_strided",
                                     "aten::new_empty",     "aten::new_empty_strided",  "aten::_empty_affine_quantized",
                                     "aten::empty_quantized", "aten::_empty_per_channel_affine_quantized"};
  return capture::is_aten_op_in(op_name, kOps);
}

// Collectives (c10d::allreduce_, c10d::broadcast_, ...; LibTorch 2.x dispatches them as ops) return
// at once and write their tensors on the process group's thread or stream until wait(): at the
// op's end those tensors do not hold the result yet, and their writes bump no version counter, so
// an earlier read of them would be taken as still valid: the op that uses the result after wait()
// would be blamed for what the collective brought. No frame, and the reads kept so far are
// dropped: the tensors are read again at their next use.
inline bool writes_asynchronously(const char* op_name) { return std::strncmp(op_name, "c10d::", 6) == 0; }

// In-place ops that replace every element of `self` without reading it: `self` going in is a
// destination, not an input (often an uninitialized buffer).
inline bool overwrites_self(const char* op_name) {
  static const char* const kOps[] = {"aten::copy_",        "aten::fill_",      "aten::zero_",   "aten::normal_",
                                     "aten::uniform_",     "aten::random_",    "aten::bernoulli_", "aten::exponential_",
                                     "aten::geometric_",   "aten::log_normal_", "aten::cauchy_"};
  return capture::is_aten_op_in(op_name, kOps);
}

// Ops whose results alias an argument (`Tensor(a)`) and always share its memory: a view repeats
// its argument's values, so it makes no frame. Other alias-annotated ops (aten::to, reshape,
// flatten, contiguous, _autocast_to_reduced_precision, an extension's) return new memory when
// they must (a dtype change, a non-contiguous input): decided per call, from the storages the call
// returned (Watchdog::Impl::settle_copy_or_view).
inline bool always_a_view(const char* op_name) {
  static const char* const kOps[] = {
      "aten::view",         "aten::view_as",       "aten::_reshape_alias", "aten::t",           "aten::transpose",
      "aten::permute",      "aten::expand",        "aten::expand_as",      "aten::select",      "aten::slice",
      "aten::narrow",       "aten::unsqueeze",     "aten::squeeze",        "aten::as_strided",  "aten::diagonal",
      "aten::linalg_diagonal", "aten::unbind",     "aten::split",          "aten::split_with_sizes", "aten::chunk",
      "aten::tensor_split", "aten::hsplit",        "aten::vsplit",         "aten::dsplit",      "aten::unfold",
      "aten::unflatten",    "aten::movedim",       "aten::moveaxis",       "aten::swapaxes",    "aten::swapdims",
      "aten::mT",           "aten::mH",            "aten::adjoint",        "aten::matrix_H",    "aten::numpy_T",
      "aten::real",         "aten::imag",          "aten::view_as_real",   "aten::view_as_complex", "aten::conj",
      "aten::_conj",        "aten::_neg_view",     "aten::alias",          "aten::detach",      "aten::broadcast_to",
      "aten::positive",     "aten::align_to",      "aten::refine_names",   "aten::rename",      "aten::lift_fresh",
      "aten::_indices",     "aten::_values",       "aten::indices",        "aten::values",      "aten::crow_indices",
      "aten::col_indices",  "aten::ccol_indices",  "aten::row_indices",    "aten::_fw_primal",  "aten::_make_dual"};
  return capture::is_aten_op_in(op_name, kOps);
}

}  // namespace core
}  // namespace sentinel

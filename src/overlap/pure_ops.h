#pragma once
// Ops whose kernels write nothing but their results, so that their tensor arguments cannot
// change while they run. The schema alone cannot say so: LibTorch 1.13's batch_norm updates its
// running statistics in place without marking them written. Only this list's ops (and then only
// overloads whose schema writes no argument) have their inputs read beside them.
#include "capture/op_name_list.h"

namespace sentinel {
namespace overlap {

inline bool writes_only_results(const char* op_name) {
  static const char* const kOps[] = {
      "aten::linear",   "aten::addmm",      "aten::mm",          "aten::bmm",         "aten::matmul",
      "aten::baddbmm",  "aten::addmv",      "aten::mv",          "aten::conv1d",      "aten::conv2d",
      "aten::conv3d",   "aten::convolution", "aten::_convolution", "aten::layer_norm", "aten::softmax",
      "aten::_softmax", "aten::log_softmax", "aten::gelu",        "aten::silu",        "aten::relu",
      "aten::tanh",     "aten::sigmoid",    "aten::add",         "aten::sub",         "aten::mul",
      "aten::div",      "aten::embedding",  "aten::cat",         "aten::stack",       "aten::clone",
      "aten::contiguous", "aten::mean",     "aten::sum"};
  return capture::is_aten_op_in(op_name, kOps);
}

}  // namespace overlap
}  // namespace sentinel

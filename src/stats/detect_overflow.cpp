// detect_overflow: the statistics read, and nothing else (no ATen op runs, so a watchdog watching
// the calling thread records nothing of it).
#include <sentinel/detect.h>
#include <sentinel/stats.h>

#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>

#include <iostream>

#include "stats/tensor_stats.h"

namespace sentinel {

bool detect_overflow(const at::Tensor& tensor, const std::string& ctx) {
  return detect_overflow(tensor, ctx, std::cout);
}

bool detect_overflow(const at::Tensor& tensor, const std::string& ctx, std::ostream& out) {
  c10::InferenceMode no_autograd;
  TensorStats s;
  if (stats::compute(tensor, s) != stats::Readability::Read) return false;
  if (s.nan > 0) out << ctx << " has nans\n";
  if (s.pos_inf + s.neg_inf > 0) out << ctx << " has infs\n";
  return !s.finite();
}

}  // namespace sentinel

#pragma once
// HF's detect_overflow(var, ctx) helper: prints "<ctx> has nans" and/or "<ctx> has infs" and
// returns whether it found either. One fused read of the tensor, no temporaries.
#include <iosfwd>
#include <string>

namespace at {
class Tensor;
}

namespace sentinel {

bool detect_overflow(const at::Tensor& tensor, const std::string& ctx);
bool detect_overflow(const at::Tensor& tensor, const std::string& ctx, std::ostream& out);

}  // namespace sentinel

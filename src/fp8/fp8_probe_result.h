#pragma once
// What the FP8 probe found in one tensor: counts and the sums behind MSE, cosine and SQNR.
// Plain C++ (no LibTorch), shared by the CPU pass and the CUDA kernels' host side.
#include <cstdint>

namespace sentinel {
namespace stats {

struct Fp8ProbeResult {
  int64_t count = 0;      // finite elements probed (non-finite ones are counted by TensorStats)
  int64_t overflow = 0;   // |x * scale| rounds above the format's max (saturated by the cast)
  int64_t underflow = 0;  // non-zero elements whose cast is zero
  double sum_sq_error = 0;   // sum (x - q/scale)^2
  double sum_x_q = 0;        // sum x * q/scale
  double sum_x_sq = 0;       // sum x^2
  double sum_q_sq = 0;       // sum (q/scale)^2

  // Adds sums taken in the scaled domain (a = |x| * scale, q its cast): sum (a - q)^2, sum a q
  // and sum q^2. The sum of squares follows from sum a^2 = sum (a - q)^2 + sum q (2a - q),
  // whose every term is >= 0 (q <= 2a): nothing cancels.
  void add_scaled_sums(double sq_error, double a_q, double q_sq, float scale);
  // Adds another tensor's result (several tensors of one slot, one step).
  void add(const Fp8ProbeResult& o) {
    count += o.count;
    overflow += o.overflow;
    underflow += o.underflow;
    sum_sq_error += o.sum_sq_error;
    sum_x_q += o.sum_x_q;
    sum_x_sq += o.sum_x_sq;
    sum_q_sq += o.sum_q_sq;
  }

  double mse() const { return count ? sum_sq_error / count : 0.0; }
  double cosine() const;      // 1 when both are zero
  double sqnr_db() const;     // +inf when the cast is exact
};

}  // namespace stats
}  // namespace sentinel

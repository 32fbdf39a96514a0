// The FP8 vocabulary the options speak: formats, roles, the delayed-scaling recipe's settings and
// the recipes replayed beside it, with the names they are written with. No cast arithmetic: that
// is <sentinel/fp8.h> (casts), <sentinel/fp8_scaling.h> (the delayed-scaling simulator) and
// <sentinel/block_scaling.h> (the block-scaled recipes' scales); docs/fp8.md.
#ifndef SENTINEL_FP8_TYPES_H_
#define SENTINEL_FP8_TYPES_H_

#include <cstdint>

// Marks what compiles for the host and for a CUDA device.
#ifndef SENTINEL_HOST_DEVICE
#if defined(__CUDACC__)
#define SENTINEL_HOST_DEVICE __host__ __device__
#else
#define SENTINEL_HOST_DEVICE
#endif
#endif

namespace sentinel {
namespace fp8 {

// The two OCP FP8 formats (<sentinel/fp8.h>).
enum class Format : uint8_t { E4M3, E5M2 };

SENTINEL_HOST_DEVICE constexpr const char* format_name(Format f) {
  return f == Format::E4M3 ? "E4M3" : "E5M2";
}

// Which FP8 format each tensor role is cast to. HYBRID (TransformerEngine's
// default) uses E4M3's precision for forward tensors and E5M2's range for
// gradients.
enum class FormatPolicy : uint8_t { E4M3, E5M2, HYBRID };

// How the history is reduced to the amax that sets the scale.
enum class AmaxAlgo : uint8_t { Max, MostRecent };

// Role of a GEMM input tensor.
enum class Role : uint8_t { Activation, Weight, Gradient };

SENTINEL_HOST_DEVICE constexpr const char* role_name(Role role) {
  return role == Role::Activation ? "activation" : role == Role::Weight ? "weight" : "gradient";
}

// Delayed-scaling recipe options with LibTorch-style chained setters:
//   Recipe().format(FormatPolicy::E4M3).amax_history_len(16).margin(1)
class Recipe {
 public:
  Recipe& format(FormatPolicy v) { format_ = v; return *this; }
  FormatPolicy format() const { return format_; }

  // Number of steps the Max algorithm looks back over; must be >= 1.
  Recipe& amax_history_len(int v) { amax_history_len_ = v; return *this; }
  int amax_history_len() const { return amax_history_len_; }

  Recipe& amax_compute_algo(AmaxAlgo v) { amax_compute_algo_ = v; return *this; }
  AmaxAlgo amax_compute_algo() const { return amax_compute_algo_; }

  // Headroom in powers of two: the scale maps amax to fp8_max / 2^margin.
  Recipe& margin(int v) { margin_ = v; return *this; }
  int margin() const { return margin_; }

 private:
  FormatPolicy format_ = FormatPolicy::HYBRID;
  int amax_history_len_ = 1024;
  AmaxAlgo amax_compute_algo_ = AmaxAlgo::Max;
  int margin_ = 0;
};

// The recipes replayed per GEMM operand (<sentinel/block_scaling.h>, docs/fp8.md "Recipes").
enum class ScalingRecipe : uint8_t { Delayed, Current, MXFP8, NVFP4, Float8Block };

SENTINEL_HOST_DEVICE constexpr const char* recipe_name(ScalingRecipe r) {
  return r == ScalingRecipe::Delayed ? "delayed"
         : r == ScalingRecipe::Current ? "current"
         : r == ScalingRecipe::MXFP8   ? "mxfp8"
         : r == ScalingRecipe::NVFP4   ? "nvfp4"
                                       : "float8block";
}

// How an MXFP8 block's E8M0 exponent is chosen from its amax.
//   RoundUp  (TransformerEngine, the default): 2^ceil(log2(amax / fp8_max)), so no element
//            overflows: X = e8m0(amax * (1 / fp8_max)) rounded toward +inf, saturating.
//   OcpFloor (OCP MX v1.0): 2^(floor(log2(amax)) - emax_elem), emax_elem = 8 (E4M3) or 15
//            (E5M2), clamped below at 2^-127; elements above fp8_max saturate.
enum class MxScaleRule : uint8_t { RoundUp, OcpFloor };

SENTINEL_HOST_DEVICE constexpr const char* mx_scale_rule_name(MxScaleRule r) {
  return r == MxScaleRule::RoundUp ? "round_up" : "ocp_floor";
}

}  // namespace fp8
}  // namespace sentinel

#endif  // SENTINEL_FP8_TYPES_H_

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

// ATen's fused optimizers (`_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`, `_fused_adagrad_`)
// annotate their `grads` as written, but their kernels store into them only to unscale them, when
// the call's `grad_scale` is given (CPU and CUDA alike): without it the gradients keep the values
// read at the op's start. For such an op, the bit of `grads` in `*written_when_unscaled` and
// the position of `grad_scale` in `*grad_scale`; otherwise they are left as they are.
void gradients_written_when_unscaled(const char* op_name, const c10::FunctionSchema& schema,
                                     uint64_t* written_when_unscaled, int* grad_scale);

// Batch norm's and instance norm's running statistics (`running_mean`, `running_var`), which
// their kernels update in place when training, though most of their schemas do not mark them
// written (`aten::batch_norm`, `native_batch_norm`, `instance_norm`, `cudnn_batch_norm`): their
// bits in `*written_when_flag`, and the position of the flag that says whether this call updates
// them (`training`, `use_input_stats`; -1 when the op always does) in `*flag`. Arguments the
// schema marks written are left to written_unreturned.
void running_statistics_written(const c10::FunctionSchema& schema, uint64_t* written_when_flag, int* flag);

}  // namespace sentinel::core

"""The reference run in float64 all through. Models cast to float32 on purpose (Llama's RMSNorm
and rotary embedding compute in float32 whatever their input's dtype): a float64 copy of such a
model still rounds to float32 there, forward and backward, and an oracle that rounds as the
baseline does hides errors smaller than float32's. Inside this mode every cast to a floating
dtype, and every tensor made with one, is float64."""

import torch
from torch.overrides import TorchFunctionMode

_LOWER = {torch.float32, torch.float16, torch.bfloat16}
_NARROWING = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


def _wide(value):
    return torch.float64 if isinstance(value, torch.dtype) and value in _LOWER else value


class Float64Everywhere(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _NARROWING:
            return args[0].double()
        if "dtype" in kwargs:
            kwargs["dtype"] = _wide(kwargs["dtype"])
        if func in (torch.Tensor.to, torch.Tensor.type):
            args = tuple(_wide(a) for a in args)
        return func(*args, **kwargs)

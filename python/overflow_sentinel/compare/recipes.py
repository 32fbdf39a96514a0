"""Block-scaled FP8 casts (OCP Microscaling, MXFP8) for the baseline of a candidate that runs its
linear layers on MXFP8 operands: the reference is run through the same casts, so the candidate is
judged against what the recipe costs the reference's own code.

The casts follow the OCP MX specification v1.0: blocks of 32 consecutive elements along the last
dimension share one E8M0 scale 2^(floor(log2(amax)) - emax), emax being the element format's
largest exponent (8 for E4M3, 15 for E5M2, 2 for E2M1); each element is x / scale rounded to
nearest even in the element format, saturated at its largest finite value. torch's own float8
dtypes do the FP8 element rounding; E2M1's is written out below.
"""

import math
import types

import torch

ELEMENT = {
    "mxfp8": (torch.float8_e4m3fn, 8, 448.0, "e4m3"),
    "mxfp8_e4m3": (torch.float8_e4m3fn, 8, 448.0, "e4m3"),
    "mxfp8_e5m2": (torch.float8_e5m2, 15, 57344.0, "e5m2"),
    "mxfp4": (None, 2, 6.0, "fp4"),        # E2M1 elements, rounded by _round_e2m1
}
BLOCK = 32


def recipe_format(recipe):
    """The tolerance format of a recipe name."""
    if recipe not in ELEMENT:
        raise ValueError(f"overflow_sentinel: compare knows the recipes {', '.join(sorted(ELEMENT))}, "
                         f"not {recipe!r}")
    return ELEMENT[recipe][3]


def mx_cast(x, recipe="mxfp8"):
    """x with each block of 32 along its last dimension cast to the recipe's FP8 element under its
    E8M0 scale, and back to x's dtype (a quantize-dequantize)."""
    element, emax, largest, _ = ELEMENT[recipe]
    shape, dtype = x.shape, x.dtype
    last = shape[-1] if x.dim() else 1
    padded = math.ceil(last / BLOCK) * BLOCK
    flat = x.detach().float().reshape(-1, last) if x.dim() else x.detach().float().reshape(1, 1)
    if padded != last:
        flat = torch.nn.functional.pad(flat, (0, padded - last))
    blocks = flat.reshape(-1, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    # A block of zeros keeps scale 1; E8M0 spans 2^-127 .. 2^127.
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0 ** -127))) - emax,
                           torch.zeros_like(amax)).clamp(-127, 127)
    scale = torch.exp2(exponent)
    scaled = (blocks / scale).clamp(-largest, largest)
    cast = (scaled.to(element).float() if element is not None else _round_e2m1(scaled)) * scale
    out = cast.reshape(-1, padded)[:, :last].reshape(shape).to(dtype)
    # The cast's rounding is not differentiable: the gradient passes straight through, as the
    # recipes' backward GEMMs see it.
    return x + (out - x).detach() if x.requires_grad else out


def _round_e2m1(x):
    """x (within +-6) rounded to nearest even on E2M1's values 0, 0.5, 1, 1.5, 2, 3, 4, 6: the grid's
    step is 0.5 below 2, 1 below 4 and 2 up to 6, and torch.round rounds halves to even, which is
    the even significand at each step."""
    magnitude = x.abs()
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    return torch.sign(x) * torch.round(magnitude / step) * step


def _mx_linear_forward(recipe):
    def forward(self, x):
        return torch.nn.functional.linear(mx_cast(x, recipe), mx_cast(self.weight, recipe), self.bias)
    return forward


def apply_recipe(model, recipe="mxfp8"):
    """Every nn.Linear of `model` runs on the recipe's casts of its input and weight (in place;
    returns the model)."""
    recipe_format(recipe)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(_mx_linear_forward(recipe), module)
    return model
